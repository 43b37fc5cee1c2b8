"""The cost of call stacks (PPROBE_STACK_DEPTH): ns per recorded NumPy call, log mode, for
stack depths 1 (the call site only), 3 (the default) and 8, under both engines.

python -m bench.stack_cost [--rounds 5] [--calls 50000]

Each measure is a child process run through the bootstrap: it times ``calls`` calls of
``np.add`` on 10-element arrays made from a function four program frames deep (so a deeper
stack has frames to walk). Variants are interleaved round by round; the figure is the median
ns per call, and the difference to depth 1 the median of the rounds' paired differences.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
import numpy as np
n = int(sys.argv[1])
a = np.ones(10)
def f4():
    t = time.perf_counter()
    for _ in range(n):
        np.add(a, a)
    return time.perf_counter() - t
def f3(): return f4()
def f2(): return f3()
def f1(): return f2()
f1()  # warm-up: sites and stacks interned, caches filled
print(f1() / n * 1e9)
"""


def measure(engine: str, depth: int, calls: int, out: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
    env.update(PYTHONPATH=str(REPO / "bootstrap"), PPROBE_MODE="log", PPROBE_OUTPUT=out,
               PPROBE_CORE=engine, PPROBE_STACK_DEPTH=str(depth),
               PPROBE_SUMMARY_LINE="off")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", CHILD, str(calls)], env=env, capture_output=True,
                       text=True, check=True)  # fmt: skip
    return float(p.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.stack_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=50000)
    a = p.parse_args(argv)
    from .harness import median

    variants = [(e, d) for e in ("native", "python") for d in (1, 3, 8)]
    got: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(a.rounds):
            for v in variants:
                got[v].append(measure(v[0], v[1], a.calls, out))
    print(f"np.add on 10 elements, log mode, 4 program frames deep, {a.rounds} rounds of "
          f"{a.calls} calls (ns per call):")  # fmt: skip
    for e, d in variants:
        base = got[(e, 1)]
        diff = median([x - b for x, b in zip(got[(e, d)], base)])
        print(f"  {e:6}  depth {d}:  median {median(got[(e, d)]):7.0f} ns   vs depth 1: "
              f"{diff:+6.0f} ns")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
