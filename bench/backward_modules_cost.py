"""The cost of naming backward rows by module (torch_modules._tag: autograd nodes tagged with
the module path at the end of each forward, read back by each backward aten row) on the torch
MLP of bench/workloads/mlp_torch.py at the aten level, log mode.

python -m bench.backward_modules_cost [--rounds 9] [--steps 100]

One process, the probe on (aten level); rounds alternate the tagging on and off
(``torch_modules._tag_nodes``), so drift cancels within a round. The figure is the median of
the rounds' ratios of CPU seconds per training step, with a bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.backward_modules_cost",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch import nn

    import pprobe
    from pprobe.interceptors import torch_modules

    from .harness import median, paired_ci

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(64, 128), torch.randint(0, 10, (64,))) for _ in range(8)]

    def steps(n: int) -> float:
        t = time.process_time()
        for i in range(n):
            xb, yb = data[i % len(data)]
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        return (time.process_time() - t) / n

    with tempfile.TemporaryDirectory() as out:
        pprobe.enable(mode="log", torch_levels=("aten",), output=out, summary_line="off")
        try:
            steps(10)  # warm-up
            on: list[float] = []
            off: list[float] = []
            for _ in range(a.rounds):
                for flag, acc in ((True, on), (False, off)):
                    torch_modules._tag_nodes = flag
                    acc.append(steps(a.steps))
            torch_modules._tag_nodes = True
        finally:
            pprobe.disable()
    ratios = [x / y - 1 for x, y in zip(on, off)]
    lo, hi = paired_ci(ratios, [0.0] * len(ratios))
    print(f"torch MLP, aten level, log mode, {a.rounds} rounds of {a.steps} steps (CPU ms/step):")
    print(f"  backward rows named by module   median {median(on) * 1e3:.3f} ms")
    print(f"  without                         median {median(off) * 1e3:.3f} ms")
    print(f"  change: median {median(ratios) * 100:+.2f} % (95 % interval {lo * 100:+.2f} to "
          f"{hi * 100:+.2f} %)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
