"""Instructions per step of zero-code detection's step path with the built-in hooks, counted
by valgrind's callgrind: a figure that does not move with the machine's load.

python -m bench.hooks_instr [--only time_sys] [--steps 100] [--warmup 20] [--base REV]

On a shared VM the paired CPU-time benches (bench/gradflow_cost.py, bench/hooks_cost.py)
swing by several points between runs; a change of a few microseconds a step is below what
they resolve. This counts what the hooks' path executes instead. A child (native engine, log
mode, one torch thread) trains the torch MLP of bench/workloads/mlp_torch.py with the
variant's hooks added from code (zero-code emission, unclaimed) under
``valgrind --tool=callgrind``, collecting only inside the native core's optimizer pre-hook and
step-ending listener (``lc_pre``, ``lc_ending``: the idle steps' checks and bookkeeping, and
the Python emits of the steps the hooks fire at, which they call), from the end of
``--warmup`` steps on (the first step finds the services and starts the hooks). The report:
instructions per step in each, and in the calls they make to Python (the firing steps'
emits), per firing step. ``--base REV``: the same for another commit, built in a temporary
worktree, in the same run.

What it does not count: the work of other threads (the tables' flush, SystemMonitor's
sampler), and what a firing step costs the steps after it (caches). Counts are exact for a
given interpreter and torch build; compare runs of one machine image. Needs valgrind (a
Debian package); without it the bench says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from .harness import REPO

SCRIPT = """
import os
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 128), torch.randint(0, 10, (64,))) for _ in range(8)]
variant, steps, warmup = os.environ["HI_VARIANT"], int(os.environ["HI_STEPS"]), int(
    os.environ["HI_WARMUP"])
if variant != "none":
    from pprobe import hooks
    from pprobe.hooks import builtin

    f = {"time_sys": 10, "time_sys_idle": 10**9}[variant]
    hooks.add(builtin.TimeTrackingHook(frequency=f))
    hooks.add(builtin.SystemMonitorHook(frequency=f, interval=1.0))
for i in range(warmup + steps):
    if i == warmup:
        os.getsid(0)  # callgrind zeroes its counts here (--zero-before=getsid)
    xb, yb = data[i % len(data)]
    opt.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    opt.step()
"""

FUNCS = ("lc_pre", "lc_ending")
CALL = "PyObject_CallOneArg"


def _counts(tree: str, variant: str, steps: int, warmup: int) -> dict[str, tuple[int, int, int]]:
    """function -> (instructions, calls to Python it made, their instructions)"""
    with tempfile.TemporaryDirectory(prefix="pprobe-instr-") as tmp:
        out = os.path.join(tmp, "cg.out")
        script = os.path.join(tmp, "mlp.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
        env.update({"PYTHONPATH": os.pathsep.join([os.path.join(tree, "bootstrap"), tree]),
                    "PPROBE_MODE": "log", "PPROBE_CORE": "native",
                    "PPROBE_OUTPUT": os.path.join(tmp, "runs"), "HI_VARIANT": variant,
                    "HI_STEPS": str(steps), "HI_WARMUP": str(warmup),
                    "OMP_NUM_THREADS": "1"})  # fmt: skip
        argv = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                *[f"--toggle-collect={fn}" for fn in FUNCS], "--zero-before=getsid",
                f"--callgrind-out-file={out}", os.path.realpath(sys.executable),
                script]  # fmt: skip
        r = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the child failed ({r.returncode}): {r.stderr[-2000:]}")
        ann = subprocess.run(["callgrind_annotate", "--tree=calling", "--inclusive=yes", out],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    return parse(ann)


def parse(ann: str) -> dict[str, tuple[int, int, int]]:
    """``callgrind_annotate --tree=calling --inclusive=yes``'s text: for each of
    :data:`FUNCS`, (inclusive instructions, the calls it made to Python, their instructions)."""
    got: dict[str, tuple[int, int, int]] = {}
    num = r"([\d,]+) \([^)]*\)"
    for fn in FUNCS:
        m = re.search(rf"^\s*{num}\s+\*\s+\S*:{fn} ", ann, re.M)
        if not m:
            got[fn] = (0, 0, 0)
            continue
        block = ann[m.end() :].split("\n\n", 1)[0]
        c = re.search(rf"^\s*{num}\s+>\s+\S*:{CALL} \((\d+)x\)", block, re.M)
        got[fn] = (int(m.group(1).replace(",", "")), int(c.group(2)) if c else 0,
                   int(c.group(1).replace(",", "")) if c else 0)  # fmt: skip
    return got


def _tree_at(rev: str, where: str) -> str:
    """A worktree of ``rev`` with its native modules built in place."""
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", where, rev], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=where,
                   check=True, capture_output=True)  # fmt: skip
    return where


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hooks_instr",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--only", default="time_sys", help="variants: time_sys,time_sys_idle,none")
    p.add_argument("--steps", type=int, default=100, help="steps counted (after the warm-up)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--base", default=None, help="also count this commit (a git revision)")
    a = p.parse_args(argv)
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        print("valgrind is not installed (apt-get install valgrind): nothing measured")
        return 0
    trees = [("this tree", REPO)]
    tmp = tempfile.mkdtemp(prefix="pprobe-instr-base-")
    try:
        if a.base:
            trees.insert(0, (a.base, _tree_at(a.base, os.path.join(tmp, "base"))))
        print(f"torch MLP, log mode, native engine, zero-code hooks; callgrind instructions "
              f"inside {' and '.join(FUNCS)} over {a.steps} steps after {a.warmup}:")  # fmt: skip
        for variant in [v for v in a.only.split(",") if v]:
            for label, tree in trees:
                got = _counts(tree, variant, a.steps, a.warmup)
                total = sum(g[0] for g in got.values())
                parts = []
                for fn, (ins, calls, call_ins) in got.items():
                    part = f"{fn} {ins / a.steps:,.0f}"
                    if calls:
                        part += f" ({calls} Python calls, {call_ins / calls:,.0f} each)"
                    parts.append(part)
                head = f"  {variant:<14} {label:<12} {total / a.steps:8,.0f} per step: "
                print(head + "; ".join(parts))
    finally:
        if a.base:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force",
                            os.path.join(tmp, "base")], capture_output=True)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
