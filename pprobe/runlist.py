"""The runs of an output folder: what ``pprobe ls`` lists and ``pprobe gc`` frees.

Everything here is read from each run's ``meta.json`` and ``procs/*.json`` (no shard is
decoded), except the op rows of a run that did not end: its metadata counts only what was
flushed when it was last written, so those rows are counted from the log.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import runs
from .run import latest_name


@dataclass
class RunInfo:
    """One run folder, as ``pprobe ls`` shows it (``--format json`` prints these fields)."""

    id: str
    dir: str
    state: str  # runs.status(): ended, running, died, unknown
    exit: str  # "ok", "exited 3", "exception ValueError", "died (...)", "running"
    start: float | None
    end: float | None
    duration_s: float | None
    argv: list[str]
    processes: int
    ranks: list[int]
    op_rows: int | None
    dumps: dict[str, Any]
    coverage: str
    frameworks: list[str]
    mode: str | None
    errors: int
    latest: bool = False
    disk_bytes: int | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def procs(run_dir: str) -> list[dict[str, Any]]:
    """The run's ``procs/*.json``, one per process (the root's meta.json where there are none)."""
    out = []
    d = os.path.join(run_dir, "procs")
    try:
        names = sorted(os.listdir(d))
    except OSError:
        names = []
    for n in names:
        if n.endswith(".json"):
            p = _read_json(os.path.join(d, n))
            if p is not None:
                out.append(p)
    if not out:
        m = _read_json(os.path.join(run_dir, "meta.json"))
        if m is not None:
            out.append(m)
    return out


def dump_totals(meta: dict[str, Any], plist: list[dict[str, Any]]) -> dict[str, Any]:
    """Dumps of every process together: files, links, bytes, budget and what is left."""
    budget = (meta.get("config") or {}).get("budget")
    tot: dict[str, Any] = {"files": 0, "links": 0, "bytes": 0, "skipped": 0, "failed_files": 0}
    exhausted = False
    any_dumps = False
    for p in plist:
        d = p.get("dumps")
        if not isinstance(d, dict):
            continue
        any_dumps = True
        tot["files"] += int(d.get("files") or 0)
        tot["links"] += int(d.get("links") or 0)
        tot["bytes"] += int(d.get("bytes_written") or 0)
        tot["skipped"] += int(d.get("skipped") or 0)
        tot["failed_files"] += int(d.get("failed_files") or 0)
        exhausted = exhausted or bool(d.get("exhausted"))
    tot["budget"] = budget if any_dumps else None
    tot["budget_left"] = max(0, budget - tot["bytes"]) if any_dumps and budget else None
    tot["exhausted"] = exhausted
    tot["enabled"] = any_dumps
    return tot


def dumps_on_disk(run_dir: str) -> dict[str, int]:
    """files (distinct contents), links (further names of one) and bytes of the run's .npy
    dumps (files and pack entries, pprobe.packs), counted on disk: for a run whose metadata
    lags behind (live or killed)."""
    seen: set[tuple[int, int]] = set()
    names = nbytes = 0
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return {"files": 0, "links": 0, "bytes": 0}
    for e in entries:
        if not (e.name.endswith(".npy") or ".npy." in e.name) or e.name.startswith("."):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        names += 1
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            nbytes += st.st_size
    from . import packs  # small dumps appended to the run's pack files

    p = packs.stats(run_dir)
    return {
        "files": len(seen) + p["entries"],
        "links": names - len(seen) + p["aliases"],
        "bytes": nbytes + p["bytes"],
    }


def run_dumps(
    run_dir: str, meta: dict[str, Any], plist: list[dict[str, Any]], lagging: bool
) -> dict[str, Any]:
    """:func:`dump_totals`, counted on disk where the metadata lags (a live or killed run)."""
    dumps = dump_totals(meta, plist)
    if lagging and dumps["enabled"]:
        dumps.update(dumps_on_disk(run_dir))
        if dumps["budget"]:
            dumps["budget_left"] = max(0, dumps["budget"] - dumps["bytes"])
    return dumps


def exit_text(st: runs.RunStatus) -> str:
    e = st.exit
    if st.state == runs.DIED:
        return "died (no final status: killed?)"
    if st.state == runs.RUNNING:
        return "running"
    if st.state == runs.UNKNOWN:
        return f"unknown ({st.reason})" if st.reason else "unknown"
    s = str(e.get("status", "?"))
    if s == "ok":
        return "ok"
    if s == "exception":
        return f"exception {e.get('exception', '')}".strip()
    if s == "exited":
        return f"exited {e.get('code')}"
    if s == "signal":
        return f"signal {e.get('signal')}"
    return s


def count_rows(run_dir: str) -> int | None:
    """Op rows in the run's log (for runs whose metadata may lag behind it)."""
    try:
        from .query import run_sql

        _, rows = run_sql("SELECT count(*) FROM ops", run_dir)
        return int(rows[0][0])
    except Exception:
        return None


def is_run_dir(path: str) -> bool:
    """A real folder (never a symlink) holding a meta.json or a log folder."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    return os.path.isfile(os.path.join(path, "meta.json")) or os.path.isdir(
        os.path.join(path, "log")
    )


def disk_bytes(path: str) -> int:
    """Bytes the folder takes on disk, each hard-linked file once, never following symlinks."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(path, followlinks=False):
        for n in files + dirs:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def run_info(run_dir: str, count: bool = True, sizes: bool = False) -> RunInfo:
    """What ``pprobe ls`` says about one run folder."""
    meta = _read_json(os.path.join(run_dir, "meta.json")) or {}
    st = runs.status(run_dir)
    plist = procs(run_dir)
    start = meta.get("start")
    end = meta.get("end")
    duration: float | None
    if st.state == runs.RUNNING and isinstance(start, (int, float)):
        duration = time.time() - start
    elif isinstance(start, (int, float)) and isinstance(end, (int, float)):
        duration = end - start
    else:
        ends = [float(p["end"]) for p in plist if isinstance(p.get("end"), (int, float))]
        duration = max(ends) - start if ends and isinstance(start, (int, float)) else None
    ranks = sorted({p["rank"] for p in plist if isinstance(p.get("rank"), int)})
    rows: int | None = sum(int(p.get("rows_written") or 0) for p in plist)
    lagging = st.state != runs.ENDED or any(p.get("end") is None for p in plist)
    dumps = run_dumps(run_dir, meta, plist, lagging)
    if count and lagging:
        rows = count_rows(run_dir)  # metadata lags behind a live or killed run's log
    cov = meta.get("coverage") or {}
    frameworks = sorted((cov.get("frameworks") or {}).keys())
    errors = sum(int(e.get("count") or 1) for p in plist for e in p.get("errors") or [])
    return RunInfo(
        id=os.path.basename(run_dir.rstrip(os.sep)),
        dir=run_dir,
        state=st.state,
        exit=exit_text(st),
        start=start,
        end=end,
        duration_s=duration,
        argv=list(meta.get("argv") or []),
        processes=len(plist),
        ranks=ranks,
        op_rows=rows,
        dumps=dumps,
        coverage=str(cov.get("coverage") or ("-" if not frameworks else "?")),
        frameworks=frameworks,
        mode=(meta.get("config") or {}).get("mode"),
        errors=errors,
        disk_bytes=disk_bytes(run_dir) if sizes else None,
        reason=st.reason,
    )


def list_runs(output: str, count: bool = True, sizes: bool = False) -> list[RunInfo]:
    """Every run folder of an output folder, oldest first. Raises FileNotFoundError."""
    out_dir = os.path.abspath(output)
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"no output folder at {out_dir}")
    if is_run_dir(out_dir):
        raise FileNotFoundError(
            f"{out_dir} is a run folder, not an output folder: try pprobe ls "
            f"{os.path.dirname(out_dir)}"
        )
    latest = latest_name(out_dir)
    infos = []
    for name in sorted(os.listdir(out_dir)):
        p = os.path.join(out_dir, name)
        if name.startswith(".") or not is_run_dir(p):
            continue
        info = run_info(p, count=count, sizes=sizes)
        info.latest = name == latest
        infos.append(info)
    infos.sort(key=lambda i: (i.start or 0.0, i.id))
    return infos
