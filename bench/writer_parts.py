"""The log writer's CPU per op row, part by part, on a program's rows (issue #9: the writer's
CPU per row <= 1 us).

python -m bench.writer_parts [--rounds 8] [--workload scipy|numpy|torch] [--iters N]
                             [--tree DIR ...] [--engine native|python] [--json FILE]

Each measure is a child process run through the bootstrap of a pprobe tree (``--tree``,
default this checkout; give another checkout with its extensions built in place, e.g. an
earlier commit's ``git worktree``, to compare before and after) in log mode. The child wraps
the writer's flush and its helpers (``Writer._to_batches``, ``_args``, ``_shapes``, the
string columns: ``_Strings.gather``, and ``arrowipc.dict_indices`` where the tree has it;
``record_columns``, the fixed columns' one call, where the tree has it (the dictionary
columns it makes are not in ``strings`` then); ``_desc_columns``, the desc records' columns,
shapes and checks in one native pass, where the tree has it (``record_columns`` and
``shapes`` then hold only the tensors batch's constant columns, or a general batch's:
statistics, dumps, notes, deep shapes); ``_op_table``, ``_site_table``,
``_stacks_batch``, ``_write``) and sums the calling thread's CPU clock
(``time.thread_time``) spent in each, then divides by the op rows written. The flushes run
as in a real run (``PPROBE_FLUSH_SECONDS`` at its default, batches of
``PPROBE_FLUSH_ROWS``), beside the program's thread.

Workloads: ``scipy``, the SciPy loop of ``python -m bench`` (``scipy.linalg.solve`` and
``scipy.signal.lfilter``: rows with arguments, several ranks, ~25 op rows an iteration);
``numpy``, ``np.add`` on 10 elements (one op, every column constant in a batch); ``torch``,
the torch MLP of ``python -m bench`` (SGD steps of a 128-256-256-10 MLP, api level: ~13 op
rows a step with three tensors each and arguments). Trees are
interleaved round by round; the figures are medians over the rounds. Parts nest
(``_to_batches`` holds ``_args``, ``_shapes``, ``strings``...; ``flush`` holds all).
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
import collections, json, sys, time
from pprobe.session import Session
from pprobe import writer as W

w = Session.active.writer
acc = collections.Counter()


def wrap(obj, name, label):
    f = getattr(obj, name)

    def g(*a, **k):
        c = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.thread_time() - c

    setattr(obj, name, g)


# the string columns: utf8 columns gathered from string ids, or (trees since dictionary
# encoding) the ids as dictionary indices
wrap(W._Strings, "gather", "strings")
if hasattr(W.A, "dict_indices"):
    wrap(W.A, "dict_indices", "strings")
for obj, name in ((W.Writer, "_flush"), (W.Writer, "_to_batches"), (W.Writer, "_args"),
                  (W, "_shapes"), (W.Writer, "_op_table"),
                  (W.Writer, "_site_table"), (W.Writer, "_stacks_batch"),
                  (W.Writer, "_write")):
    wrap(obj, name, name.lstrip("_"))
if hasattr(W, "record_columns"):  # trees since the fixed columns' one call
    wrap(W, "record_columns", "record_columns")
if hasattr(W, "_desc_columns"):  # trees since the desc records' one pass
    wrap(W, "_desc_columns", "desc_columns")
workload, iters = sys.argv[1], int(sys.argv[2])
import numpy as np

if workload == "scipy":
    import scipy.linalg, scipy.signal

    rng = np.random.default_rng(0)
    A = rng.standard_normal((64, 64)) + 64 * np.eye(64)
    rhs, sig = rng.standard_normal(64), rng.standard_normal(1024)
    bc, ac = scipy.signal.butter(4, 0.2)
    for _ in range(iters):
        scipy.linalg.solve(A, rhs)
        scipy.signal.lfilter(bc, ac, sig)
elif workload == "torch":
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))  # fmt: skip
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    for _ in range(iters):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
else:
    a, b = np.arange(10.0), np.ones(10)
    for _ in range(iters):
        np.add(a, b)
w.flush()
n = w.rows_written
print("RESULT " + json.dumps({"rows": n, "us_per_row": {k: v / n * 1e6 for k, v in acc.items()}}))
"""

PARTS = ("flush", "to_batches", "record_columns", "desc_columns", "args", "shapes", "strings",
         "op_table", "site_table", "stacks_batch", "write")  # fmt: skip


def measure(tree: str, workload: str, iters: int, engine: str, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
    env.update(PYTHONPATH=os.pathsep.join([os.path.join(tree, "bootstrap"), tree]),
               PPROBE_MODE="log", PPROBE_OUTPUT=out, PPROBE_SUMMARY_LINE="off",
               PPROBE_CORE=engine, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", CHILD, workload, str(iters)], env=env,
                       capture_output=True, text=True, check=True)  # fmt: skip
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.writer_parts", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--workload", choices=("scipy", "numpy", "torch"), default="scipy")
    p.add_argument(
        "--iters", type=int, help="default: 4,050 (scipy), 300,000 (numpy), 2,000 (torch)"
    )
    p.add_argument("--tree", action="append", help="a pprobe checkout (default: this one)")
    p.add_argument("--engine", choices=("native", "python"), default="native")
    p.add_argument("--json", help="write every run's figures to this file")
    a = p.parse_args(argv)
    from .harness import median, rotate_rounds

    iters = a.iters or {"scipy": 4050, "numpy": 300_000, "torch": 2000}[a.workload]
    trees = a.tree or [str(REPO)]
    runs = rotate_rounds(trees, a.rounds,
                         lambda t, out: measure(t, a.workload, iters, a.engine, out),
                         "pprobe-writer-parts-")  # fmt: skip
    print(f"load average: {os.getloadavg()}, {a.workload}, {iters} iterations, {a.engine} engine")
    print("writer CPU per op row (us), median of the rounds")
    print("tree | op rows | " + " | ".join(PARTS))
    for t, rs in runs.items():
        cells = [format(median([x["us_per_row"].get(part, 0.0) for x in rs]), ".3f")
                 for part in PARTS]  # fmt: skip
        print(f"{t} | {median([x['rows'] for x in rs]):.0f} | " + " | ".join(cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
