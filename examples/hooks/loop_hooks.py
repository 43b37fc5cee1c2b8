"""Two lifecycle hooks for examples/hooks/hooks_loop.py, named in pprobe.toml.

They never touch the training script: pprobe finds the steps (optimizer.step()), the epochs
(the training DataLoader) and the services (model, optimizer, train_loader, logger, ...).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pprobe
from pprobe.hooks import BaseHook, HookRegistry


@HookRegistry.register("StepTable")
class StepTable(BaseHook):
    """One row per step in the SQL table ``python.hook_steps``."""

    def before_step(self, step: int) -> None:
        self.t0 = time.perf_counter()

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        ms = (time.perf_counter() - self.t0) * 1e3
        # the table's own `step` column is this step too (after_step runs before it moves on)
        pprobe.record("hook_steps", {"ms": ms, "lr": metrics.get("lr")})


@HookRegistry.register("EpochReport")
class EpochReport(BaseHook):
    """One log line per epoch, with the model and loader pprobe found."""

    def before_training(self, model: Any) -> None:
        logging.basicConfig(format="%(name)s: %(message)s")
        self.get_service("logger").setLevel(logging.INFO)
        n = sum(p.numel() for p in model.parameters())
        loader = self.get_service("train_loader")
        self.get_service("logger").info(
            "training %s (%d parameters), batches of %s", type(model).__name__, n,
            getattr(loader, "batch_size", "?"),
        )  # fmt: skip

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        self.get_service("logger").info("epoch %d: %d steps", epoch, metrics["steps"])

    def cleanup(self) -> None:
        run_dir = self.get_service("experiment_dir")
        self.get_service("logger").info("cleanup; run folder %s", run_dir)
