"""GradientFlowHook's cost at frequency 1 on the torch MLP (docs/hooks-builtin.md), measured
inside each child: the default (``async_cpu="auto"``, which keeps the MLP's grads on the
training thread) and, with ``--only gradflow,gradflow_ref,gradflow_copy``, the statistics
thread's hand-offs by reference and by copy.

python -m bench.gradflow_cost [--children 3] [--quads 6] [--block 100] [--only gradflow]
                              [--emit zero|bench]

Method (as bench/ext_cost.py and bench/hooks_cost.py): a child (native engine, log mode, one
torch thread) installs the hook, then runs ``quads`` quads of ``block``-step blocks with the
hook in place ("on": the hook live, the bench's ``before_step`` / ``after_step`` emits around
every step as zero-code emission makes them, zero-code detection's step listeners and
optimizer pre-hook, GradientFlow's own step pre-hook on the optimizer) and with all of it
taken away ("off": its optimizer pre-hook removed too), in the order on-off-off-on,
off-on-on-off, ... (``mlp_torch.run_ab_quads``). Every block ends, inside its timing, with
the statistics of the hand-offs not computed yet (on another thread, as the
``pprobe-gradflow`` thread computes them), their verification and the tables' flush: the
statistics thread's work of an "on" block is in that block's process CPU. One quad gives one
ratio, (on + on) / (off + off) - 1, on the main thread's CPU clock (``time.thread_time``), on
the process's (every thread) and on the wall clock (meaningful on an idle machine only); the
figure is the median over every quad of every child, with a bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import os

from .harness import Variant, median, paired_ci, run_child

NAMES = {
    "gradflow": "GradientFlow f=1, the default (async_cpu='auto': on the training thread here)",
    "gradflow_ref": "GradientFlow f=1, the statistics thread, references (async_cpu=True)",
    "gradflow_copy": "GradientFlow f=1, the statistics thread, copies",
    "gradflow_sync": "GradientFlow f=1, on the training thread (async_cpu=False)",
    "gradflow_nothread": "GradientFlow f=1, no statistics thread (diagnosis)",
}
TARGET = 0.10


def _ci(ratios: list[float]) -> str:
    lo, hi = paired_ci(ratios, [0.0] * len(ratios))
    return f"{median(ratios) * 100:+.2f} % ({lo * 100:+.2f} to {hi * 100:+.2f} %)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gradflow_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--children", type=int, default=3, help="children per variant")
    p.add_argument("--quads", type=int, default=6, help="on-off-off-on quads per child")
    p.add_argument("--block", type=int, default=100, help="SGD steps per block")
    p.add_argument("--only", default="gradflow", help="variants, comma-separated")
    p.add_argument("--emit", default="zero", choices=("zero", "bench"),
                   help="who emits the points: zero-code detection from the optimizer's "
                        "steps (what a plain loop runs), or the loop at every step with the "
                        "points claimed (an integration's callback): bench.hooks_cost")  # fmt: skip
    a = p.parse_args(argv)
    import tempfile

    kinds = [k for k in a.only.split(",") if k]
    args = {"clock": "cpu", "torch_threads": 1, "warmup": 20, "block": a.block,
            "ab_quads": a.quads}  # fmt: skip
    got: dict[str, dict[str, list[float]]] = {
        k: {"main": [], "proc": [], "wall": [], "off_us": [], "dropped": []} for k in kinds
    }
    loads = [os.getloadavg()[0]]
    for c in range(a.children):
        for k in kinds[c % len(kinds) :] + kinds[: c % len(kinds)]:
            v = Variant(f"log + {k} alternating (native)", probe=True,
                        env={"PPROBE_MODE": "log"},
                        args={"hooks_ab": k, "hooks_emit": a.emit, **args},
                        needs_torch=True, engine="native")  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="pprobe-bench-") as out_dir:
                o = run_child("mlp_torch", {}, v, out_dir)
            if o.status != "ok":
                print(f"{v.name}: {o.status}: {o.error}")
                return 1
            if o.data.get("missed_blocks"):
                print(f"{v.name}: the hook did not take the last step of "
                      f"{o.data['missed_blocks']} 'on' blocks: not measured")  # fmt: skip
                return 1
            on, off = o.data["blocks"]["on"], o.data["blocks"]["off"]
            g = got[k]
            for q in range(len(on) // 2):
                b_on, b_off = on[2 * q : 2 * q + 2], off[2 * q : 2 * q + 2]
                for j, name in enumerate(("main", "proc", "wall")):
                    g[name].append(sum(b[j] for b in b_on) / sum(b[j] for b in b_off) - 1)
                g["off_us"].append(sum(b[0] for b in b_off) / (2 * a.block) * 1e6)
            g["dropped"].append(o.data.get("dropped_steps", 0))
            loads.append(os.getloadavg()[0])
    print(f"torch MLP, SGD steps on one torch thread, log mode, native engine, points emitted "
          f"by {'zero-code detection' if a.emit == 'zero' else 'the loop'}: {a.children} "
          f"children x {a.quads} quads of {a.block}-step blocks, hooks on / off in one child; "
          f"load average {min(loads):.2f}..{max(loads):.2f} (1 min)")  # fmt: skip
    for k in kinds:
        g = got[k]
        print(f"  {NAMES.get(k, k)} ({len(g['main'])} quads; off: "
              f"{median(g['off_us']):.0f} us/step of main-thread CPU; dropped steps "
              f"{int(sum(g['dropped']))}), target <= +{TARGET * 100:.0f} %:")  # fmt: skip
        print(f"    main thread CPU  {_ci(g['main'])}")
        print(f"    process CPU      {_ci(g['proc'])}")
        print(f"    wall             {_ci(g['wall'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
