"""The built-in hooks' cost on the torch MLP (docs/hooks-builtin.md): log mode without hooks,
with TimeTracking + SystemMonitor at frequency 10, and with GradientFlow at frequency 1.

python -m bench.hooks_cost [--rounds 9] [--steps 200]

The three variants run the native engine in fresh children, interleaved round by round (drift
cancels within a round). The figure is the median over rounds of each variant's ratio to the
probe without hooks in the same round, on the main thread's CPU time of the timed loop
(``time.thread_time``: the machine is shared, and the hooks' own threads, the sampler and
the table writer, are reported apart as the process CPU), with a bootstrap 95 % interval.
The hook variants emit ``before_step`` / ``after_step`` around every step, as zero-code
emission does (they ``claim`` the points, so zero-code detection stands aside, but its
machinery, installed with the first hook, runs). A fourth variant, a no-op ``BaseHook``,
measures that machinery and the emit calls alone; each hook variant is also given against it.
"""

from __future__ import annotations

import argparse

from .harness import Variant, interleave, median, paired_ci

TARGETS = {"time_sys": 0.02, "gradflow": 0.10}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hooks_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args(argv)
    env = {"PPROBE_MODE": "log"}
    base = Variant("log (native)", probe=True, env=dict(env), needs_torch=True, engine="native")
    noop = Variant("log + noop hook (native)", probe=True, env=dict(env), args={"hooks": "noop"},
                   needs_torch=True, engine="native")  # fmt: skip
    variants = {
        k: Variant(
            f"log + {k} (native)",
            probe=True,
            env=dict(env),
            args={"hooks": k},
            needs_torch=True,
            engine="native",
        )  # fmt: skip
        for k in TARGETS
    }
    runs = interleave("mlp_torch", [base, noop, *variants.values()], a.rounds,
                      {"clock": "cpu", "torch_threads": 1, "steps": a.steps})  # fmt: skip
    for vr in runs.values():
        if vr.status != "ok":
            print(f"{vr.variant.name}: {vr.status}: {vr.runs[0].error}")
            return 1

    def col(v: Variant, key: str) -> list[float]:
        return [float(o.data[key]) for o in runs[v.name].runs]

    print(f"torch MLP, {a.steps} SGD steps, log mode, native engine, {a.rounds} rounds:")
    b_main, b_proc = col(base, "loop_thread_s"), col(base, "loop_s")
    n_main = col(noop, "loop_thread_s")
    print(f"  {'no hooks':<34} main thread {median(b_main):.3f} s, process {median(b_proc):.3f} s")
    noop_r = [x / y - 1 for x, y in zip(n_main, b_main)]
    lo, hi = paired_ci(noop_r, [0.0] * len(noop_r))
    print(f"  {'no-op hook (the machinery)':<34} main thread {median(noop_r) * 100:+.2f} % "
          f"(95 % interval {lo * 100:+.2f} to {hi * 100:+.2f} %)")  # fmt: skip
    for k, v in variants.items():
        main_r = [x / y - 1 for x, y in zip(col(v, "loop_thread_s"), b_main)]
        proc_r = [x / y - 1 for x, y in zip(col(v, "loop_s"), b_proc)]
        lo, hi = paired_ci(main_r, [0.0] * len(main_r))
        name = {"time_sys": "TimeTracking+SystemMonitor f=10", "gradflow": "GradientFlow f=1"}[k]
        print(f"  {name:<34} main thread {median(main_r) * 100:+.2f} % (95 % interval "
              f"{lo * 100:+.2f} to {hi * 100:+.2f} %), target <= +{TARGETS[k] * 100:.0f} %; "
              f"process CPU {median(proc_r) * 100:+.2f} %")  # fmt: skip
        over = [x / y - 1 for x, y in zip(col(v, "loop_thread_s"), n_main)]
        print(f"  {'':<34} over the no-op hook: main thread {median(over) * 100:+.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
