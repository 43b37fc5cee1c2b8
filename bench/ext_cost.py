"""The extension API's cost on the torch MLP (docs/extending.md): log mode with and without
one ``@table`` and one ``@metric`` sampled at every step boundary.

python -m bench.ext_cost [--children 3] [--quads 8] [--block-steps 300]
python -m bench.ext_cost --method children [--rounds 9] [--steps 200]

Method ``alternate`` (the default) measures inside each child: blocks of ``block-steps``
training steps with the table and metric registered and unregistered, in the order
on-off-off-on, off-on-on-off, ... (``mlp_torch.alternate``). Every block ends with the
python tables' flush inside its timing, on another thread as the ``pprobe-ext`` thread does
it, so an "on" block's rows (their Arrow encoding and write) are counted in its process CPU;
the zero-code step listener, the flusher thread and the op log run in both. One quad gives
one ratio, (on + on) / (off + off), on the process's CPU time (every thread), on the main
thread's and on the wall clock (meaningful on an otherwise idle machine only); the figure is
the median over every quad of every child, with a bootstrap 95 %
interval. The same process, warm caches and the same allocator state on both sides is what
makes a 2 % difference visible on a shared machine: fresh children differ by several percent
from one another (see ``children``).

Method ``children`` runs the two variants in fresh children, interleaved round by round, the
ratio of total CPU seconds (loop + finish) per round. The same variant is also in
``python -m bench --only mlp_torch`` ("log + ext (native)").
"""

from __future__ import annotations

import argparse
import os

from .harness import Variant, interleave, median, paired_ci


def _ci(ratios: list[float]) -> str:
    lo, hi = paired_ci(ratios, [0.0] * len(ratios))
    m = median(ratios)
    return f"median {m * 100:+.2f} % (95 % interval {lo * 100:+.2f} to {hi * 100:+.2f} %)"


def alternate(a: argparse.Namespace) -> int:
    v = Variant("log + ext alternating (native)", probe=True, env={"PPROBE_MODE": "log"},
                args={"ext": "alternate", "quads": a.quads, "block_steps": a.block_steps},
                needs_torch=True, engine="native")  # fmt: skip
    load0 = os.getloadavg()[0]
    runs = interleave("mlp_torch", [v], a.children, {"clock": "cpu", "torch_threads": 1})
    vr = runs[v.name]
    if vr.status != "ok":
        print(f"{v.name}: {vr.status}: {vr.runs[0].error}")
        return 1
    proc: list[float] = []
    main_t: list[float] = []
    wall: list[float] = []
    step_us: list[float] = []
    for o in vr.runs:
        on, off = o.data["blocks"]["on"], o.data["blocks"]["off"]
        for q in range(len(on) // 2):
            a_on, a_off = on[2 * q : 2 * q + 2], off[2 * q : 2 * q + 2]
            proc.append(sum(b[1] for b in a_on) / sum(b[1] for b in a_off) - 1)
            main_t.append(sum(b[0] for b in a_on) / sum(b[0] for b in a_off) - 1)
            if len(a_on[0]) > 2:
                wall.append(sum(b[2] for b in a_on) / sum(b[2] for b in a_off) - 1)
            step_us.append(sum(b[1] for b in a_off) / (2 * o.data["block_steps"]) * 1e6)
    print(f"torch MLP, log mode, native engine: {a.children} children x {a.quads} quads of "
          f"{a.block_steps}-step blocks ({len(proc)} quads), load average "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  step without extensions: median {median(step_us):.0f} us of process CPU")
    print(f"  table + metric every step, process CPU (every thread): {_ci(proc)}")
    print(f"  table + metric every step, main thread CPU:            {_ci(main_t)}")
    if wall:
        print(f"  table + metric every step, wall time:                  {_ci(wall)}")
    print("  target <= +2 %")
    return 0


def children(a: argparse.Namespace) -> int:
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
    print(f"torch MLP, {a.steps} SGD steps, log mode, native engine, {a.rounds} rounds (CPU s):")
    print(f"  log               median {median(t_log):.3f} s  {[round(x, 3) for x in t_log]}")
    print(f"  log + table+metric median {median(t_ext):.3f} s  {[round(x, 3) for x in t_ext]}")
    print(f"  change: {_ci(ratios)}, target <= +2 %")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ext_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--method", choices=("alternate", "children"), default="alternate")
    p.add_argument("--children", type=int, default=3, help="alternate: fresh children")
    p.add_argument("--quads", type=int, default=8, help="alternate: quads per child")
    p.add_argument("--block-steps", type=int, default=300, help="alternate: steps per block")
    p.add_argument("--rounds", type=int, default=9, help="children: rounds")
    p.add_argument("--steps", type=int, default=200, help="children: steps per child")
    a = p.parse_args(argv)
    return alternate(a) if a.method == "alternate" else children(a)


if __name__ == "__main__":
    raise SystemExit(main())
