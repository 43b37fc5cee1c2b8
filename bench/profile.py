"""``python -m bench.profile WORKLOAD [--mode M] [--args JSON]``: where a probed child spends time.

Runs one benchmark child program (bench/workloads/WORKLOAD.py) under pprobe's bootstrap and
``py-spy record`` (every thread, pprobe's writer included), then prints the lines and the
functions with the most samples: own time (the frame on top) and inclusive time.

    python -m bench.profile micro_numpy --mode log --args '{"n": 200000, "reps": 3}'
    python -m bench.profile mlp_torch --mode stats
    python -m bench.profile mlp_torch --mode log --env PPROBE_TORCH_LEVEL=aten
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

from .harness import WORKLOADS, Variant, child_env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("workload", help="a child program in bench/workloads (e.g. mlp_torch)")
    p.add_argument("--mode", default="log", help="PPROBE_MODE, or 'none' for no probe")
    p.add_argument("--env", action="append", default=[], help="extra VAR=value for the child")
    p.add_argument("--args", default="{}", help="JSON arguments for the child")
    p.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--raw", help="keep py-spy's raw (collapsed) output here")
    p.add_argument(
        "--focus",
        action="append",
        default=[],
        help="count only stacks with a frame containing this text (e.g. 'step (', 'Writer.'): "
        "leaves out start-up imports",
    )
    a = p.parse_args(argv)
    if shutil.which("py-spy") is None:
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    env_extra = dict(kv.split("=", 1) for kv in a.env)
    probe = a.mode != "none"
    if probe:
        env_extra["PPROBE_MODE"] = a.mode
    v = Variant("profile", probe=probe, env=env_extra)
    out_dir = tempfile.mkdtemp(prefix="pprobe-bench-profile-")
    raw = a.raw or os.path.join(out_dir, "profile.txt")
    try:
        cmd = ["py-spy", "record", "-r", str(a.rate), "-f", "raw", "-o", raw, "--"]
        cmd += [sys.executable, os.path.join(WORKLOADS, a.workload + ".py"), a.args]
        env = child_env(v, os.path.join(out_dir, "run") if probe else None)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(raw):
            print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
            return 1
        for line in r.stdout.splitlines():
            if line.startswith("BENCH_RESULT "):
                res = json.loads(line.split(" ", 1)[1])
                res.pop("probe", None)
                print("child result:", json.dumps(res)[:400])
        print(summarize(raw, a.top, a.focus))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


def summarize(raw: str, top: int = 30, focus: list[str] | None = None) -> str:
    """Own samples per line, inclusive samples per function, share of each thread.

    With ``focus``, only stacks that have a frame containing one of those texts count.
    """
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(n)
            total += count
            frames = stack.split(";")
            if focus and not any(t in fr for fr in frames for t in focus):
                continue
            threads[frames[0]] += count
            own[frames[-1]] += count
            for fn in {
                fr.split(" (")[0] + " (" + fr.split(" (")[-1].split(":")[0] + ")"
                for fr in frames[1:]
            }:
                incl[fn] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples"]
    lines.append("threads:")
    lines += [f"  {n / total:6.1%}  {t}" for t, n in threads.most_common(5)]
    lines.append("own time by line:")
    lines += [f"  {n / total:6.1%}  {fr}" for fr, n in own.most_common(top)]
    lines.append("inclusive time by function:")
    lines += [f"  {n / total:6.1%}  {fr}" for fr, n in incl.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
