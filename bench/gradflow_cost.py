"""GradientFlowHook's CPU hand-off on the torch MLP (docs/hooks-builtin.md): log mode without
hooks, with GradientFlow at frequency 1 handing the grads over by reference (the default,
``handoff="auto"``), and with it copying them every step (``handoff="copy"``, the hand-off
before references).

python -m bench.gradflow_cost [--rounds 9] [--steps 200]

Fresh children on the native engine, interleaved round by round; the figure is the median
over rounds of each variant's ratio to the run without hooks in the same round, on the main
thread's CPU time of the timed loop (``time.thread_time``), with a bootstrap 95 % interval;
the process CPU (the statistics thread included) is given beside it. The reference variant
is also given against the copying one, paired round by round.
"""

from __future__ import annotations

import argparse
import os

from .harness import Variant, interleave, median, paired_ci


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gradflow_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args(argv)
    env = {"PPROBE_MODE": "log"}

    def variant(name: str, hooks: str | None) -> Variant:
        return Variant(name, probe=True, env=dict(env), args={"hooks": hooks} if hooks else {},
                       needs_torch=True, engine="native")  # fmt: skip

    base = variant("log (native)", None)
    ref = variant("log + gradflow by reference (native)", "gradflow")
    copy = variant("log + gradflow copying (native)", "gradflow_copy")
    load0 = os.getloadavg()
    runs = interleave("mlp_torch", [base, ref, copy], a.rounds,
                      {"clock": "cpu", "torch_threads": 1, "steps": a.steps})  # fmt: skip
    load1 = os.getloadavg()
    for vr in runs.values():
        if vr.status != "ok":
            print(f"{vr.variant.name}: {vr.status}: {vr.runs[0].error}")
            return 1

    def col(v: Variant, key: str) -> list[float]:
        return [float(o.data[key]) for o in runs[v.name].runs]

    print(f"torch MLP, {a.steps} SGD steps, log mode, native engine, {a.rounds} rounds "
          f"(load average {load0[0]:.2f} before, {load1[0]:.2f} after):")  # fmt: skip
    b_main, b_proc = col(base, "loop_thread_s"), col(base, "loop_s")
    print(f"  {'no hooks':<30} main thread {median(b_main):.3f} s, process {median(b_proc):.3f} s")
    for v, name in ((ref, "GradientFlow f=1, references"), (copy, "GradientFlow f=1, copies")):
        main_r = [x / y - 1 for x, y in zip(col(v, "loop_thread_s"), b_main)]
        proc_r = [x / y - 1 for x, y in zip(col(v, "loop_s"), b_proc)]
        lo, hi = paired_ci(main_r, [0.0] * len(main_r))
        print(f"  {name:<30} main thread {median(main_r) * 100:+.2f} % (95 % interval "
              f"{lo * 100:+.2f} to {hi * 100:+.2f} %), target <= +10 %; "
              f"process CPU {median(proc_r) * 100:+.2f} %")  # fmt: skip
    d = [x / y - 1 for x, y in zip(col(ref, "loop_thread_s"), col(copy, "loop_thread_s"))]
    lo, hi = paired_ci(d, [0.0] * len(d))
    print(f"  {'references vs copies':<30} main thread {median(d) * 100:+.2f} % "
          f"(95 % interval {lo * 100:+.2f} to {hi * 100:+.2f} %)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
