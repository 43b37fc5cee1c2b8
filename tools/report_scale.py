"""Measure ``pprobe report`` on a big synthetic run (docs/report.md's figures).

    python tools/report_scale.py --rows 10000000 --out /tmp/report-scale

1. Makes a run of about ``--rows`` op rows in stats mode: a NumPy program run through the
   bootstrap, ``--steps`` steps of small ufunc calls (eight ops in turn, so the heatmap has
   rows), a NaN produced in the last step.
2. Times ``pprobe report`` (DuckDB over the run's Parquet cache: the first report of a run
   also converts its shards, so it is run twice and both times are printed).
3. Opens the page in headless Chromium: the time of ``--dump-dom`` on the report against an
   empty page (the difference is the report's own load and layout), and the page's own
   ``performance.now()`` when its script ran (``data-ready``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import sys
import numpy as np
import pprobe

steps, per = int(sys.argv[1]), int(sys.argv[2])
a = np.linspace(0.5, 1.5, 16)
b = np.full(16, 2.0)
for s in range(steps):
    pprobe.step(s)
    scale = 1.0 + s / steps
    for i in range(per // 8):
        c = np.add(a, b)
        d = np.multiply(c, scale)
        e = np.sqrt(d)
        f = np.exp(e)
        g = np.subtract(f, a)
        h = np.maximum(g, 0.0)
        k = np.negative(h)
        m = np.abs(k)
    if s == steps - 1:
        with np.errstate(all="ignore"):
            np.log(a - a - 1.0)
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def open_time(browser: str, path: str, rounds: int = 3) -> tuple[float, str]:
    """Best wall time of ``chromium --headless --dump-dom`` on ``path``, and the DOM."""
    best, dom = float("inf"), ""
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--dump-dom",
                f"file://{os.path.abspath(path)}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        best = min(best, time.perf_counter() - t0)
        dom = p.stdout
    return best, dom


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--out", default="/tmp/pprobe-report-scale")
    ap.add_argument("--keep", action="store_true", help="reuse a run already in --out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    output = os.path.join(a.out, "runs")
    if not (a.keep and os.path.isdir(os.path.join(output, "latest"))):
        prog = os.path.join(a.out, "big.py")
        with open(prog, "w") as f:
            f.write(textwrap.dedent(PROGRAM))
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("PPROBE") or k == "PPROBE_CORE"
        }
        env.update(
            PYTHONPATH=os.path.join(REPO, "bootstrap"), PPROBE_OUTPUT=output, PPROBE_MODE="stats"
        )
        per = max(8, a.rows // a.steps)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, prog, str(a.steps), str(per)], env=env, check=True)
        print(f"run: {time.perf_counter() - t0:.1f} s")
    html = os.path.join(a.out, "report.html")
    for what in ("first report (converts the shards to the Parquet cache)", "second report"):
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-m", "pprobe", "report", output, "-o", html],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{what}: {time.perf_counter() - t0:.2f} s  {p.stdout.strip()}")
    print(f"report size: {os.path.getsize(html):,} bytes")
    browser = chromium()
    if browser is None:
        print("chromium not found: open time not measured")
        return 0
    empty = os.path.join(a.out, "empty.html")
    with open(empty, "w") as f:
        f.write("<!DOCTYPE html><html><body>empty</body></html>")
    t_empty, _ = open_time(browser, empty)
    t_rep, dom = open_time(browser, html)
    ready = re.search(r'data-ready="([0-9.]+)"', dom)
    print(
        f"chromium --dump-dom: empty page {t_empty:.2f} s, report {t_rep:.2f} s "
        f"(report's own share {t_rep - t_empty:.2f} s); "
        f"script ran at {ready.group(1) if ready else '?'} ms after navigation start"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
