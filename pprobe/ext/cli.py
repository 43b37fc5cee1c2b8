"""``pprobe plugins``: the plugins available here and those a run loaded."""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plugins",
        help="list plugins: entry points of pprobe.plugins, PPROBE_PLUGINS, and a run's loaded",
    )
    p.add_argument("--run", help="run folder or output folder (default: np_op_dumps/latest)")
    p.add_argument("--format", choices=("table", "json"), default="table")


def rows(run: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """One row per plugin: name, where it comes from, loaded (pids of the run), and the
    run folder read (None when there is none)."""
    from .. import config
    from ..run import resolve_run_dir
    from . import plugins

    out: dict[str, dict[str, Any]] = {}
    for name, ep in plugins.entry_points().items():
        dist = getattr(getattr(ep, "dist", None), "name", None)
        out[name] = {"name": name, "source": f"entry point {ep.value}" + (f" ({dist})" if dist
                     else ""), "configured": False, "loaded_pids": []}  # fmt: skip
    try:
        configured = config.load().plugins
    except config.ConfigError:
        configured = ()
    for name in configured:
        row = out.setdefault(name, {"name": name, "source": "module", "configured": False,
                                    "loaded_pids": []})  # fmt: skip
        row["configured"] = True
    run_dir = None
    try:
        run_dir = resolve_run_dir(run)
    except FileNotFoundError:
        if run is not None:
            raise
    if run_dir is not None:
        for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "procs", "*.json"))):
            try:
                with open(path, "rb") as f:
                    proc = json.loads(f.read())
            except (OSError, ValueError):
                continue
            for p in proc.get("plugins") or []:
                key = p.get("spec") if p.get("spec") in out else p["name"]
                row = out.setdefault(key, {"name": key, "source": p.get("class"),
                                           "configured": False, "loaded_pids": []})  # fmt: skip
                if key != p["name"]:
                    row["name"] = f"{p['name']} ({key})"
                row["loaded_pids"].append(proc.get("pid"))
    return sorted(out.values(), key=lambda r: r["name"]), run_dir


def main(args: argparse.Namespace) -> int:
    try:
        got, run_dir = rows(args.run)
    except FileNotFoundError as e:
        print(f"pprobe plugins: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        json.dump({"run": run_dir, "plugins": got}, sys.stdout, indent=1)
        print()
        return 0
    from ..cli import format_table

    cols = ["name", "source", "configured", "loaded in run (pids)"]
    table = [
        (r["name"], r["source"], "yes" if r["configured"] else "no",
         ",".join(map(str, r["loaded_pids"])) or "-")
        for r in got
    ]  # fmt: skip
    text = format_table(cols, table, 0)
    if sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.table import Table

            t = Table(*cols, title=f"pprobe plugins (run: {run_dir or 'none'})")
            for r in table:
                t.add_row(*map(str, r))
            Console().print(t)
            return 0
        except ImportError:
            pass
    print(f"run: {run_dir or 'none'}")
    print(text)
    return 0


# ---------------------------------------------------------------------- pprobe query --live
def add_live_arguments(q: Any) -> None:
    """``pprobe query --live [--pid PID]``."""
    q.add_argument(
        "--live",
        action="store_true",
        help="the running program's run: says how fresh its flushed shards are",
    )
    q.add_argument("--pid", type=int, help="with --live: the run of this process")  # fmt: skip


class LiveError(Exception):
    """The live endpoint's answer was an error (bad SQL, refused SQL)."""


def live_run(args: argparse.Namespace) -> str | None:
    """For ``--live``: the run folder to read (``--pid``'s, else --run / latest), after one
    line on stderr saying whether it runs and how fresh its shards are. Raises
    FileNotFoundError (one line) when there is none."""
    if not getattr(args, "live", False):
        if getattr(args, "pid", None) is not None:
            raise FileNotFoundError("--pid goes with --live")
        return args.run  # type: ignore[no-any-return]
    from .. import runs
    from ..run import resolve_run_dir

    if args.pid is not None:
        run_dir = _run_of_pid(args.pid, args.run)
    else:
        run_dir = resolve_run_dir(args.run)
    st = runs.status(run_dir)
    if st.state == runs.RUNNING:  # a live endpoint of the process asked for, or of the run's
        infos = sorted(glob.glob(os.path.join(glob.escape(run_dir), "live", "*.json")))
        want = args.pid if args.pid is not None else st.pid
        for info in infos:
            if info.endswith(f"-{want}.json"):
                from . import endpoint

                try:
                    got = endpoint.ask(info, args.sql)
                except OSError as e:
                    print(f"pprobe query: live: the endpoint of pid {want} did not answer ({e}); "
                          "reading the flushed shards", file=sys.stderr)  # fmt: skip
                    break
                if "error" in got:
                    raise LiveError(got["error"])
                print(f"pprobe query: live: asked process {want} (its rows up to now)",
                      file=sys.stderr)  # fmt: skip
                return got["columns"], [tuple(r) for r in got["rows"]]  # type: ignore[return-value]
    newest = max((os.path.getmtime(p) for p in glob.glob(os.path.join(
        glob.escape(run_dir), "log", "**", "*.arrows"), recursive=True)), default=None)  # fmt: skip
    import time

    if st.state == runs.RUNNING:
        age = "no shard flushed yet" if newest is None else (
            f"newest shard written {time.time() - newest:.1f} s ago")  # fmt: skip
        name = os.path.basename(run_dir)
        print(
            f"pprobe query: live: run {name} is running (pid {st.pid}); no live endpoint: "
            f"reading the rows flushed so far ({age})",
            file=sys.stderr,
        )
    else:
        print(f"pprobe query: live: run {os.path.basename(run_dir)} is not running ({st.state}"
              f"{': ' + st.reason if st.reason else ''}); reading what it wrote",
              file=sys.stderr)  # fmt: skip
    return run_dir


def _run_of_pid(pid: int, where: str | None) -> str:
    from .. import config

    base = where or os.environ.get("PPROBE_OUTPUT") or config.Config().output
    for meta in sorted(glob.glob(os.path.join(glob.escape(base), "*", "procs", "*.json")),
                       key=os.path.getmtime, reverse=True):  # fmt: skip
        try:
            with open(meta, "rb") as f:
                if json.loads(f.read()).get("pid") == pid:
                    return os.path.realpath(os.path.dirname(os.path.dirname(meta)))
        except (OSError, ValueError):
            continue
    raise FileNotFoundError(f"no run of process {pid} under {base!r}")
