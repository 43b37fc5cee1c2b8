"""The log writer's CPU, flush by flush, on the torch MLP in log mode (issue #9: the first
flush), and the size of the shards it leaves.

python -m bench.writer_flush [--rounds 5] [--steps 200] [--tree DIR ...] [--writer W ...]
                             [--variant TREE,WRITER ...]

Each measure is a child process run through the bootstrap of a pprobe tree (``--tree``,
default this checkout; give another checkout, e.g. the main branch's, to compare before and
after) with ``PPROBE_MODE=log`` and ``PPROBE_LOG_WRITER`` set to each ``--writer`` (``-``:
unset, for a tree that has no such setting). The child wraps the writer's ``flush`` and reads
the thread's CPU clock (``time.thread_time``) around each call, imports included: the first
flush with rows pays the writer's one-time work. It reports the first flush's CPU, the CPU
per op row of the later flushes (writer thread and the final flush at exit alike), the
process CPU of the 200 steps plus the probe's stop (the figure ``python -m bench`` times),
whether pyarrow was imported, and the bytes of the log/ shards. Variants are interleaved
round by round; the figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys, threading, time
from pprobe.session import Session

s = Session.active
w = s.writer
real = w.flush
flushes = []  # (rows, thread CPU s, on the writer thread, seconds since the timed loop began)
T0 = [None]


def flush():
    r0, c0 = w.rows_written, time.thread_time()
    real()
    dr = w.rows_written - r0
    if dr:
        at = None if T0[0] is None else time.perf_counter() - T0[0]
        flushes.append((dr, time.thread_time() - c0, threading.current_thread() is w.thread, at))


w.flush = flush
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)  # as python -m bench does (spinning workers burn CPU)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 128), torch.randint(0, 10, (64,))) for _ in range(8)]


def step(i):
    xb, yb = data[i % len(data)]
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    return loss


for i in range(5):
    step(i)
steps = int(sys.argv[1])
p0 = time.process_time()
T0[0] = time.perf_counter()
for i in range(steps):
    step(i)
s.stop()
cpu = time.process_time() - p0
log = os.path.join(s.run.dir, "log")
size = sum(os.path.getsize(os.path.join(log, n)) for n in os.listdir(log))
with open(os.path.join(s.run.dir, "meta.json")) as f:
    core = json.load(f).get("core")
print("RESULT " + json.dumps({"flushes": flushes, "loop_finish_cpu_s": cpu, "log_bytes": size,
                              "pyarrow": "pyarrow" in sys.modules, "core": core}))
"""


def measure(tree: str, writer: str, steps: int, out: str, flush_s: float = 60.0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
    env.update(PYTHONPATH=os.pathsep.join([os.path.join(tree, "bootstrap"), tree]),
               PPROBE_MODE="log", PPROBE_OUTPUT=out, PPROBE_SUMMARY_LINE="off",
               PPROBE_FLUSH_SECONDS=str(flush_s),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")  # fmt: skip
    if writer != "-":
        env["PPROBE_LOG_WRITER"] = writer
    p = subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True,
                       text=True, check=True)  # fmt: skip
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    fl = r["flushes"]
    r["first_flush_ms"] = fl[0][1] * 1e3 if fl else None
    rows, cpu = sum(f[0] for f in fl[1:]), sum(f[1] for f in fl[1:])
    r["later_us_per_row"] = cpu / rows * 1e6 if rows else None
    r["rows"] = sum(f[0] for f in fl)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.writer_flush", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument(
        "--flush-seconds",
        type=float,
        default=60.0,
        help="PPROBE_FLUSH_SECONDS (default 60: the first flush with rows is the stop's, "
        "inside the timed part, as on a quiet machine where torch imports in under the "
        "default 1 s and the first flush falls in the loop)",
    )
    p.add_argument("--tree", action="append", help="a pprobe checkout (default: this one)")
    p.add_argument("--writer", action="append", help="PPROBE_LOG_WRITER values (- : unset)")
    p.add_argument(
        "--variant",
        action="append",
        metavar="TREE,WRITER",
        help="a (tree, writer) pair; replaces the --tree x --writer product",
    )
    p.add_argument("--json", help="write every run's figures to this file")
    a = p.parse_args(argv)
    from .harness import median, paired_ci, paired_delta, rotate_rounds

    trees = a.tree or [str(REPO)]
    writers = a.writer or ["auto", "pyarrow"]
    variants = [(t, w) for t in trees for w in writers]
    if a.variant:
        variants = [tuple(v.rsplit(",", 1)) for v in a.variant]  # type: ignore[misc]
    runs = rotate_rounds(variants, a.rounds,
                         lambda v, out: measure(v[0], v[1], a.steps, out, a.flush_seconds),
                         "pprobe-writer-flush-")  # fmt: skip
    print(f"load average: {os.getloadavg()}, PPROBE_FLUSH_SECONDS={a.flush_seconds}")
    print("tree | writer | first flush ms | later us/row | loop+finish CPU s | log bytes | pyarrow")

    def med(rs: list[dict], key: str) -> float | None:
        xs = [x[key] for x in rs if x[key] is not None]
        return median(xs) if xs else None

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for (t, w), rs in runs.items():
        first, later = med(rs, "first_flush_ms"), med(rs, "later_us_per_row")
        cpu, size = med(rs, "loop_finish_cpu_s"), med(rs, "log_bytes")
        rows = med(rs, "rows")
        pa = {x["pyarrow"] for x in rs}
        print(
            f"{t} | {w} | {f(first, '.1f')} | {f(later, '.2f')} | {f(cpu, '.3f')} | "
            f"{f(size, '.0f')} ({f(rows, '.0f')} op rows) | {pa}"
        )
    base = variants[0]
    b_cpu = [x["loop_finish_cpu_s"] for x in runs[base]]
    for v in variants[1:]:
        d_cpu = [x["loop_finish_cpu_s"] for x in runs[v]]
        lo, hi = paired_ci(d_cpu, b_cpu)
        print(
            f"{v[0]} | {v[1]} - {base[0]} | {base[1]}: loop+finish CPU "
            f"{paired_delta(d_cpu, b_cpu):+.3f} s (95% CI {lo:+.3f} .. {hi:+.3f})"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{t}|{w}": rs for (t, w), rs in runs.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
