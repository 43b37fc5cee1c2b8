"""Schema ``python`` in DuckDB: the user tables' shards of a run, unified by column name.

Every ``log/python/{table}-{host}-{pid}-{k}.arrows`` (streamed rows) and
``log/python/{table}-{host}-{pid}.static.arrows`` (a ``register_table`` snapshot) is read
into memory up to its last complete batch (a live or killed writer's tail is skipped, as for
``ops``), the shards of one table are unified by column name (:func:`pprobe.ext.tables.
unify_types`) and the table becomes the view ``python.<table>``. User tables are small next to
``ops``: they are not put in the Parquet cache.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

#: Columns of pprobe's own tables, so that they answer (empty) in every run.
BASE_COLUMNS = {
    "metrics": (("name", "string"), ("value", "float64")),
    "errors": (
        ("source", "string"),
        ("event", "string"),
        ("error", "string"),
        ("message", "string"),
        ("failures", "int64"),
    ),
}
_FILE = re.compile(r"^(?P<table>[A-Za-z_][A-Za-z0-9_]*)-.+?(?P<static>\.static)?\.arrows$")


def shard_files(run_dir: str) -> dict[str, list[str]]:
    """table -> its shard files in the run folder."""
    out: dict[str, list[str]] = {}
    for p in sorted(glob.glob(os.path.join(glob.escape(run_dir), "log", "python", "*.arrows"))):
        m = _FILE.match(os.path.basename(p))
        if m:
            out.setdefault(m.group("table"), []).append(p)
    return out


def base_schema(name: str) -> Any:
    import pyarrow as pa

    from .tables import STD_COLUMNS

    std = {"run_id": pa.string(), "pid": pa.int64(), "rank": pa.int64(), "step": pa.int64(),
           "ts_ns": pa.int64()}  # fmt: skip
    fields = [pa.field(c, std[c]) for c in STD_COLUMNS]
    fields += [pa.field(c, pa.type_for_alias(t)) for c, t in BASE_COLUMNS.get(name, ())]
    return pa.schema(fields)


def python_tables(run_dir: str | None, memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """table -> one Arrow table of every shard of the run (and ``memory``'s rows)."""
    import pyarrow as pa

    from ..query import read_shard
    from .tables import conform, unify_schemas

    parts: dict[str, list[Any]] = {}
    for name, files in (shard_files(run_dir) if run_dir else {}).items():
        if name.startswith("_"):
            continue  # pprobe's own snapshots (_settings)
        for path in files:
            batches, _early = read_shard(path)
            if batches:
                parts.setdefault(name, []).append(pa.Table.from_batches(batches))
    for name, tbl in (memory or {}).items():
        parts.setdefault(name, []).append(tbl)
    for name in BASE_COLUMNS:
        parts.setdefault(name, []).append(base_schema(name).empty_table())
    out = {}
    for name, tbls in parts.items():
        sch = unify_schemas([t.schema for t in tbls])
        out[name] = pa.concat_tables([conform(t, sch) for t in tbls])
    return out


_DF_SETTINGS = re.compile(r"\binformation_schema\s*\.\s*df_settings\b", re.IGNORECASE)


def rewrite(sql: str) -> str:
    """``information_schema.df_settings`` -> ``pprobe_info.df_settings``: DuckDB's
    information_schema is a system schema where no view can be created."""
    return _DF_SETTINGS.sub("pprobe_info.df_settings", sql)


SETTINGS_COLUMNS = ("name", "value", "default", "type", "source", "description", "env")


def settings_rows(run_dir: str | None, live: bool) -> list[dict[str, Any]]:
    """pprobe's own settings then the registered ones: of this process (``live``), else of
    the run (meta.json's ``config``; the ``_settings`` snapshots of its processes)."""
    from . import settings

    if live:
        return settings.rows()
    import json

    rows: list[dict[str, Any]] = []
    try:
        with open(os.path.join(run_dir or "", "meta.json"), "rb") as f:
            meta = json.loads(f.read())
        rows = settings.own_rows(meta.get("config") or {}, meta.get("config_sources") or {})
    except (OSError, ValueError):
        pass
    from ..query import read_shard

    reg: dict[str, dict[str, Any]] = {}
    for path in shard_files(run_dir).get("_settings", []) if run_dir else []:
        batches, _early = read_shard(path)
        for b in batches:
            for r in b.to_pylist():
                reg[r["name"]] = {c: r.get(c) for c in SETTINGS_COLUMNS}
    return rows + [reg[k] for k in sorted(reg)]


def register_settings(con: Any, run_dir: str | None, live: bool = False) -> None:
    """The views ``settings`` and ``pprobe_info.df_settings`` (see :func:`rewrite`)."""
    import numpy as np
    import pyarrow as pa

    from ..writer import _texts

    rows = settings_rows(run_dir, live)
    tbl = pa.table({c: _texts(pa, np, [r.get(c) for r in rows]) for c in SETTINGS_COLUMNS})
    con.register("_pprobe_settings", tbl)
    con.execute("CREATE SCHEMA IF NOT EXISTS pprobe_info")
    con.execute("CREATE OR REPLACE VIEW settings AS SELECT * FROM _pprobe_settings")
    con.execute("CREATE OR REPLACE VIEW pprobe_info.df_settings AS SELECT * FROM _pprobe_settings")


def register(
    con: Any,
    run_dir: str | None,
    memory: dict[str, Any] | None = None,
    sql: str | None = None,
    live: bool = False,
) -> list[str]:
    """Create schema ``python`` with a view per table; returns the tables' names. The
    settings views are made when ``sql`` names them (or ``sql`` is None)."""
    if sql is None or re.search(r"\bsettings\b|\bdf_settings\b", sql, re.IGNORECASE):
        register_settings(con, run_dir, live)
    con.execute("CREATE SCHEMA IF NOT EXISTS python")
    if not memory and not (run_dir and any(not t.startswith("_") for t in shard_files(run_dir))):
        # No user table: pprobe's own, empty, without importing pyarrow.
        sql_types = {"string": "VARCHAR", "float64": "DOUBLE", "int64": "BIGINT"}
        std = "NULL::VARCHAR AS run_id, NULL::BIGINT AS pid, NULL::BIGINT AS rank, " \
              "NULL::BIGINT AS step, NULL::BIGINT AS ts_ns"  # fmt: skip
        for name, cols in BASE_COLUMNS.items():
            more = "".join(f", NULL::{sql_types[t]} AS {c}" for c, t in cols)
            con.execute(f'CREATE OR REPLACE VIEW python."{name}" AS SELECT {std}{more} LIMIT 0')
        return sorted(BASE_COLUMNS)
    tables = python_tables(run_dir, memory)
    for name, tbl in sorted(tables.items()):
        hidden = f"_pprobe_python_{name}"
        con.register(hidden, tbl)
        con.execute(f'CREATE OR REPLACE VIEW python."{name}" AS SELECT * FROM "{hidden}"')
    return sorted(tables)
