"""Dump mode with and without pack files (issue #10): the torch and NumPy MLPs.

python -m bench.dump_pack_cost [--rounds 5] [--steps 200] [--only mlp_torch,numpy_mlp]

Variants, interleaved round by round (drift cancels within a round): ``none`` (unprobed),
``dump, files`` (``PPROBE_DUMP_PACK=0``: one file per dump, as before packs) and ``dump,
packs`` (the default: dumps of at most 1 MiB appended to per-process pack files), and with
``--also SIZE`` a pack threshold of SIZE. Figures:
per variant, the median of the rounds' ratios to the unprobed run on three clocks: the
process's CPU (every thread), wall, and the main thread's CPU (torch MLP only), with a
bootstrap 95 % interval for the first.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .harness import Outcome, Variant, interleave, median, paired_ci

WORKLOADS = ("mlp_torch", "numpy_mlp")


def _variants(torch: bool, also: str | None) -> list[Variant]:
    vs = [
        Variant("none"),
        Variant("dump, files", probe=True, env={"PPROBE_DUMP_PACK": "0"}, needs_torch=torch),
        Variant("dump, packs", probe=True, needs_torch=torch),
    ]
    if also:
        vs.append(Variant(f"dump, packs <= {also}", probe=True,
                          env={"PPROBE_DUMP_PACK": also}, needs_torch=torch))  # fmt: skip
    return vs


def _clock(o: Outcome, key: str) -> float | None:
    v = o.data.get(key)
    return None if v is None else float(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.dump_pack_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--also", metavar="SIZE", help="also measure PPROBE_DUMP_PACK=SIZE")
    p.add_argument("--io", action="store_true", help="only the 1 KB dump throughput (dump_io)")
    p.add_argument("--json", help="write the figures there")
    a = p.parse_args(argv)
    if a.io:
        return _io(a)
    common = {"clock": "cpu", "torch_threads": 1, "steps": a.steps}
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    for w in a.only.split(","):
        runs = interleave(w, _variants("torch" in w, a.also), a.rounds, common)
        for vr in runs.values():
            if vr.status != "ok":
                print(f"{w}/{vr.variant.name}: {vr.status}: {vr.error}")
                return 1
        print(f"## {w}, {a.steps} steps (load average {os.getloadavg()[0]:.2f})")
        fig: dict[str, Any] = {}
        for key, label in (("loop_s", "process CPU"), ("loop_s_wall", "wall"),
                           ("loop_thread_s", "main thread CPU")):  # fmt: skip
            base = [_clock(o, key) for o in runs["none"].runs]
            if None in base:
                continue
            for name, vr in runs.items():
                if name == "none":
                    continue
                t = [_clock(o, key) for o in vr.runs]
                ratios = [x / y for x, y in zip(t, base) if x is not None and y]
                lo, hi = paired_ci([r - 1 for r in ratios], [0.0] * len(ratios))
                fig.setdefault(name, {})[key] = {
                    "ratio": median(ratios),
                    "ci": (1 + lo, 1 + hi),
                    "rounds": ratios,
                }
                print(f"  {name}, {label}: x{median(ratios):.2f} (95% CI x{1 + lo:.2f}-"
                      f"x{1 + hi:.2f}; rounds x{min(ratios):.2f}-x{max(ratios):.2f}), median "
                      f"{median(t):.3f} s vs none {median(base):.3f} s")  # type: ignore[arg-type]  # fmt: skip
        out[w] = fig
    out["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _io(a: argparse.Namespace) -> int:
    """bench/workloads/dump_io.py at 1 KB (section 6 of docs/performance.md): arrays/s until
    the last dump is written (wall), and the main thread's slowdown in the duty cycle."""
    from .suites import _busy_iters

    busy = _busy_iters()
    args = {"clock": "cpu", "nbytes": 1024, "count": 3000}
    vs = [Variant("duty, no probe", args={"kind": "duty", "busy": busy})]
    for name, env in (("files", {"PPROBE_DUMP_PACK": "0"}), ("packs", {})):
        vs.append(Variant(f"op, {name}", probe=True, env=dict(env), args={"kind": "op"}))
        vs.append(Variant(f"duty, {name}", probe=True, env=dict(env),
                          args={"kind": "duty", "busy": busy}))  # fmt: skip
    runs = interleave("dump_io", vs, a.rounds, args)
    print(f"## dump_io, 1 KB x 3000 (2 arrays per call; load average {os.getloadavg()[0]:.2f})")
    base = runs["duty, no probe"]
    for name in ("files", "packs"):
        op = runs[f"op, {name}"]
        rate = op.median(lambda o: o.data["files"] / (o.data["loop_s_wall"] + o.data["drain_s"]))
        per = op.median(lambda o: o.data["loop_thread_s"] / o.data["files"] * 1e6)
        duty = runs[f"duty, {name}"]
        slow = [d.data["loop_thread_s"] / b.data["loop_thread_s"]
                for d, b in zip(duty.runs, base.runs)]  # fmt: skip
        drate = duty.median(lambda o: o.data["files"] / (o.data["loop_s_wall"] + o.data["drain_s"]))
        print(f"  {name}: op loop {rate:,.0f} arrays/s, main thread {per:.1f} us per array; "
              f"duty cycle {drate:,.0f} arrays/s, main thread x{median(slow):.2f} "
              f"(rounds x{min(slow):.2f}-x{max(slow):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
