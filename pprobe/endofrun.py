"""What the process that made a run does as the run ends (called by ``Session.stop``):

- a run that recorded nothing (no op row in any of its processes, and no error of pprobe's:
  a log that failed to be written is worth seeing) gives ``latest`` back to
  the run it named before, so ``python -c "print(1)"`` under a site-wide ``PPROBE=1`` or a
  typo'd script name does not hide the last real run (its folder stays, and ``pprobe ls``
  lists it);
- one line on stderr with the run folder, ops, dumps and bytes, and pprobe's errors:
  ``PPROBE_SUMMARY_LINE=auto`` (the default) prints it when stderr is a terminal, ``on``
  always, ``off`` never.

Cheap (a few small JSON files read) and guarded: nothing here raises into the program.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any


def finish(session: Any) -> None:
    """At the end of the run's first process; never raises."""
    try:
        run = session.run
        if not run.root:
            return
        others = _other_procs(run.dir, f"{run.host}-{run.pid}.json")
        rows = int(getattr(session.writer, "rows_written", 0) or 0)
        rows += sum(int(p.get("rows_written") or 0) for p in others)
        from . import _report

        errors = bool(_report.errors) or any(p.get("errors") for p in others)
        empty = rows == 0 and not errors  # a run whose log failed (a full disk) has its say
        previous = give_latest_back(run) if empty else None
        if _wanted(session.config.summary_line):
            _say(line(session, others, rows, previous, empty))
    except Exception:
        pass


def _wanted(setting: str) -> bool:
    if setting == "on":
        return True
    if setting == "off":
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def _other_procs(run_dir: str, own: str) -> list[dict[str, Any]]:
    out = []
    d = os.path.join(run_dir, "procs")
    try:
        names = os.listdir(d)
    except OSError:
        return []
    for n in names:
        if n.endswith(".json") and n != own:
            try:
                with open(os.path.join(d, n), "rb") as f:
                    p = json.loads(f.read())
                if isinstance(p, dict):
                    out.append(p)
            except (OSError, ValueError):
                continue
    return out


def line(
    session: Any, others: list[dict[str, Any]], rows: int, previous: str | None, empty: bool
) -> str:
    """``pprobe: run DIR: N ops, M dumps (X MiB), K errors (pprobe summary DIR)``."""
    from . import _report
    from .textout import fmt_bytes

    run = session.run
    if empty:
        kept = f"; `latest` still names {previous}" if previous else ""
        return (
            f"pprobe: run {run.dir} recorded no ops (the program called no NumPy or torch op, "
            f"or filters left none){kept}"
        )
    dumps = [session.dumper.summary()] if session.dumper is not None else []
    dumps += [p["dumps"] for p in others if isinstance(p.get("dumps"), dict)]
    errors = sum(int(e.get("count") or 1) for e in _report.errors)
    errors += sum(int(e.get("count") or 1) for p in others for e in p.get("errors") or [])
    parts = [f"{rows} ops"]
    if dumps:
        files = sum(int(d.get("files") or 0) + int(d.get("links") or 0) for d in dumps)
        nbytes = sum(int(d.get("bytes_written") or 0) for d in dumps)
        parts.append(f"{files} dumps ({fmt_bytes(nbytes)})")
    parts.append(f"{errors} error{'s' if errors != 1 else ''} in pprobe")
    return f"pprobe: run {run.dir}: {', '.join(parts)} (pprobe summary {run.dir})"


def give_latest_back(run: Any) -> str | None:
    """Point ``LATEST``/``latest`` back at the run they named before ``run`` (or remove them
    where there was none), if they still name ``run``. Returns the run now named."""
    from . import safefs
    from .run import _locked, latest_name

    base_path = os.path.dirname(run.dir)
    prev = getattr(run, "previous_latest", None)
    if prev is not None and not os.path.isdir(os.path.join(base_path, prev)):
        prev = None
    base = safefs.open_base(base_path, run.config.permissions)
    try:
        with _locked(base.fd):
            if latest_name(base_path) != run.id:
                return latest_name(base_path)  # a newer run took it: leave it
            if prev is None:
                base.unlink("LATEST")
                st = base.lstat("latest")
                if st is not None and stat.S_ISLNK(st.st_mode):
                    base.unlink("latest")
                return None
            base.replace_atomic("LATEST", (prev + "\n").encode())
            st = base.lstat("latest")
            if st is None or stat.S_ISLNK(st.st_mode):
                try:
                    base.symlink_atomic(prev, "latest")
                except OSError:
                    pass
            return prev
    finally:
        base.close()
