"""``pprobe gc``: delete old runs of an output folder to free disk.

It says what it will delete before it does: without ``--yes`` it lists the runs and asks on
a terminal, or only lists them (a dry run) otherwise. It never deletes a live run (its
process is alive, or it runs on another host: :func:`pprobe.runs.status`), nor the run that
``latest`` names, and never follows a symlink: only real folders directly in the output
folder are candidates, and they are removed with :func:`shutil.rmtree`, which does not follow
symlinks inside them (and on Linux removes relative to directory descriptors).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

from . import runs
from .runlist import RunInfo, list_runs


def plan(
    output: str, keep: int | None = None, older_than_days: float | None = None
) -> tuple[list[RunInfo], list[tuple[RunInfo, str]]]:
    """(runs to delete, [(run kept although selected, why)]), oldest first."""
    if keep is not None and keep < 0:
        raise ValueError("--keep takes a number of runs >= 0")
    if older_than_days is not None and older_than_days < 0:
        raise ValueError("--older-than takes a number of days >= 0")
    infos = list_runs(output, count=False, sizes=True)
    if keep is not None:
        chosen = infos[: max(0, len(infos) - keep)]
    else:
        cut = time.time() - float(older_than_days or 0.0) * 86400.0
        chosen = [i for i in infos if (i.start or 0.0) <= cut]
    delete, spared = [], []
    for i in chosen:
        if i.state in (runs.RUNNING, runs.UNKNOWN):
            spared.append((i, f"live ({i.exit})" if i.state == runs.RUNNING else i.exit))
        elif i.latest:
            spared.append((i, "the latest run"))
        else:
            delete.append(i)
    return delete, spared


def delete_run(info: RunInfo) -> None:
    """Remove one run folder, refusing a symlink (checked again just before)."""
    if os.path.islink(info.dir) or not os.path.isdir(info.dir):
        raise OSError(f"{info.dir} is not a real folder any more")
    if runs.status(info.dir).state == runs.RUNNING:
        raise OSError(f"{info.dir} is live now")
    shutil.rmtree(info.dir)


def main(args: argparse.Namespace) -> int:
    from .see_cli import UsageError, _json_out, _output_dir
    from .textout import fmt_bytes

    out = _output_dir(args.output)
    try:
        delete, spared = plan(out, args.keep, args.older_than)
    except ValueError as e:
        raise UsageError(str(e)) from None
    total = sum(i.disk_bytes or 0 for i in delete)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    go = args.yes
    res: dict[str, Any] = {
        "output": out,
        "delete": [{"id": i.id, "dir": i.dir, "bytes": i.disk_bytes} for i in delete],
        "spared": [{"id": i.id, "why": why} for i, why in spared],
        "bytes": total,
    }
    if args.format != "json" or not go:
        lines = [
            f"  {i.id}  {fmt_bytes(i.disk_bytes)}  {i.exit}  {' '.join(i.argv)[:60]}"
            for i in delete
        ]
        msg = [f"pprobe gc: {len(delete)} runs to delete in {out} ({fmt_bytes(total)}):"]
        msg += lines
        msg += [f"  kept: {i.id} ({why})" for i, why in spared]
        print("\n".join(msg), file=sys.stderr if args.format == "json" else sys.stdout)
    if delete and not go and interactive and args.format != "json":
        try:
            answer = input(f"Delete these {len(delete)} runs? [y/N] ")
        except EOFError:
            answer = ""
        go = answer.strip().lower() in ("y", "yes")
    deleted, failed = [], []
    if go:
        for i in delete:
            try:
                delete_run(i)
                deleted.append(i.id)
            except OSError as e:
                failed.append({"id": i.id, "error": str(e)})
                print(f"pprobe gc: {i.id} not deleted: {e}", file=sys.stderr)
    res.update(deleted=deleted, failed=failed, dry_run=not go)
    if args.format == "json":
        _json_out(res)
    elif go:
        freed = sum(i.disk_bytes or 0 for i in delete if i.id in deleted)
        print(f"deleted {len(deleted)} runs, {fmt_bytes(freed)} freed")
    elif delete:
        print("nothing deleted" + ("" if interactive else ": pass --yes to delete these runs"))
    return 1 if failed else 0
