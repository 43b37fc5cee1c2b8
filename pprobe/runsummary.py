"""``pprobe summary``: one screen about a run, from the same views ``pprobe query`` reads.

:func:`summarize` returns plain data (``--format json`` prints it); :func:`render` lays it out.
The NaN/inf alert names the first output holding a NaN or inf (in time order); the analysis
of where a NaN came from is ``pprobe.nan_origins``'s, not this module's.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from . import runs
from .runlist import dump_totals, exit_text, procs, run_dumps

#: Settings that select what is captured, with their defaults (docs: README "Selective capture").
FILTERS = {
    "include": [],
    "exclude": [],
    "every": 1,
    "first": 0,
    "steps": [],
    "dtypes": [],
}


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def summarize(run: str | None = None, top: int = 10) -> dict[str, Any]:
    """What ``pprobe summary`` shows about a run (a folder, an output folder, or None)."""
    from .query import connect
    from .run import resolve_run_dir

    run_dir = resolve_run_dir(run)
    meta = runs.read_meta(run_dir)
    plist = procs(run_dir)
    st = runs.status(run_dir)
    con = connect(run_dir)
    try:
        totals = _rows(
            con,
            "SELECT count(*) AS rows, coalesce(sum(dur_ns), 0) AS dur_ns, "
            "count(DISTINCT pid) AS pids, min(ts_ns) AS t0, max(ts_ns + dur_ns) AS t1 FROM ops",
        )[0]
        by = "op, count(*) AS calls, sum(dur_ns) AS dur_ns FROM ops GROUP BY op"
        top_calls = _rows(con, f"SELECT {by} ORDER BY calls DESC, op LIMIT {int(top)}")
        top_time = _rows(con, f"SELECT {by} ORDER BY dur_ns DESC, op LIMIT {int(top)}")
        modules = _rows(
            con,
            "SELECT module_path AS module, count(*) AS calls, sum(dur_ns) AS dur_ns FROM ops "
            "WHERE module_path IS NOT NULL GROUP BY module_path "
            f"ORDER BY dur_ns DESC, module LIMIT {int(top)}",
        )
        steps = _rows(
            con,
            "SELECT count(DISTINCT step) AS count, min(step) AS first, max(step) AS last "
            "FROM ops WHERE step IS NOT NULL",
        )[0]
        bad = "t.role = 'output' AND (t.nan_count > 0 OR t.inf_count > 0)"
        nan = _rows(
            con,
            "SELECT count(*) AS outputs, count(DISTINCT (t.pid, t.seq)) AS calls, "
            "coalesce(sum(t.nan_count), 0) AS nan, coalesce(sum(t.inf_count), 0) AS inf "
            f"FROM tensors t WHERE {bad}",
        )[0]
        first = _rows(
            con,
            "SELECT o.pid, o.seq, o.rank, o.step, o.op, o.caller, o.module_path, t.idx, "
            "t.nan_count, t.inf_count, t.dump_path FROM ops o JOIN tensors t "
            f"ON o.pid = t.pid AND o.seq = t.seq WHERE {bad} "
            "ORDER BY o.ts_ns, o.pid, o.seq, t.idx LIMIT 1",
        )
        notes = _rows(
            con,
            "SELECT regexp_replace(note, '[0-9]+', 'N', 'g') AS note, count(*) AS arrays "
            "FROM tensors WHERE note IS NOT NULL GROUP BY 1 ORDER BY arrays DESC, note "
            f"LIMIT {int(top)}",
        )
    finally:
        con.close()
    for r in top_calls + top_time + modules:
        r["time_s"] = (r.pop("dur_ns") or 0) / 1e9
    if first:
        first[0]["prefix"] = f"{first[0]['pid']}-{first[0]['seq']}"
    errors = _errors(plist)
    cfg = meta.get("config") or {}
    return {
        "run": {
            "id": os.path.basename(run_dir),
            "dir": run_dir,
            "state": st.state,
            "exit": exit_text(st),
            "argv": list(meta.get("argv") or []),
            "start": meta.get("start"),
            "duration_s": (meta["end"] - meta["start"])
            if isinstance(meta.get("end"), (int, float))
            and isinstance(meta.get("start"), (int, float))
            else None,
            "mode": cfg.get("mode"),
            "processes": len(plist),
            "ranks": sorted({p["rank"] for p in plist if isinstance(p.get("rank"), int)}),
        },
        "ops": {
            "rows": totals["rows"],
            "time_s": totals["dur_ns"] / 1e9,
            "processes_with_rows": totals["pids"],
        },
        "top_ops_by_calls": top_calls,
        "top_ops_by_time": top_time,
        "top_modules": modules,
        "steps": steps,
        "nan_inf": {**nan, "first": first[0] if first else None},
        "dumps": run_dumps(
            run_dir, meta, plist, st.state != runs.ENDED or any(p.get("end") is None for p in plist)
        ),
        "errors": errors,
        "not_captured": not_captured(meta, plist, st, notes),
    }


def _errors(plist: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pprobe's own errors of every process, the same failure once with its total count."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in plist:
        for e in p.get("errors") or []:
            key = (str(e.get("where")), str(e.get("type")), str(e.get("message")))
            if key in out:
                out[key]["count"] += int(e.get("count") or 1)
                out[key]["pids"].append(p.get("pid"))
            else:
                out[key] = {
                    "where": key[0],
                    "type": key[1],
                    "message": key[2],
                    "count": int(e.get("count") or 1),
                    "pids": [p.get("pid")],
                }
    return list(out.values())


def not_captured(
    meta: dict[str, Any],
    plist: list[dict[str, Any]],
    st: runs.RunStatus,
    notes: list[dict[str, Any]],
) -> list[str]:
    """What the run did not capture, and why: one line each."""
    cfg = meta.get("config") or {}
    cov = meta.get("coverage") or {}
    out = []
    mode = cfg.get("mode")
    if mode == "log":
        out.append("array statistics and dumps: mode log (PPROBE_MODE=stats or dump)")
    elif mode == "stats":
        out.append("dumps: mode stats (PPROBE_MODE=dump)")
    if cov.get("coverage") == "namespace":
        out.append("NumPy operators (a + b) and ndarray methods: coverage namespace (np.* only)")
    fws = set((cov.get("frameworks") or {}).keys())
    for fw in cfg.get("frameworks") or []:
        if fw not in fws:
            out.append(f"{fw}: not imported by the program (or its probe failed to install)")
    for fw in ("numpy", "torch"):
        if fw not in (cfg.get("frameworks") or [fw]):
            out.append(f"{fw}: not probed (PPROBE_FRAMEWORKS)")
    if "torch" in fws:
        levels = cfg.get("torch_levels") or ["api"]
        missing = [lv for lv in ("aten", "module") if lv not in levels]
        if missing:
            out.append(
                f"torch levels {', '.join(missing)} (backward ops, module rows): "
                f"PPROBE_TORCH_LEVEL={','.join(levels)}"
            )
    filters = [
        f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in ((k, cfg.get(k, d)) for k, d in FILTERS.items())
        if v != FILTERS[k] and v is not None
    ]
    if filters:
        out.append("calls outside the filters: " + ", ".join(filters))
    if not cfg.get("nested", False):
        out.append("calls made inside recorded calls: PPROBE_NESTED=0")
    dropped = sum(int(p.get("rows_dropped") or 0) for p in plist)
    if dropped:
        out.append(f"{dropped} rows dropped: the record buffer was full (PPROBE_BUFFER_FULL=drop)")
    d = dump_totals(meta, plist)
    if d["exhausted"]:
        out.append("dumps after the budget ran out (PPROBE_BUDGET)")
    if d["skipped"]:
        out.append(f"{d['skipped']} dumps skipped (budget or a full dump queue)")
    if d["failed_files"]:
        out.append(f"{d['failed_files']} dumps failed to be written (see the rows' notes)")
    for n in notes:
        out.append(f"{n['arrays']} arrays: {n['note']}")
    skipped = meta.get("skipped") or []
    if skipped:
        out.append(f"{len(skipped)} child processes ran unprobed (meta.json's skipped)")
    if st.state == runs.DIED:
        out.append("rows after the last flush: the process died without finishing")
    elif st.state == runs.RUNNING:
        out.append("the run is still running: rows not flushed yet")
    return out


# ---------------------------------------------------------------------------------- text
def render(s: dict[str, Any]) -> Any:
    """The summary as a :class:`pprobe.textout.Doc`."""
    from .textout import Doc, fmt_bytes, fmt_seconds

    r = s["run"]
    doc = Doc()
    doc.title(f"Run {r['id']}")
    nproc = r["processes"]
    ranks = ",".join(map(str, r["ranks"])) if r["ranks"] else "-"
    st = s["steps"]
    steps = f"{st['count']} ({st['first']}..{st['last']})" if st["count"] else "none recorded"
    d = s["dumps"]
    if d["enabled"]:
        pct = 100.0 * d["bytes"] / d["budget"] if d["budget"] else 0.0
        dumps = (
            f"{d['files']} files ({d['links']} links), {fmt_bytes(d['bytes'])} of "
            f"{fmt_bytes(d['budget'])} budget ({pct:.1f} %), {fmt_bytes(d['budget_left'])} left"
            + (", exhausted" if d["exhausted"] else "")
        )
    else:
        dumps = f"none (mode {r['mode'] or '-'})"
    errs = s["errors"]
    doc.kv(
        [
            ("folder", r["dir"]),
            ("argv", " ".join(r["argv"]) or "-"),
            ("exit", r["exit"]),
            ("duration", fmt_seconds(r["duration_s"])),
            ("mode", str(r["mode"] or "-")),
            ("processes", f"{nproc} (ranks {ranks})"),
            ("op rows", f"{s['ops']['rows']} ({fmt_seconds(s['ops']['time_s'])} in ops)"),
            ("steps", steps),
            ("dumps", dumps),
            ("errors", f"{sum(e['count'] for e in errs)} in pprobe" if errs else "none"),
        ]
    )
    n = s["nan_inf"]
    if n["outputs"]:
        f = n["first"]
        doc.text(
            f"NaN/inf: {n['outputs']} outputs of {n['calls']} calls "
            f"({n['nan']} NaN, {n['inf']} inf values)"
        )
        where = f" in {f['module_path']}" if f.get("module_path") else ""
        doc.kv(
            [
                ("first", f"{f['op']} seq {f['seq']} (show {f['prefix']}) step {f['step']}"),
                ("caller", f"{f['caller']}{where}"),
                (
                    "output",
                    f"{f['idx']}: {f['nan_count']} NaN, {f['inf_count']} inf"
                    + (f", dump {f['dump_path']}" if f.get("dump_path") else ""),
                ),
            ]
        )
    else:
        doc.text(
            "NaN/inf: none in outputs"
            + ("" if r["mode"] != "log" else " (not measured in log mode)")
        )

    def rows(lst: list[dict[str, Any]], key: str) -> list[list[Any]]:
        return [[x[key], x["calls"], fmt_seconds(x["time_s"])] for x in lst]

    doc.table(
        "Top ops by calls", ["op", "calls", "time"], rows(s["top_ops_by_calls"], "op"), {1, 2}
    )
    doc.table("Top ops by time", ["op", "calls", "time"], rows(s["top_ops_by_time"], "op"), {1, 2})
    doc.table(
        "Top modules by time",
        ["module", "calls", "time"],
        rows(s["top_modules"], "module"),
        {1, 2},
        empty="(no module paths: torch nn.Module calls only)",
    )
    if errs:
        doc.table(
            "pprobe errors",
            ["where", "error", "count"],
            [[e["where"], f"{e['type']}: {e['message']}"[:100], e["count"]] for e in errs],
            {2},
        )
    doc.bullets("Not captured", s["not_captured"], empty="(nothing left out)")
    return doc


def main(args: argparse.Namespace) -> int:
    from .see_cli import _json_out

    s = summarize(args.run, args.top)
    if args.format == "json":
        _json_out(s)
    else:
        render(s).print()
    return 0
