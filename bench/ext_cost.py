"""The extension API's cost on the torch MLP (docs/extending.md): log mode with and without
one ``@table`` and one ``@metric`` sampled at every step boundary.

python -m bench.ext_cost [--rounds 9] [--steps 200]

Both variants run the native engine, interleaved round by round (drift cancels within a
round); the figure is the median of the rounds' ratios of total CPU seconds (loop + finish)
with a bootstrap 95 % interval. The same variant is also in ``python -m bench --only
mlp_torch`` ("log + ext (native)").
"""

from __future__ import annotations

import argparse

from .harness import Variant, interleave, median, paired_ci


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ext_cost", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args(argv)
    log = Variant("log (native)", probe=True, env={"PPROBE_MODE": "log"}, needs_torch=True,
                  engine="native")  # fmt: skip
    ext = Variant("log + ext (native)", probe=True, env={"PPROBE_MODE": "log"},
                  args={"ext": True}, needs_torch=True, engine="native")  # fmt: skip
    runs = interleave("mlp_torch", [log, ext], a.rounds,
                      {"clock": "cpu", "torch_threads": 1, "steps": a.steps})  # fmt: skip

    def total(o: object) -> float:
        d = o.data  # type: ignore[attr-defined]
        return float(d["loop_s"]) + float(d.get("finish_s", 0.0))

    for vr in runs.values():
        if vr.status != "ok":
            print(f"{vr.variant.name}: {vr.status}: {vr.runs[0].error}")
            return 1
    t_log = [total(o) for o in runs[log.name].runs]
    t_ext = [total(o) for o in runs[ext.name].runs]
    ratios = [e / b - 1 for e, b in zip(t_ext, t_log)]
    lo, hi = paired_ci(ratios, [0.0] * len(ratios))
    print(f"torch MLP, {a.steps} SGD steps, log mode, native engine, {a.rounds} rounds (CPU s):")
    print(f"  log               median {median(t_log):.3f} s  {[round(x, 3) for x in t_log]}")
    print(f"  log + table+metric median {median(t_ext):.3f} s  {[round(x, 3) for x in t_ext]}")
    print(f"  change: median {median(ratios) * 100:+.2f} % (95 % interval {lo * 100:+.2f} to "
          f"{hi * 100:+.2f} %), target <= +2 %")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
