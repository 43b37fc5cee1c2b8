"""Where the command line is parsed: ``pprobe run|query|install|uninstall``."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

from . import __version__


def bootstrap_dir() -> str:
    """The folder holding our sitecustomize.py: installed package data or the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (
        os.path.join(here, "_bootstrap"),
        os.path.join(os.path.dirname(here), "bootstrap"),
    ):
        if os.path.isfile(os.path.join(cand, "sitecustomize.py")):
            return cand
    import importlib.util

    spec = importlib.util.find_spec("pprobe._bootstrap")
    if spec and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    raise FileNotFoundError("pprobe's bootstrap folder is missing from this installation")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pprobe", description="See every NumPy and PyTorch op a program runs. Docs: README.md"
    )
    p.add_argument("--version", action="version", version=f"pprobe {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a program under the probe: pprobe run -- python x.py")
    from . import runflags

    runflags.add_run_options(r)  # one flag per setting, checked before the program starts
    # Not dest="command": that is the sub-command's own dest and would be overwritten.
    r.add_argument(
        "program", nargs=argparse.REMAINDER, metavar="command", help="-- program and its arguments"
    )

    q = sub.add_parser(
        "query",
        help="run SQL over a run's log (views: ops, tensors)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='example:\n  pprobe query "SELECT op, count(*) AS calls, sum(dur_ns) AS ns FROM ops '
        'GROUP BY op ORDER BY calls DESC"\n'
        "views and columns: docs/schema.md",
    )
    q.add_argument("sql")
    q.add_argument("--run", help="run folder or output folder (default: np_op_dumps/latest)")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.add_argument(
        "--max-rows", type=int, default=200, help="rows printed in table format (0: all)"
    )
    from .ext import cli as ext_cli

    ext_cli.add_live_arguments(q)

    from . import see_cli

    see_cli.add_parser(sub)

    from . import compare_cli

    compare_cli.add_parser(sub)
    from . import nancli

    nancli.add_parser(sub)

    sub.add_parser(
        "bootstrap-path",
        help="print the bootstrap folder: PYTHONPATH=$(pprobe bootstrap-path) python x.py",
    )
    for name in ("install", "uninstall"):
        s = sub.add_parser(name, help=f"{name} the dormant site-wide start-up hook (.pth)")
        s.add_argument("--site", action="store_true", required=True)

    from . import report

    report.add_parser(sub)
    from .ext import cli as ext_cli

    ext_cli.add_parser(sub)
    from .collect import cli as collect_cli

    collect_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    _stop_probing_self()
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "query":
        return _cmd_query(args)
    if args.command == "report":
        from . import report

        return report.main(args)
    from . import see_cli

    if args.command in see_cli.COMMANDS:
        return see_cli.main(args)
    if args.command == "compare":
        from . import compare_cli

        return compare_cli.main(args)
    if args.command == "nan":
        from . import nancli

        return nancli.main(args)
    if args.command == "collect":
        from .collect import cli as collect_cli

        return collect_cli.main(args)
    if args.command == "bootstrap-path":
        print(bootstrap_dir())
        return 0
    if args.command == "plugins":
        from .ext import cli as ext_cli

        return ext_cli.main(args)
    from . import siteinstall

    if args.command == "install":
        print(f"pprobe: installed {siteinstall.install()} (dormant unless PPROBE=1)")
        return 0
    path = siteinstall.uninstall()
    print(f"pprobe: removed {path}" if path else "pprobe: no site hook was installed")
    return 0


def _stop_probing_self() -> None:
    """pprobe's own CLI is never probed, even when started with the bootstrap on."""
    from .session import Session

    if Session.active is not None:
        Session.active.stop()


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.program)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print(
            "pprobe run: give the program to run, e.g. pprobe run -- python train.py",
            file=sys.stderr,
        )
        return 2
    from .config import ConfigError
    from .runflags import run_env

    try:
        flags = run_env(args)
    except ConfigError as e:
        print(f"pprobe run: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.pop("PPROBE_RESOLVED", None)  # a new run, not a child of ours
    env["PPROBE"] = "1"
    boot = bootstrap_dir()
    env["PYTHONPATH"] = os.pathsep.join(
        [boot] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.update(flags)
    try:
        os.execvpe(cmd[0], cmd, env)  # exit code, stdio and signals are the program's own
    except OSError as e:
        print(f"pprobe run: cannot run {cmd[0]!r}: {e}", file=sys.stderr)
        return 127


def _cmd_query(args: argparse.Namespace) -> int:
    import warnings

    from .ext import cli as ext_cli
    from .query import DamagedShardWarning, QueryError, run_sql

    try:
        run = ext_cli.live_run(args)  # --live [--pid]: the endpoint's answer, or which run
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DamagedShardWarning)
            cols, rows = run if isinstance(run, tuple) else run_sql(args.sql, run)
        said = set()
        for c in caught:  # a damaged shard: one line each, however many tries the query took
            if issubclass(c.category, DamagedShardWarning) and str(c.message) not in said:
                said.add(str(c.message))
                print(f"pprobe query: warning: {c.message}", file=sys.stderr)
    except (QueryError, ext_cli.LiveError) as e:
        print(f"pprobe query: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"pprobe query: {e}", file=sys.stderr)
        return 2
    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    elif args.format == "json":
        json.dump([dict(zip(cols, r)) for r in rows], sys.stdout, default=str, indent=1)
        print()
    else:
        print(format_table(cols, rows, args.max_rows))
    if not rows:
        from .see_cli import say_if_empty

        say_if_empty(args.run)
    return 0


def format_table(cols: list[str], rows: list[tuple], max_rows: int = 200) -> str:
    shown = rows if max_rows <= 0 else rows[:max_rows]

    def cell(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return f"{v:.6g}"
        s = str(v)
        return s if len(s) <= 60 else s[:57] + "..."

    cells = [[cell(v) for v in r] for r in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    numeric = [
        all(isinstance(r[i], (int, float)) or r[i] is None for r in shown) and shown
        for i in range(len(cols))
    ]

    def line(vals: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))
        ).rstrip()

    out = [line(list(cols)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    more = len(rows) - len(shown)
    out.append(
        f"({len(rows)} row{'s' if len(rows) != 1 else ''}"
        + (f", {more} not shown: --max-rows 0 shows all)" if more else ")")
    )
    return "\n".join(out)
