"""Stats or dump mode's cost (issue #10): the micro benchmarks and the two MLPs, one mode.

python -m bench.stats_cost [--rounds 5] [--steps 200] [--base DIR] [--only micro_numpy,...]
                           [--mode stats|dump]

Variants, interleaved round by round (drift cancels within a round): ``none`` (unprobed),
``log (native)`` and ``stats`` (or ``dump``, default settings: the default dump budget)
with this tree's pprobe, and, with ``--base DIR``, ``stats (base)``: the same bootstrap
importing the pprobe package found in DIR first (a checkout of an earlier commit with its
extensions built in place, ``python setup.py build_ext --inplace``). Programs are timed on
the children's CPU clock (the harness's default), like ``python -m bench``. Figures:
per-call medians (ns) for the micro workloads and, for the MLPs, the median of the rounds'
ratios of total CPU seconds to the unprobed run, with a bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .harness import Outcome, Variant, interleave, median, paired_ci

WORKLOADS = ("micro_numpy", "micro_torch", "mlp_torch", "numpy_mlp")


def _variants(torch: bool, base: str | None, mode: str = "stats") -> list[Variant]:
    vs = [
        Variant("none"),
        Variant("log (native)", probe=True, env={"PPROBE_MODE": "log"}, needs_torch=torch,
                engine="native"),
        Variant(mode, probe=True, env={"PPROBE_MODE": mode}, needs_torch=torch),
    ]  # fmt: skip
    if base:
        vs.append(Variant(f"{mode} (base)", probe=True, env={"PPROBE_MODE": mode},
                          needs_torch=torch, pythonpath=base))  # fmt: skip
    return vs


def _total(o: Outcome) -> float:
    return float(o.data["loop_s"]) + float(o.data.get("finish_s", 0.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.stats_cost", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--base", help="a tree whose pprobe package is measured as 'stats (base)'")
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--mode", default="stats", choices=("stats", "dump"), help="the mode measured")
    p.add_argument("--json", help="write the figures there")
    a = p.parse_args(argv)
    common = {"clock": "cpu", "torch_threads": 1}
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    for w in a.only.split(","):
        torch = "torch" in w
        vs = _variants(torch, a.base, a.mode)
        if w.startswith("micro"):
            args = {**common, "n": 100_000 if torch else 200_000, "reps": 5, "target_s": 0.25}
        else:
            args = {**common, "steps": a.steps}
        runs = interleave(w, vs, a.rounds, args)
        for vr in runs.values():
            if vr.status != "ok":
                print(f"{w}/{vr.variant.name}: {vr.status}: {vr.error}")
                return 1
        print(f"## {w} (load average {os.getloadavg()[0]:.2f})")
        fig: dict[str, Any] = {}
        if w.startswith("micro"):
            ops = list(runs["none"].runs[0].data["ns_per_call"])
            for op in ops:
                b = runs["none"].median(lambda o, op=op: o.data["ns_per_call"].get(op))
                row = {"none": b}
                for name, vr in runs.items():
                    if name != "none":
                        row[name] = vr.median(lambda o, op=op: o.data["ns_per_call"].get(op))
                fig[op] = row
                text = ", ".join(
                    f"{k} {v:,.0f} ns" + (f" (+{(v - b) / 1000:.2f} us)" if k != "none" else "")
                    for k, v in row.items()
                    if v is not None and b is not None
                )
                print(f"  {op}: {text}")
        else:
            base = [_total(o) for o in runs["none"].runs]
            for name, vr in runs.items():
                if name == "none":
                    continue
                t = [_total(o) for o in vr.runs]
                ratios = [x / y for x, y in zip(t, base)]
                lo, hi = paired_ci([r - 1 for r in ratios], [0.0] * len(ratios))
                fig[name] = {"ratio": median(ratios), "ci": (1 + lo, 1 + hi), "rounds": ratios}
                print(f"  {name}: x{median(ratios):.2f} (95% CI x{1 + lo:.2f}-x{1 + hi:.2f}; "
                      f"rounds x{min(ratios):.2f}-x{max(ratios):.2f}), "
                      f"median {median(t):.3f} s vs none {median(base):.3f} s")  # fmt: skip
        out[w] = fig
    out["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
