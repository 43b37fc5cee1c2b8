"""The "see a run" commands: ``pprobe ls``, ``summary``, ``show``, ``export`` and ``gc``.

:func:`add_parser` registers them on pprobe's sub-command parser and :func:`main` runs one;
pprobe/cli.py calls both. Output is rich text on a terminal, plain text when piped, and JSON
with ``--format json``. A bad run folder or argument is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

COMMANDS = ("ls", "summary", "show", "export", "gc")


class UsageError(Exception):
    """A bad run folder or argument: one line on stderr, exit 2."""


def _fmt_arg(p: argparse.ArgumentParser, choices: tuple[str, ...] = ("text", "json")) -> None:
    p.add_argument(
        "--format",
        choices=choices,
        default="text",
        help="text (rich on a terminal, plain when piped) or json (for scripts)",
    )


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return n


def add_parser(sub: Any) -> None:
    """Register ls, summary, show, export and gc on the sub-command parser."""
    p = sub.add_parser(
        "ls",
        help="list the runs of an output folder",
        description="List the runs of an output folder: id, start, duration, exit status, "
        "processes, ranks, op rows, dumps, coverage and command line.",
    )
    p.add_argument(
        "output", nargs="?", help="output folder (default: $PPROBE_OUTPUT or np_op_dumps)"
    )
    p.add_argument("--size", action="store_true", help="also measure each run's disk use")
    _fmt_arg(p)

    p = sub.add_parser(
        "summary",
        help="one screen about a run: top ops, modules, steps, NaN/inf, dumps, errors",
    )
    p.add_argument("run", nargs="?", help="run folder or output folder (default: the latest run)")
    p.add_argument("--top", type=_positive, default=10, help="rows in each top list (default 10)")
    _fmt_arg(p)

    p = sub.add_parser(
        "show",
        help="one call: its row, caller and source line, each input and output",
        description="Show one recorded call. KEY is its seq (a number) or its dump prefix "
        "PID-SEQ (as in op_numpy.add_input0_4242-17.npy).",
    )
    p.add_argument(
        "key", metavar="SEQ|PREFIX", help="a seq such as 17, or a prefix such as 4242-17"
    )
    p.add_argument("--run", help="run folder or output folder (default: the latest run)")
    p.add_argument("--pid", type=int, help="the process, where several have this seq")
    p.add_argument("--values", action="store_true", help="print the dumped arrays' values")
    _fmt_arg(p)

    p = sub.add_parser(
        "export",
        help="write a run's views as Parquet (partitioned by rank and step) or CSV files",
    )
    p.add_argument("run", nargs="?", help="run folder or output folder (default: the latest run)")
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="folder to write into (created; must be empty)"
    )
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    from . import dumpexport

    dumpexport.add_arguments(p)

    p = sub.add_parser(
        "gc",
        help="delete old runs to free disk (says what it deletes first)",
        description="Delete old runs of an output folder. Without --yes: lists what would go "
        "(and asks on a terminal). Never deletes a live run or the latest run, never follows "
        "a symlink.",
    )
    p.add_argument(
        "output", nargs="?", help="output folder (default: $PPROBE_OUTPUT or np_op_dumps)"
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--keep", type=int, metavar="N", help="keep the N newest runs")
    g.add_argument("--older-than", type=float, metavar="DAYS", help="runs started DAYS ago or more")
    p.add_argument("--yes", action="store_true", help="delete without asking")
    _fmt_arg(p)


def main(args: argparse.Namespace) -> int:
    """Run the sub-command ``args.command``; returns the exit status."""
    fn = {
        "ls": _cmd_ls,
        "summary": _cmd_summary,
        "show": _cmd_show,
        "export": _cmd_export,
        "gc": _cmd_gc,
    }[args.command]
    import duckdb

    from .query import QueryError

    try:
        return fn(args)
    except BrokenPipeError:
        return 0
    except (UsageError, OSError, QueryError, duckdb.Error) as e:
        # a bad run folder or argument, an unreadable file: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"pprobe {args.command}: {first}", file=sys.stderr)
        return 2


def say_if_empty(run: str | None) -> None:
    """For ``pprobe query``: one line on stderr when the run has no op rows at all."""
    try:
        from .query import run_sql
        from .run import resolve_run_dir

        run_dir = resolve_run_dir(run)
        _, rows = run_sql("SELECT count(*) FROM ops", run_dir)
        if rows and rows[0][0] == 0:
            print(
                f"pprobe query: the run {run_dir} recorded no ops (its program called no "
                "NumPy or torch op, or they were filtered out: pprobe summary says)",
                file=sys.stderr,
            )
    except Exception:
        pass


def _output_dir(arg: str | None) -> str:
    return os.path.abspath(arg or os.environ.get("PPROBE_OUTPUT") or "np_op_dumps")


def _json_out(data: Any) -> None:
    """Strict JSON on stdout: a NaN or infinite float becomes the string "nan", "inf", "-inf"."""
    json.dump(_finite(data), sys.stdout, indent=1, default=str, allow_nan=False)
    print()


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _local(ts: float | None) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# ---------------------------------------------------------------------------------- ls
def _cmd_ls(args: argparse.Namespace) -> int:
    from .runlist import list_runs
    from .textout import Doc, fmt_bytes, fmt_seconds

    out = _output_dir(args.output)
    infos = list_runs(out, sizes=args.size)
    if args.format == "json":
        _json_out({"output": out, "runs": [i.to_json() for i in infos]})
        return 0
    doc = Doc()
    rows = []
    for i in infos:
        d = i.dumps
        dumps = (
            f"{d['files'] + d['links']} ({fmt_bytes(d['bytes'])}, "
            f"{fmt_bytes(d['budget_left'])} left)"
            if d["enabled"]
            else f"- ({i.mode} mode)"
        )
        argv = " ".join(i.argv)
        rows.append(
            [
                i.id + (" *" if i.latest else ""),
                _local(i.start),
                fmt_seconds(i.duration_s),
                i.exit,
                i.processes,
                ",".join(map(str, i.ranks)) or "-",
                "?" if i.op_rows is None else i.op_rows,
                dumps,
                i.coverage,
                *([fmt_bytes(i.disk_bytes)] if args.size else []),
                argv if len(argv) <= 50 else argv[:47] + "...",
            ]
        )
    cols = ["run", "start", "duration", "exit", "procs", "ranks", "ops", "dumps", "coverage"]
    cols += ["disk"] if args.size else []
    doc.table(f"Runs in {out}", cols + ["argv"], rows, right={2, 4, 6}, empty="(no runs)")
    if any(i.latest for i in infos):
        doc.text("* the latest run")
    doc.print()
    return 0


# ---------------------------------------------------------------------------------- stubs
def _cmd_summary(args: argparse.Namespace) -> int:
    from . import runsummary as summary

    return summary.main(args)


def _cmd_show(args: argparse.Namespace) -> int:
    from . import callview

    return callview.main(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from . import dumpexport, export

    if args.npy is not None or not args.dir:
        return dumpexport.main(args)
    args.run = args.run or args.run_opt

    return export.main(args)


def _cmd_gc(args: argparse.Namespace) -> int:
    from . import gc

    return gc.main(args)
