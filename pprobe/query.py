"""Where SQL is run: DuckDB over every shard of a run, as the views ``ops`` and ``tensors``.

Shards are Arrow IPC streams; a shard whose writer was killed is read up to its last complete
batch (the truncated tail raises, and is ignored). DuckDB's extension auto-install and
auto-load are off: a query never reaches the network.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import duckdb
import pyarrow as pa

from . import schema
from .run import resolve_run_dir


class QueryError(Exception):
    """Bad SQL: DuckDB's message, then the views and their columns."""


def read_shard(path: str) -> tuple[list[pa.RecordBatch], bool]:
    """Complete batches of one stream file, and whether its tail was truncated."""
    batches: list[pa.RecordBatch] = []
    try:
        with pa.OSFile(path, "rb") as f:
            reader = pa.ipc.open_stream(f)
            for b in reader:
                batches.append(b)
    except (OSError, pa.ArrowInvalid, pa.ArrowException):
        return batches, True
    return batches, False


def load_tables(run_dir: str) -> dict[str, pa.Table]:
    out = {}
    for name, sch in schema.TABLES.items():
        batches = []
        for path in sorted(glob.glob(os.path.join(run_dir, "log", f"{name}-*.arrows"))):
            got, _truncated = read_shard(path)
            for b in got:
                if b.schema.remove_metadata() != sch:
                    b = _conform(b, sch)
                batches.append(pa.RecordBatch.from_arrays(b.columns, schema=sch))
        out[name] = pa.Table.from_batches(batches, schema=sch)
    return out


def _conform(b: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    """A shard of another schema version: keep known columns, fill missing ones with nulls."""
    cols = []
    for f in sch:
        i = b.schema.get_field_index(f.name)
        cols.append(b.column(i).cast(f.type) if i >= 0 else pa.nulls(b.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=sch)


def connect(
    run: str | None = None, extra_tables: dict[str, Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the run's views registered (latest run by default)."""
    run_dir = resolve_run_dir(run)
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    for name, table in load_tables(run_dir).items():
        con.register(name, table)
    for name, table in (extra_tables or {}).items():
        con.register(name, table)
    return con


def describe_views(con: duckdb.DuckDBPyConnection) -> str:
    lines = ["Views and their columns:"]
    for name in sorted(schema.TABLES):
        cols = con.execute(f"DESCRIBE {name}").fetchall()
        lines.append(f"  {name}(" + ", ".join(f"{c[0]} {c[1]}" for c in cols) + ")")
    return "\n".join(lines)


def run_sql(sql: str, run: str | None = None) -> tuple[list[str], list[tuple]]:
    """Run one query; returns (column names, rows). Raises :class:`QueryError` on bad SQL."""
    con = connect(run)
    try:
        cur = con.execute(sql)
    except duckdb.Error as e:
        raise QueryError(f"{e}\n\n{describe_views(con)}") from None
    if cur.description is None:
        return [], []
    return [d[0] for d in cur.description], cur.fetchall()
