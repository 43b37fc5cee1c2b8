"""SQL on the running program, from inside it: ``pprobe.sql("SELECT ...")``.

Before the query, the ``@table`` / ``@metric`` functions are sampled (on demand), and the
rows recorded so far are written: the op rows the record buffer holds (the log writer's
flush) and the user tables' pending rows. The query then sees every row recorded so far,
through the same views as ``pprobe query`` (``ops``, ``tensors``, schema ``python``,
``settings``, ``information_schema.df_settings``). Without a run (the probe is off), the
user tables live in memory and ``ops`` / ``tensors`` are empty.
"""

from __future__ import annotations

import os
from typing import Any

from .. import state
from . import sqlviews, tables


class Result:
    """A query's result: the Arrow table (``.arrow``; its attributes, such as ``num_rows``
    and ``to_pylist()``, are this object's), and ``.df()`` for a pandas DataFrame."""

    def __init__(self, table: Any) -> None:
        self.arrow = table

    def df(self) -> Any:
        return self.arrow.to_pandas()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arrow, name)

    def __len__(self) -> int:
        return int(self.arrow.num_rows)

    def __eq__(self, other: object) -> bool:
        return bool(self.arrow.equals(other.arrow if isinstance(other, Result) else other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.arrow)

    def _repr_html_(self) -> str:
        """Jupyter: the first 50 rows as an HTML table."""
        from ..textout import Doc

        t = self.arrow
        n = int(t.num_rows)
        doc = Doc()
        rows = [list(r.values()) for r in t.slice(0, 50).to_pylist()]
        doc.table(f"{n:,} rows" + (" (first 50)" if n > 50 else ""), list(t.column_names), rows)
        return doc.html()


def run_locked(query: str, active: Any = None) -> tuple[list[str], list[tuple]]:
    """For the live endpoint: ``query`` as :func:`sql` runs it, on a connection that can read
    no file outside the run folder and its cache, and write none (DuckDB's
    ``enable_external_access = false``, ``allowed_directories``, locked configuration)."""
    res = _run(query, lock=True, active=active)
    return list(res.arrow.column_names), [tuple(r.values()) for r in res.arrow.to_pylist()]


def sql(query: str) -> Result:
    """Run ``query`` over this program's run as it is now; raises pprobe.query.QueryError."""
    return _run(query, lock=False)


def _run(query: str, lock: bool, active: Any = None) -> Result:
    """``active``: a set the connection is in while it runs (the endpoint interrupts them
    when the program stops)."""
    import duckdb

    from .. import query as q

    tables.sample("live")
    session = tables._session()
    with state.internal():
        if session is not None:
            session.writer.flush()
        tables.flush()
        query = sqlviews.rewrite(query)
        run_dir = session.run.dir if session is not None else None
        if run_dir is not None:
            con = q._open(run_dir, q.named_tables(query), "cache", query)
        else:
            con = duckdb.connect(config=q._CONFIG)
            for name, sch in _empty_views().items():
                con.register(name, sch)
            sqlviews.register(con, None, tables.snapshot_memory(), query, live=True)
        try:
            if run_dir is not None:  # this process's settings, set since the run started
                sqlviews.register_settings(con, None, live=True)
            if active is not None:
                active.add(con)
            if lock:
                dirs = [run_dir] + (q.cache_dirs(run_dir) if run_dir is not None else [])
                listed = ", ".join(q._quote(os.path.join(d, "")) for d in dirs if d)
                # a core left to the program: the query competes with it for none but the rest
                con.execute(f"SET threads = {max(1, state.cores() - 1)}")
                con.execute(f"SET allowed_directories = [{listed}]")
                con.execute("SET enable_external_access = false")
                con.execute("SET lock_configuration = true")
            try:
                rel = con.sql(query)
                if rel is None:  # a statement without rows
                    import pyarrow as pa

                    return Result(pa.table({}))
                fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table
                return Result(fetch())
            except duckdb.Error as e:
                raise q.QueryError(f"{e}\n\n{q.describe_views(con)}") from None
        finally:
            if active is not None:
                active.discard(con)
            con.close()


def _empty_views() -> dict[str, Any]:
    from .. import schema

    return {name: sch.empty_table() for name, sch in schema.TABLES.items()}
