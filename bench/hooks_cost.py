"""The built-in hooks' cost on the torch MLP (docs/hooks-builtin.md): TimeTracking +
SystemMonitor at frequency 10 and a no-op hook (the machinery).

python -m bench.hooks_cost [--children 4] [--pairs 30] [--block 100] [--only noop,time_sys]
                           [--emit zero,bench]

Method: measured inside each child, not between children. A child (native engine, log mode,
one torch thread) installs the variant's hooks, then runs ``pairs`` pairs of blocks of
``block`` SGD steps: one block with the hook machinery in place (the hooks live, zero-code
detection's step listeners and its optimizer pre-hook) and one with all of it taken away, in
alternating order (off-on, on-off, ...). ``--emit`` says who emits the points in the "on"
blocks: ``zero``, zero-code detection from the optimizer's steps, unclaimed (what a plain loop
with hooks from pprobe.toml runs: a point no hook fires at costs a ``calls_none`` check, no
emit; the issue's target is read from this one), and ``bench``, the loop's own
``before_step`` / ``after_step`` emits around every step with the points claimed (what a
framework integration's callback does). Each block is timed on the main thread's CPU
clock (``time.thread_time``). The figure is the median over every pair of ``on / off - 1``,
with a bootstrap 95 % interval over the pairs of all ``children`` children (run one variant
after the other, rotating the order per child round).

Why: between fresh children the same program's CPU time varies by several % on a shared
machine (placement, cache, other processes), so the former child-against-child ratios gave
intervals of +-6 % or more; adjacent blocks of one process share that state, and the
alternation cancels drift. SystemMonitor's sampler thread keeps running in the "off" blocks
too (stopping and restarting it per block would time its start-up): its own CPU, on its own
thread, is reported apart (``sampler`` CPU per second of the alternation).

GradientFlow is measured by bench/gradflow_cost.py (on-off-off-on blocks that also take its
own optimizer pre-hook away, and count its statistics thread's work in each block).
"""

from __future__ import annotations

import argparse

from .harness import Variant, median, paired_ci, run_child

TARGETS = {"time_sys": 0.02}
EMITS = {"zero": "zero-code", "bench": "every step"}
NAMES = {"noop": "no-op hook (the machinery)", "time_sys": "TimeTracking+SystemMonitor f=10"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hooks_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--children", type=int, default=4, help="children per variant")
    p.add_argument("--pairs", type=int, default=30, help="on/off block pairs per child")
    p.add_argument("--block", type=int, default=100, help="SGD steps per block")
    p.add_argument("--only", default="noop,time_sys", help="variants, comma-separated")
    p.add_argument("--emit", default="zero,bench",
                   help="who emits the points, comma-separated: zero (zero-code detection "
                        "from the optimizer's steps, what a plain loop runs) and bench (the "
                        "loop itself at every step, points claimed, as an integration's "
                        "callback does)")  # fmt: skip
    p.add_argument("--micro", action="store_true",
                   help="the machinery's direct cost per step instead (time.thread_time "
                        "over 20000 calls in one child per variant)")  # fmt: skip
    a = p.parse_args(argv)
    if a.micro:
        return micro(a)
    import os
    import tempfile

    kinds = [f"{k}@{e}" for e in a.emit.split(",") if e for k in a.only.split(",") if k]
    args = {"clock": "cpu", "torch_threads": 1, "warmup": 20, "block": a.block, "pairs": a.pairs}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    off_block: dict[str, list[float]] = {k: [] for k in kinds}
    sampler: dict[str, list[float]] = {k: [] for k in kinds}
    loads = [os.getloadavg()[0]]
    for c in range(a.children):
        for k in kinds[c % len(kinds) :] + kinds[: c % len(kinds)]:
            hook, emit = k.split("@")
            v = Variant(f"log + {k} (native)", probe=True, env={"PPROBE_MODE": "log"},
                        args={"hooks_ab": hook, "hooks_emit": emit}, needs_torch=True,
                        engine="native")  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="pprobe-bench-") as out_dir:
                o = run_child("mlp_torch", args, v, out_dir)
            if o.status != "ok":
                print(f"{v.name}: {o.status}: {o.error}")
                return 1
            d = o.data
            ratios[k] += [x / y - 1 for x, y in zip(d["ab_on_s"], d["ab_off_s"])]
            off_block[k] += d["ab_off_s"]
            if d.get("sampler_cpu_s") is not None and d.get("ab_wall_s"):
                sampler[k].append(d["sampler_cpu_s"] / d["ab_wall_s"])
            loads.append(os.getloadavg()[0])
    print(f"torch MLP, SGD steps on one torch thread, log mode, native engine: {a.children} "
          f"children x {a.pairs} pairs of {a.block}-step blocks, hooks on / off in one child; "
          f"load average {min(loads):.2f}..{max(loads):.2f} (1 min)")  # fmt: skip
    for k in kinds:
        r = ratios[k]
        lo, hi = paired_ci(r, [0.0] * len(r))
        hook, emit = k.split("@")
        line = (f"  {NAMES.get(hook, hook):<30} {EMITS[emit]:<10} main thread "
                f"{median(r) * 100:+.2f} % (95 % interval "
                f"{lo * 100:+.2f} to {hi * 100:+.2f} %, {len(r)} pairs; "
                f"off: {median(off_block[k]) / a.block * 1e3:.3f} ms/step)")  # fmt: skip
        if hook in TARGETS:
            line += f", target <= +{TARGETS[hook] * 100:.0f} %"
        if sampler[k]:
            line += f"; sampler thread {median(sampler[k]) * 100:.2f} % of a core"
        print(line)
    return 0


def micro(a: argparse.Namespace) -> int:
    """``--micro``: per step, on steps no hook fires at (and the emits on steps both fire
    at), in ``children`` children per variant: the median of each."""
    import tempfile

    kinds = [k for k in a.only.split(",") if k]
    got: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    for c in range(a.children):
        for k in kinds[c % len(kinds) :] + kinds[: c % len(kinds)]:
            v = Variant(f"log + {k} micro (native)", probe=True, env={"PPROBE_MODE": "log"},
                        args={"hooks_ab": k, "hooks_micro": True}, needs_torch=True,
                        engine="native")  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="pprobe-bench-") as out_dir:
                o = run_child("mlp_torch", {"torch_threads": 1, "warmup": 20}, v, out_dir)
            if o.status != "ok":
                print(f"{v.name}: {o.status}: {o.error}")
                return 1
            for name, us in o.data["micro_us"].items():
                got[k].setdefault(name, []).append(us)
    print(f"the hook machinery's direct cost, us per step (time.thread_time over 20000 calls, "
          f"median of {a.children} children):")  # fmt: skip
    labels = {"emits": "the bench's two emits, steps no hook fires at",
              "zero_code": "zero-code pre-hook + step listeners, unclaimed",
              "zero_code_claimed": "the same, points claimed",
              "emits_firing": "the bench's two emits, steps the hooks fire at"}  # fmt: skip
    for k in kinds:
        print(f"  {NAMES.get(k, k)}:")
        for name, label in labels.items():
            print(f"    {label:<48} {median(got[k][name]):6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
