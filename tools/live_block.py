"""Measure whether a slow live query blocks the program (docs/extending.md).

Runs a probed program (log mode, PPROBE_LIVE=unix) that times each iteration of a small NumPy
loop, sends it a slow query through ``pprobe query --live`` halfway, and prints the program's
iteration-gap percentiles while the query ran and while it did not.

python tools/live_block.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = r"""
import json, os, sys, time
import numpy as np
a = np.ones(10)
gaps, marks = [], []
t_end = time.monotonic() + float(sys.argv[1])
last = time.perf_counter()
open(sys.argv[2], "w").close()
while time.monotonic() < t_end:
    np.add(a, 1)
    now = time.perf_counter()
    gaps.append((now, now - last))
    last = now
with open(sys.argv[3], "w") as f:
    json.dump(gaps, f)
"""
SLOW = "SELECT sum(a.range * b.range) AS s FROM range(20000) a, range(20000) b"


def main() -> None:
    d = tempfile.mkdtemp(prefix="pprobe-live-block-")
    prog, ready, out = (os.path.join(d, n) for n in ("prog.py", "ready", "gaps.json"))
    with open(prog, "w") as f:
        f.write(PROG)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bootstrap"), PPROBE_MODE="log",
               PPROBE_LIVE="unix", PPROBE_OUTPUT=os.path.join(d, "out"))  # fmt: skip
    p = subprocess.Popen(
        [sys.executable, prog, sys.argv[1] if len(sys.argv) > 1 else "20", ready, out], env=env
    )
    while not os.path.exists(ready):
        time.sleep(0.01)
    time.sleep(2)
    t0 = time.perf_counter()
    q = subprocess.run([sys.executable, "-m", "pprobe", "query", "--live", "--pid", str(p.pid),
                        "--run", os.path.join(d, "out"), SLOW], capture_output=True, text=True,
                       env=env)  # fmt: skip
    t1 = time.perf_counter()
    p.wait()
    gaps = json.load(open(out))
    # perf_counter is CLOCK_MONOTONIC for both processes on Linux: the windows compare.
    during = sorted(g for t, g in gaps if t0 + 0.3 <= t <= t1)
    other = sorted(g for t, g in gaps if t < t0 - 0.1)

    def pct(xs: list[float], q: float) -> str:
        return f"{xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6:.1f} us" if xs else "-"

    print(f"query: {t1 - t0:.2f} s, rc {q.returncode}, {q.stderr.strip()}")
    for name, xs in (("before the query", other), ("during the query", during)):
        print(
            f"{name}: {len(xs)} iterations, median {pct(xs, 0.5)}, p99 {pct(xs, 0.99)}, "
            f"max {pct(xs, 1.0)}"
        )


if __name__ == "__main__":
    main()
