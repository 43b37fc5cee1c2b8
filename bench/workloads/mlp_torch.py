"""Workload 3: a 128-256-256-10 MLP trained on CPU with SGD, batch 64.

Times ``steps`` training steps after ``warmup`` steps. With ``profiler`` set the timed steps
run inside torch.profiler.profile(record_shapes=True); its exit and a Chrome-trace export are
timed as the finish cost (for pprobe the finish is its own stop: flush and metadata).
"""

from __future__ import annotations

import os
import tempfile

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import torch
import torch.nn.functional as F
from _child import ARGS, Span, emit
from torch import nn

steps, warmup = int(ARGS.get("steps", 200)), int(ARGS.get("warmup", 5))
if ARGS.get("torch_threads"):
    torch.set_num_threads(int(ARGS["torch_threads"]))
for _name in ARGS.get("preimport", ()):  # diagnosis: take a one-time import out of the timing
    __import__(_name)
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 128), torch.randint(0, 10, (64,))) for _ in range(8)]


def step(i: int) -> float:
    xb, yb = data[i % len(data)]
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    return loss


def main() -> None:
    for i in range(warmup):
        step(i)
    out: dict = {"steps": steps, "units": warmup + steps + 1}
    if ARGS.get("profiler"):
        from torch.profiler import ProfilerActivity, profile

        p = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        p.__enter__()
        with Span() as loop:
            for i in range(steps):
                step(i)
        with Span() as ex:
            p.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        with Span() as export:
            p.export_chrome_trace(path)
        out["trace_mb"] = os.path.getsize(path) / 1e6
        os.unlink(path)
        loop.put(out, "loop_s")
        ex.put(out, "exit_s")
        export.put(out, "export_s")
        out["finish_s"] = ex.s + export.s
    else:
        with Span() as loop:
            for i in range(steps):
                step(i)
        loop.put(out, "loop_s")
    out["final_loss"] = float(step(steps).detach())
    emit(out)


main()
