"""``pprobe nan [RUN]``: where a NaN or inf was born (the analysis is :mod:`pprobe.nan`).

Rich text on a terminal, plain text when piped, ``--format json`` for scripts. Exit status:
0 when no NaN or inf was born (expected infs of the allowlist do not count), 1 when one was,
2 for a usage error or a run that cannot be checked (log mode, no run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
#: Origins past each process's first listed briefly, at most this many (``--max``).
MAX_FURTHER = 10


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "nan",
        help="find the op where a NaN or inf was born (per rank; stats or dump mode)",
        description="Find, per process and rank, the first op that produced a NaN or inf "
        "from finite inputs, the ops that carried it on, and which rank went bad first. "
        "Exit status: 0 none, 1 found, 2 usage error or a run without statistics. "
        "Docs: docs/nan.md",
    )
    p.add_argument(
        "run",
        nargs="?",
        help="run folder, output folder, or a run's name (default: the latest run)",
    )
    p.add_argument("--no-inf", action="store_true", help="count NaN only (infs are not origins)")
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PATTERN",
        help="more ops whose inf outputs are expected: glob over op names, optionally "
        "ending in :mask (only on a 0/1 mask); repeat or comma-separate. Also "
        "PPROBE_NAN_ALLOW / nan_allow in pprobe.toml",
    )
    p.add_argument(
        "--no-default-allow",
        action="store_true",
        help="drop the built-in allowlist (fills, masked_fill, where, log of a mask)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--max",
        type=int,
        default=MAX_FURTHER,
        metavar="N",
        help=f"further origins listed (default {MAX_FURTHER}; 0: all)",
    )


def main(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .nan import NanError, nan_origins

    try:
        report = nan_origins(
            args.run,
            inf=not args.no_inf,
            allow=args.allow,
            default_allow=not args.no_default_allow,
        )
    except (NanError, ConfigError, FileNotFoundError, NotADirectoryError) as e:
        print(f"pprobe nan: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a query error on a damaged run: one line, not a traceback
        from .query import QueryError

        if isinstance(e, QueryError):
            print(f"pprobe nan: the run's log cannot be read: {str(e).splitlines()[0]}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        raise
    try:
        if args.format == "json":
            json.dump(report, sys.stdout, indent=1, default=str)
            print()
        else:
            render(report, max_further=args.max)
        sys.stdout.flush()
    except BrokenPipeError:  # `pprobe nan | head`: the reader left; the verdict stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_FOUND if found(report) else EXIT_CLEAN


def found(report: dict[str, Any]) -> bool:
    """Whether the run holds a NaN/inf that is not expected: an origin, or a value received."""
    return bool(report["origins"]) or any(p.get("received") for p in report["processes"])


# ------------------------------------------------------------------ text
def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _who(d: dict[str, Any]) -> str:
    rank = d.get("rank")
    return (f"rank {rank} " if rank is not None else "") + f"pid {d['pid']}"


def _where(d: dict[str, Any]) -> str:
    step = d.get("step")
    return (f"step {step}, " if step is not None else "") + f"seq {d['seq']}"


def _clock(ts_ns: int) -> str:
    t = ts_ns / 1e9
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(ts_ns % 10**9) // 1000:06d} UTC"


def _tensor(t: dict[str, Any]) -> str:
    shape = "[" + ", ".join(str(n) for n in t["shape"]) + "]" if t["shape"] is not None else "?"
    s = f"{t['idx']:<3} {t['dtype'] or '?'}{shape}"
    if t["nan"] is None:
        return s + f"  (no statistics{': ' + t['note'] if t['note'] else ''})"
    s += (
        f"  min {_g(t['min'])}  max {_g(t['max'])}  mean {_g(t['mean'])}  std {_g(t['std'])}"
        f"  nan {t['nan']}  inf {t['inf']}"
    )
    if t["dump_path"]:
        s += f"  {t['dump_path']}"
    elif t["note"]:
        s += f"  ({t['note']})"
    return s


def _short(caller: str | None) -> str:
    if not caller:
        return "?"
    path, _, line = caller.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def render(report: dict[str, Any], max_further: int = MAX_FURTHER, console: Any = None) -> None:
    """The report as text: rich styles on a terminal, plain text when piped."""
    from rich.console import Console
    from rich.text import Text

    con = console or Console(highlight=False, soft_wrap=True)

    def say(*parts: str | tuple[str, str]) -> None:
        con.print(Text.assemble(*parts))

    procs = report["processes"]
    what = "NaN and inf" if report["count_inf"] else "NaN only (--no-inf)"
    calls = sum(p["ops"] for p in procs)
    say(
        ("pprobe nan: ", "bold"),
        report["run"],
        f"  ({report['mode'] or '?'} mode; {what}; {len(procs)} process"
        f"{'es' if len(procs) != 1 else ''}, {calls} calls)",
    )
    for n in report["notes"]:
        say(("note: ", "yellow"), n)
    origins = report["origins"]
    firsts: dict[tuple[str, int], dict[str, Any]] = {}
    for o in origins:
        firsts.setdefault((o["host"], o["pid"]), o)
    for o in sorted(firsts.values(), key=lambda o: (o["ts_ns"], o["seq"])):
        say()
        _origin(say, o, report["count_inf"])
    received = [p for p in procs if p.get("received")]
    if not origins and not received:
        say()
        allowed = report["allowed_ops"]
        say(
            ("No NaN or inf was born in this run", "bold green"),
            f": {calls} calls in {len(procs)} process{'es' if len(procs) != 1 else ''} checked.",
        )
        if allowed:
            say(
                "Expected infs (allowlist) came from: "
                + ", ".join(f"{op} x{n}" for op, n in sorted(allowed.items()))
            )
        return
    further = [o for o in origins if firsts[(o["host"], o["pid"])] is not o]
    say()
    if not origins:
        say(
            ("No origin in the log", "bold red"),
            ": a non-finite value arrived through a collective from a process that recorded "
            "no origin (not probed, in log mode, or outside the capture).",
        )
    if further:
        say(("Further independent origins", "bold"), f" ({len(further)}):")
        shown = further if max_further <= 0 else further[:max_further]
        for o in shown:
            say(
                f"  {_who(o):<16} {_where(o):<20} ",
                (o["op"], "red"),
                f"  at {_short(o['caller'])}",
                "  (from outside the log)" if o["how"] == "entered" else "",
            )
        if len(shown) < len(further):
            say(f"  ... {len(further) - len(shown)} more (--max 0 lists all, --format json)")
    else:
        say("Further independent origins: none.")
    if len(procs) > 1 or any(p["rank"] is not None for p in procs):
        _ranks(say, report)


def _origin(say: Any, o: dict[str, Any], count_inf: bool) -> None:
    bad = " and ".join(
        f"{n} {kind}" for n, kind in ((o["nan"], "NaN"), (o["inf"], "inf")) if n
    ) or "a non-finite value"  # fmt: skip
    if o["how"] == "entered":
        head = (
            f" was the first call to see {bad}: its input already held it (made by code "
            "pprobe does not record: data loading, indexing, Python scalars, a backward pass "
            "without the aten level, a call left out)"
        )
    elif count_inf:
        head = f" produced {bad} from finite inputs"
    else:
        held = sum(t["inf"] or 0 for t in o["inputs"])
        head = f" produced {bad} from inputs without NaN" + (
            f" (they held {held} inf: see it without --no-inf)" if held else ""
        )
    say(("ORIGIN  ", "bold red"), (o["op"], "bold"), head)
    say(
        f"  {_who(o)}, {_where(o)}, {_clock(o['ts_ns'])}"
        + (f", {o['phase']}" if o["phase"] else "")
    )
    say("  at      ", (o["caller"] or "?", "cyan"), f" in {o['caller_function'] or '?'}")
    if o["source"]:
        say("          ", (o["source"], "bright_white"))
    say(f"  module  {o['module_path'] or '-'}")
    if o.get("within"):
        say(f"  within  {' < '.join(o['within'])}")
    if o["args"]:
        say(f"  args    {o['args']}")
    for role, ts in (("input ", o["inputs"]), ("output", o["outputs"])):
        for t in ts:
            style = "red" if t["nan"] or t["inf"] else ""
            say(f"  {role}  ", (_tensor(t), style))
        if not ts:
            say(f"  {role}  (no arrays)")
    ch = o["chain"]
    if ch["ops"]:
        steps = ch["steps"]
        span = (
            f"step {steps[0]}" if steps and steps[0] == steps[1]
            else f"steps {steps[0]}-{steps[1]}" if steps else ""
        )  # fmt: skip
        last = ch["last"]
        say(
            f"  then    carried on by {ch['ops']} call{'s' if ch['ops'] != 1 else ''}"
            + (f" ({span})" if span else "")
            + f", the last {last['op']} ({_where(last)}, {_short(last['caller'])})"
        )
        if ch["first_nan"] and not o["nan"]:
            fn = ch["first_nan"]
            say(
                "          it became NaN at ",
                (fn["op"], "bold"),
                f" ({_where(fn)}, {_short(fn['caller'])})",
            )
        if ch["collectives"]:
            say(f"          {ch['collectives']} collective(s) sent it to other ranks")
    else:
        say("  then    no later recorded call carried it on")


def _ranks(say: Any, report: dict[str, Any]) -> None:
    first = report["first"]
    procs = report["processes"]
    say()
    if first is not None:
        say(
            ("First to go bad: ", "bold"),
            (_who(first), "bold red"),
            f", {first['op']} at {_where(first)}, {_clock(first['ts_ns'])}",
        )
    t0 = first["ts_ns"] if first else None
    for p in procs:
        st = p["state"]
        line = f"  {_who(p):<16} {p['ops']:>8} calls  "
        if st in ("origin", "received") and p["origins"]:
            mine = [o for o in report["origins"] if (o["host"], o["pid"]) == (p["host"], p["pid"])]
            o = mine[0]
            dt = (o["ts_ns"] - t0) / 1e6 if t0 is not None else 0.0
            text = f"origin {o['op']} ({_where(o)}), {dt:+.3f} ms"
            if p["origins"] > 1:
                text += f"; {p['origins'] - 1} more"
            if st == "received":
                r = p["received"]
                text = f"received through {r['op']} ({_where(r)}) first; then " + text
            say(line, (text, "red"))
        elif st == "received":
            r = p["received"]
            dt = (r["ts_ns"] - t0) / 1e6 if t0 is not None else 0.0
            say(line, (f"received it through {r['op']} ({_where(r)}), {dt:+.3f} ms", "yellow"))
        elif st == "allowed":
            say(line, ("clean (expected infs only)", "green"))
        else:
            say(line, ("clean", "green"))
