"""``pprobe report``: one self-contained HTML page about a run (docs/report.md).

Data flows one way: :func:`collect` asks DuckDB (the run's ``ops`` and ``tensors`` views,
pprobe/query.py) for aggregates only, each bounded in size whatever the run's size (top-N
tables, at most :data:`MAX_BINS` step columns, :data:`MAX_ROWS` heatmap rows); then
:func:`render` (pprobe/report_html.py) turns that dict into HTML with hand-written SVG. The
page needs no network: styles and its few lines of script are inlined.

Imported only by the command line, never into a probed program.
"""

from __future__ import annotations

import json
import linecache
import math
import os
import time
from typing import TYPE_CHECKING, Any

from . import runs
from .run import resolve_run_dir

if TYPE_CHECKING:  # duckdb is imported when a report is made, not when the CLI starts
    import duckdb

#: Rows of the "by op" and "by module" tables.
TOP = 40
#: Most step columns of the timeline and the heatmap: more steps are binned.
MAX_BINS = 120
#: Most rows of the heatmap (modules, or ops when the run has no torch modules).
MAX_ROWS = 40
#: Rows of the compare table.
COMPARE_ROWS = 100
#: Relative difference of a statistic above which a compare row is "high" (msprobe's
#: statistics mode warns above 0.5: docs/report.md) and "medium".
HIGH, MEDIUM = 0.5, 1e-3


class ReportError(Exception):
    """A run or compare folder that cannot be reported on (one line for the CLI)."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, *params: Any) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description or ()]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _one(con: duckdb.DuckDBPyConnection, sql: str, *params: Any) -> dict[str, Any]:
    got = _rows(con, sql, *params)
    return got[0] if got else {}


# ------------------------------------------------------------------ collect
def collect(run: str | None, compare: str | None = None) -> dict[str, Any]:
    """Everything the page draws, as plain JSON-able data (aggregated in SQL)."""
    from .query import connect

    t0 = time.perf_counter()
    run_dir = resolve_run_dir(run)
    meta = runs.read_meta(run_dir)
    con = connect(run_dir)
    try:
        # outputs holding NaN/inf, read once: few in a healthy run
        con.execute(
            """CREATE TEMP TABLE _bad AS SELECT pid, seq, idx, nan_count, inf_count, shape,
                      dtype, dump_path FROM tensors
               WHERE role = 'output' AND (nan_count > 0 OR inf_count > 0)"""
        )
        data: dict[str, Any] = {"run_dir": run_dir, "overview": _overview(con, run_dir, meta)}
        data["by_op"] = _by(con, "op")
        data["by_module"] = _by(con, "coalesce(module_path, '')")
        steps = data["overview"]
        data["timeline"] = _timeline(con, steps["step_min"], steps["step_max"])
        data["heatmap"] = _heatmap(con, steps["step_min"], steps["step_max"])
        data["alerts"] = _alerts(con)
        data["dumps"] = _dumps(con, meta)
        if compare is not None:
            data["compare"] = _compare(con, compare)
    finally:
        con.close()
    data["collect_s"] = round(time.perf_counter() - t0, 3)
    return data


def _overview(con: duckdb.DuckDBPyConnection, run_dir: str, meta: dict[str, Any]) -> dict[str, Any]:
    o = _one(
        con,
        """SELECT count(*) AS op_rows, count(DISTINCT pid) AS processes,
                  count(DISTINCT rank) AS ranks, count(DISTINCT op) AS distinct_ops,
                  min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_ns,
                  coalesce(sum(dur_ns), 0) AS op_ns,
                  min(coalesce(step, 0)) AS step_min, max(coalesce(step, 0)) AS step_max,
                  count(DISTINCT coalesce(step, 0)) AS steps,
                  count(*) FILTER (WHERE status <> 'ok') AS raised,
                  string_agg(DISTINCT framework, ', ' ORDER BY framework) AS frameworks,
                  count(*) FILTER (WHERE module_path IS NOT NULL) AS module_rows
           FROM ops""",
    )
    o["tensor_rows"] = _one(con, "SELECT count(*) AS n FROM tensors")["n"]
    st = runs.status(run_dir)
    cfg: dict[str, Any] = meta["config"] if isinstance(meta.get("config"), dict) else {}
    start, end = meta.get("start"), meta.get("end")
    o.update(
        run_id=meta.get("run_id") or os.path.basename(run_dir),
        argv=meta.get("orig_argv") or meta.get("argv") or [],
        host=meta.get("host"),
        start=start,
        duration_s=(end - start) if isinstance(start, (int, float)) and end else None,
        state=st.state,
        state_reason=st.reason,
        exit=meta.get("exit") or {},
        mode=cfg.get("mode"),
        versions=meta.get("versions") or {},
        core=(meta.get("core") or {}).get("engine"),
        coverage=(meta.get("coverage") or {}).get("coverage"),
        errors=[
            {"message": str(e.get("message", e)), "count": e.get("count", 1)}
            if isinstance(e, dict)
            else {"message": str(e), "count": 1}
            for e in meta.get("errors") or []
        ][:20],
        rows_dropped=meta.get("rows_dropped") or 0,
        skipped_children=len(meta.get("skipped") or []),
        filters={
            k: cfg.get(k)
            for k in ("include", "exclude", "every", "first", "steps", "dtypes")
            if cfg.get(k) not in (None, [], 0, 1, "")
        },
    )
    if o["step_min"] is None:
        o["step_min"] = o["step_max"] = 0
    return o


def _by(con: duckdb.DuckDBPyConnection, key: str) -> dict[str, Any]:
    """Calls and time per key: the TOP by time, and the totals of the rest."""
    rows = _rows(
        con,
        f"""SELECT {key} AS name, count(*) AS calls, sum(dur_ns) AS total_ns,
                   any_value(framework) AS framework
            FROM ops GROUP BY ALL ORDER BY total_ns DESC, calls DESC, name LIMIT {TOP}""",
    )
    tot = _one(con, f"SELECT count(DISTINCT {key}) AS keys FROM ops")
    return {"rows": rows, "keys": tot["keys"]}


def _bin_width(smin: int, smax: int) -> int:
    return max(1, math.ceil((smax - smin + 1) / MAX_BINS))


def _timeline(con: duckdb.DuckDBPyConnection, smin: int, smax: int) -> dict[str, Any]:
    """Per step (or per bin of steps): ops, op time, wall span, outputs with NaN/inf."""
    w = _bin_width(smin, smax)
    b = f"(coalesce(step, 0) - {smin}) // {w}"
    rows = _rows(
        con,
        f"""WITH b AS (SELECT DISTINCT pid, seq FROM _bad),
            bad AS (SELECT {b} AS bin, count(*) AS bad_calls
                    FROM ops JOIN b USING (pid, seq) GROUP BY bin),
            t AS (SELECT {b} AS bin, min(coalesce(step, 0)) AS step_lo,
                         max(coalesce(step, 0)) AS step_hi, count(*) AS calls,
                         sum(dur_ns) AS op_ns, max(ts_ns + dur_ns) - min(ts_ns) AS wall_ns
                  FROM ops GROUP BY bin)
            SELECT t.*, coalesce(bad.bad_calls, 0) AS bad_calls
            FROM t LEFT JOIN bad USING (bin) ORDER BY bin""",
    )
    return {"width": w, "step_min": smin, "step_max": smax, "bins": rows}


def _heatmap(con: duckdb.DuckDBPyConnection, smin: int, smax: int) -> dict[str, Any]:
    """max |x| and std of outputs per (module or op) x step bin, NaN/inf counted: one join of
    ``ops`` with the output rows of ``tensors``, aggregated to (name, bin) before anything is
    chosen (the choice of rows reads the small aggregate, not the join again)."""
    has_modules = _one(con, "SELECT count(*) AS n FROM ops WHERE module_path IS NOT NULL")["n"]
    key = "o.module_path" if has_modules else "o.op"
    where = "o.module_path IS NOT NULL" if has_modules else "true"
    w = _bin_width(smin, smax)
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _hm AS
            SELECT {key} AS name, (coalesce(o.step, 0) - {smin}) // {w} AS bin,
                   max(greatest(abs(t.min), abs(t.max))) AS absmax, max(t.std) AS std,
                   coalesce(sum(t.nan_count), 0) AS nan, coalesce(sum(t.inf_count), 0) AS inf,
                   count(*) AS outputs, min(o.ts_ns) AS first
            FROM ops o JOIN (SELECT pid, seq, min, max, std, nan_count, inf_count FROM tensors
                             WHERE role = 'output' AND nan_count IS NOT NULL) t
                 ON t.pid = o.pid AND t.seq = o.seq
            WHERE {where} GROUP BY ALL"""
    )
    top = _rows(
        con,
        f"""SELECT name, min(first) AS first FROM _hm GROUP BY name
            ORDER BY (sum(nan + inf) > 0) DESC, sum(outputs) DESC, name LIMIT {MAX_ROWS}""",
    )
    keys = _one(con, "SELECT count(DISTINCT name) AS n FROM _hm")["n"]
    names = [r["name"] for r in sorted(top, key=lambda r: (r["first"], r["name"]))]
    index = {n: i for i, n in enumerate(names)}
    rows = _rows(
        con,
        """SELECT name, bin, absmax, std, nan, inf FROM _hm
           WHERE name IN (SELECT unnest(?::VARCHAR[])) ORDER BY name, bin""",
        names,
    )
    return {
        "by": "module" if has_modules else "op",
        "names": names,  # in order of first call
        "keys": keys,
        "bins": (smax - smin) // w + 1,
        "width": w,
        "step_min": smin,
        "cells": [
            [index[r["name"]], r["bin"], r["absmax"], r["std"], r["nan"], r["inf"]] for r in rows
        ],
    }


def _source(caller: str | None) -> dict[str, Any] | None:
    """The caller's source line and two lines around it, where the file is readable."""
    if not caller or ":" not in caller:
        return None
    path, _, line = caller.rpartition(":")
    try:
        n = int(line)
    except ValueError:
        return None
    lines = [(i, linecache.getline(path, i).rstrip("\n")) for i in range(max(1, n - 2), n + 3)]
    if not any(text for _, text in lines):
        return None
    return {"path": path, "line": n, "lines": [[i, t] for i, t in lines if t or i <= n]}


def _alerts(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The first output with NaN/inf (the origin) with its inputs, and NaN/inf by op."""
    bad = """SELECT o.pid, o.seq, o.ts_ns, o.step, o.op, o.caller, o.caller_function,
                    o.module_path, o.phase, o.rank, o.args, t.idx, t.nan_count, t.inf_count,
                    t.shape, t.dtype, t.dump_path
             FROM _bad t JOIN ops o ON o.pid = t.pid AND o.seq = t.seq"""
    first = _rows(con, f"{bad} ORDER BY o.ts_ns, o.pid, o.seq, t.idx LIMIT 1")
    by_op = _rows(
        con,
        f"""SELECT op, count(*) AS outputs, sum(nan_count) AS nan, sum(inf_count) AS inf,
                   min(step) AS first_step, arg_min(seq, ts_ns) AS first_seq,
                   arg_min(pid, ts_ns) AS first_pid, min(ts_ns) AS first_ns
            FROM ({bad}) GROUP BY op ORDER BY first_ns LIMIT {TOP}""",
    )
    out: dict[str, Any] = {"first": None, "by_op": by_op}
    if first:
        f = first[0]
        f["inputs"] = _rows(
            con,
            """SELECT idx, shape, dtype, min, max, mean, std, nan_count, inf_count, dump_path
               FROM tensors WHERE pid = ? AND seq = ? AND role = 'input' ORDER BY idx""",
            f["pid"],
            f["seq"],
        )
        f["source"] = _source(f["caller"])
        out["first"] = f
    return out


def _dumps(con: duckdb.DuckDBPyConnection, meta: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = meta["dumps"] if isinstance(meta.get("dumps"), dict) else {}
    counts = _one(
        con,
        """SELECT count(*) FILTER (WHERE dump_path IS NOT NULL) AS dumped,
                  count(*) FILTER (WHERE dump_path IS NULL) AS not_dumped FROM tensors""",
    )
    notes = _rows(
        con,
        """SELECT regexp_replace(note, '[0-9]+', 'N', 'g') AS note, count(*) AS n FROM tensors
           WHERE note IS NOT NULL GROUP BY 1 ORDER BY n DESC LIMIT 12""",
    )
    by_op = _rows(
        con,
        """SELECT o.op, count(*) AS files FROM tensors t JOIN ops o
                  ON o.pid = t.pid AND o.seq = t.seq
           WHERE t.dump_path IS NOT NULL GROUP BY o.op ORDER BY files DESC, o.op LIMIT 15""",
    )
    keys = (
        "budget",
        "bytes_written",
        "files",
        "links",
        "skipped",
        "failed_files",
        "exhausted",
        "writer",
    )
    return {**{k: d.get(k) for k in keys}, **counts, "notes": notes, "by_op": by_op}


# ------------------------------------------------------------------ compare
def _compare_file(path: str) -> str | None:
    """The ``compare`` Parquet of a ``pprobe compare --save DIR`` folder, if ``path`` is one."""
    for cand in ("compare.parquet", os.path.join("compare", "*.parquet")):
        import glob

        if glob.glob(os.path.join(path, cand)):
            return os.path.join(path, cand)
    return None


_ALIGN = """
WITH procs AS (SELECT pid, row_number() OVER (ORDER BY min(ts_ns), pid) - 1 AS proc
               FROM {ops} GROUP BY pid),
k AS (SELECT o.pid, o.seq, p.proc, coalesce(o.step, 0) AS step,
             coalesce(o.module_path, '') AS module_path, o.op,
             row_number() OVER (PARTITION BY p.proc, coalesce(o.step, 0),
                                coalesce(o.module_path, ''), o.op ORDER BY o.seq) - 1 AS occ
      FROM {ops} o JOIN procs p USING (pid))
SELECT k.proc, k.step, k.module_path, k.op, k.occ, t.idx, k.seq, t.mean, t.std,
       t.max, t.nan_count, t.inf_count
FROM k JOIN {tensors} t ON t.pid = k.pid AND t.seq = k.seq WHERE t.role = 'output'
"""


def _rel(col: str, floor: str = "") -> str:
    """|a - b| / max(|a|, |b|) of a statistic (0 where equal). ``floor``: more terms of the
    denominator (a mean near 0 is compared with the spread, not with itself)."""
    den = f"greatest(abs(a.{col}), abs(b.{col}){floor}, 1e-300)"
    return (
        f"CASE WHEN a.{col} IS NULL OR b.{col} IS NULL THEN NULL WHEN a.{col} = b.{col} THEN 0.0 "
        f"ELSE abs(a.{col} - b.{col}) / {den} END"
    )


def _compare(con: duckdb.DuckDBPyConnection, other: str) -> dict[str, Any]:
    """Per-output differences of mean/std/max between this run and ``other`` (a run), aligned
    on (process order, step, module_path, op, occurrence, output index); or the table of a
    ``pprobe compare --save`` folder."""
    from .query import _register, table_sources

    saved = _compare_file(other) if os.path.isdir(other) else None
    if saved is not None:
        pq = "read_parquet('" + saved.replace("'", "''") + "')"
        names = {d[0] for d in con.execute(f"SELECT * FROM {pq} LIMIT 0").description or ()}
        order = ""
        if {"verdict", "first_divergence", "error_ratio"} <= names:
            # pprobe compare's own table: the first divergence, then the worst pairs first
            order = (
                " ORDER BY first_divergence DESC, "
                "CASE verdict WHEN 'fail' THEN 0 WHEN 'warn' THEN 1 ELSE 2 END, "
                "error_ratio DESC NULLS LAST"
            )
        cur = con.execute(f"SELECT * FROM {pq}{order} LIMIT {COMPARE_ROWS}")
        cols = [d[0] for d in cur.description or ()]
        got = cur.fetchall()
        total = con.execute(f"SELECT count(*) FROM {pq}").fetchone()
        verdicts = (
            dict(con.execute(f"SELECT verdict, count(*) FROM {pq} GROUP BY 1").fetchall())
            if "verdict" in names
            else {}
        )
        return {
            "kind": "saved",
            "verdicts": verdicts,
            "source": saved,
            "columns": cols,
            "rows": [list(r) for r in got],
            "total": total[0] if total else 0,
        }
    try:
        other_dir = resolve_run_dir(other)
    except FileNotFoundError as e:
        raise ReportError(f"--compare: {e}") from None
    for view, src in table_sources(other_dir).items():
        _register(con, f"b_{view}", src, True)
    a_sql = _ALIGN.format(ops="ops", tensors="tensors")
    b_sql = _ALIGN.format(ops="b_ops", tensors="b_tensors")
    keys = ("proc", "step", "module_path", "op", "occ", "idx")
    on = " AND ".join(f"a.{k} = b.{k}" for k in keys)
    spread = ", coalesce(a.std, 0), coalesce(b.std, 0)"
    score = f"greatest({_rel('mean', spread)}, {_rel('std')}, {_rel('max')})"
    con.execute(
        f"""CREATE TEMP TABLE cmp AS
            SELECT {", ".join(f"coalesce(a.{k}, b.{k}) AS {k}" for k in keys)},
                   a.seq AS seq_a, b.seq AS seq_b, a.mean AS mean_a, b.mean AS mean_b,
                   a.std AS std_a, b.std AS std_b, a.max AS max_a, b.max AS max_b,
                   a.nan_count + a.inf_count AS bad_a, b.nan_count + b.inf_count AS bad_b,
                   {score} AS score,
                   CASE WHEN a.proc IS NULL THEN 'only B' WHEN b.proc IS NULL THEN 'only A'
                        WHEN coalesce(a.nan_count, 0) <> coalesce(b.nan_count, 0)
                          OR coalesce(a.inf_count, 0) <> coalesce(b.inf_count, 0) THEN 'high'
                        WHEN {score} > {HIGH} THEN 'high'
                        WHEN {score} > {MEDIUM} THEN 'medium'
                        WHEN {score} > 0 THEN 'low' ELSE 'equal' END AS severity
            FROM ({a_sql}) a FULL OUTER JOIN ({b_sql}) b ON {on}"""
    )
    counts = {
        r["severity"]: r["n"]
        for r in _rows(con, "SELECT severity, count(*) AS n FROM cmp GROUP BY severity")
    }
    order = """CASE severity WHEN 'high' THEN 0 WHEN 'medium' THEN 1 WHEN 'only A' THEN 2
               WHEN 'only B' THEN 2 WHEN 'low' THEN 3 ELSE 4 END"""
    rows = _rows(
        con,
        f"""SELECT * FROM cmp ORDER BY {order}, score DESC NULLS LAST, proc, seq_a, idx
            LIMIT {COMPARE_ROWS}""",
    )
    first = _rows(
        con,
        """SELECT * FROM cmp WHERE severity IN ('high', 'medium') AND seq_a IS NOT NULL
           ORDER BY proc, seq_a, idx LIMIT 1""",
    )
    return {
        "kind": "runs",
        "other": other_dir,
        "counts": counts,
        "rows": rows,
        "first": first[0] if first else None,
        "thresholds": {"high": HIGH, "medium": MEDIUM},
    }


# ------------------------------------------------------------------ command line
def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "report",
        help="write one self-contained HTML page about a run (docs/report.md)",
        description="Write one self-contained HTML page about a run: overview, ops and "
        "modules, step timeline, value-range heatmap, NaN/inf origin, dumps. "
        "Example: pprobe report np_op_dumps/latest -o report.html",
    )
    r.add_argument("run", nargs="?", help="run folder or output folder (default: latest run)")
    r.add_argument(
        "--compare",
        metavar="RUN_B",
        help="a second run (per-op differences of mean/std/max) or a `pprobe compare --save` "
        "folder",
    )
    r.add_argument("-o", "--output", default="report.html", help="HTML file to write")
    r.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="what is printed: a line (text) or the report's data (json)",
    )


def main(args: Any) -> int:
    import sys

    import duckdb

    from .report_html import render

    try:
        data = collect(args.run, args.compare)
    except (FileNotFoundError, ReportError) as e:
        print(f"pprobe report: {e}", file=sys.stderr)
        return 2
    except duckdb.Error as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"pprobe report: cannot read the run: {first}", file=sys.stderr)
        return 2
    html = render(data)
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as e:
        print(f"pprobe report: cannot write {args.output}: {e}", file=sys.stderr)
        return 2
    size = len(html.encode())
    if args.format == "json":
        json.dump(
            {"output": os.path.abspath(args.output), "bytes": size, **data},
            sys.stdout,
            default=str,
            indent=1,
        )
        print()
        return 0
    ov = data["overview"]
    msg = (
        f"wrote {args.output} ({size / 1024:.0f} KiB): run {ov['run_id']}, "
        f"{ov['op_rows']:,} op rows, {data['collect_s']:.2f} s"
    )
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(f"[green]pprobe report:[/green] {msg}", highlight=False)
    else:
        print(f"pprobe report: {msg}")
    return 0
