"""``pprobe export``: a run's views (``ops``, ``tensors``) written as plain files.

Parquet: one hive-partitioned dataset per view, ``DIR/ops/rank=0/step=12/part-0.parquet``,
``tensors`` carrying its call's rank and step, read as is by DuckDB
(``read_parquet('DIR/ops/**/*.parquet', hive_partitioning=true)``), pandas
(``pd.read_parquet('DIR/ops')``), pyarrow and Spark. A run with no ranks (not distributed) is
partitioned by step alone: a partition key that is NULL everywhere has no type to infer, and
pyarrow refuses it. A NULL rank among ranks is written as ``__HIVE_DEFAULT_PARTITION__``, the
name Hive, Spark and pyarrow read as NULL. Batches stream from DuckDB to the writer: the run
is never held in memory whole.

CSV: ``DIR/ops.csv`` and ``DIR/tensors.csv`` with a header line; a shape is written as
``[3, 4]``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

#: The most partitions (rank x step pairs) one view is cut into.
MAX_PARTITIONS = 100_000

_SELECT = {
    "ops": "SELECT * FROM ops",
    "tensors": "SELECT t.*, o.rank, o.step FROM tensors t LEFT JOIN ops o "
    "ON t.pid = o.pid AND t.seq = o.seq",
}


def export(run: str | None, dest: str, fmt: str = "parquet") -> dict[str, Any]:
    """Write the run's views under ``dest`` (created, or an empty folder). Returns what was
    written: per view, its rows, partition columns and files. Raises FileExistsError for a
    folder that is not empty, ValueError for an unknown format."""
    from .query import connect
    from .run import resolve_run_dir

    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format {fmt!r} is not one of parquet, csv")
    run_dir = resolve_run_dir(run)
    dest = os.path.abspath(dest)
    if os.path.lexists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise FileExistsError(f"{dest} exists and is not an empty folder")
    os.makedirs(dest, exist_ok=True)
    con = connect(run_dir)
    out: dict[str, Any] = {"run_dir": run_dir, "dir": dest, "format": fmt, "views": {}}
    try:
        ranked = con.execute("SELECT count(rank) FROM ops").fetchall()[0]
        parts = (["rank"] if ranked and ranked[0] else []) + ["step"]
        for view, sql in _SELECT.items():
            n = con.execute(f"SELECT count(*) FROM ({sql})").fetchall()[0]
            rows = int(n[0]) if n else 0
            if fmt == "csv":
                path = os.path.join(dest, f"{view}.csv")
                con.execute(f"COPY ({sql}) TO '{_q(path)}' (FORMAT csv, HEADER true)")
                out["views"][view] = {"rows": rows, "files": [path], "partitioning": []}
                continue
            out["views"][view] = _write_parquet(con, sql, os.path.join(dest, view), parts, rows)
    finally:
        con.close()
    return out


def _q(path: str) -> str:
    return path.replace("'", "''")


def _write_parquet(con: Any, sql: str, base: str, parts: list[str], rows: int) -> dict[str, Any]:
    import pyarrow.dataset as ds

    reader = _arrow(con.sql(sql), ("to_arrow_reader", "fetch_arrow_reader"))(64 * 1024)
    files: list[str] = []
    ds.write_dataset(
        reader,
        base,
        format="parquet",
        partitioning=parts,
        partitioning_flavor="hive",
        basename_template="part-{i}.parquet",
        existing_data_behavior="error",
        max_partitions=MAX_PARTITIONS,
        file_visitor=lambda f: files.append(f.path),
    )
    if not files:  # no rows: an empty file still carries the columns
        import pyarrow.parquet as pq

        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, "part-0.parquet")
        pq.write_table(_arrow(con.sql(sql), ("to_arrow_table", "arrow"))(), path)
        files.append(path)
    return {"rows": rows, "files": sorted(files), "partitioning": parts}


def _arrow(rel: Any, names: tuple[str, ...]) -> Any:
    """The first of ``names`` the DuckDB relation has (DuckDB 2 renamed its Arrow methods)."""
    for n in names:
        fn = getattr(rel, n, None)
        if fn is not None:
            return fn
    raise AttributeError(f"this DuckDB has none of {', '.join(names)}")


def main(args: argparse.Namespace) -> int:
    from .see_cli import UsageError

    try:
        res = export(args.run, args.dir, args.format)
    except FileExistsError as e:
        raise UsageError(str(e)) from None
    for view, v in res["views"].items():
        by = f", partitioned by {', '.join(v['partitioning'])}" if v["partitioning"] else ""
        print(f"{view}: {v['rows']} rows in {len(v['files'])} files{by}")
    print(f"written to {res['dir']}")
    return 0
