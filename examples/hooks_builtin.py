"""The built-in hooks and two exporters on a small CNN, hooks added in code.

PYTHONPATH=bootstrap PPROBE_MODE=log python examples/hooks_builtin.py
pprobe query "SELECT param, round(avg(norm), 4) AS norm FROM python.gradient_flow GROUP BY 1"

The loop emits the lifecycle points itself (``pprobe.hooks.claim`` + ``emit``, so that
zero-code emission stands aside); without those lines, zero-code emission (docs/hooks.md)
fires the same hooks at the optimizer steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pprobe import hooks
from pprobe.hooks import builtin, exporters

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear(8 * 8 * 8, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(16, 1, 16, 16), torch.randint(0, 10, (16,))) for _ in range(5)]
EPOCHS = 2

hooks.add(builtin.TimeTrackingHook(batch_size=16, total_steps=EPOCHS * len(data), log_to_file=True))
hooks.add(builtin.SystemMonitorHook(frequency=5, interval=0.5))
hooks.add(builtin.GradientFlowHook())
hooks.add(builtin.FeatureMapHook(frequency=5, max_features=8, modules=["Conv2d", "ReLU"]))
hooks.register_service("optimizer", opt)
exporters.add("csv")  # <run>/logs/metrics.csv
exporters.add("tensorboard")  # <run>/logs/tensorboard (needs the tensorboard package)

hooks.claim("example")  # the points below come from this loop, not zero-code detection
hooks.emit("before_training", source="example", model=model)
step = 0
for epoch in range(EPOCHS):
    hooks.emit("before_epoch", source="example", epoch=epoch, model=model)
    for x, y in data:
        hooks.emit("before_step", source="example", step=step, model=model)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        hooks.emit(
            "after_step",
            source="example",
            step=step,
            model=model,
            metrics={"loss": float(loss.detach())},
        )
        step += 1
    hooks.emit("after_epoch", source="example", epoch=epoch, model=model)
hooks.emit("after_training", source="example", model=model)
hooks.emit("cleanup", source="example")
print(f"trained {step} steps, final loss {float(loss.detach()):.4f}")
