"""A plugin that adds a lifecycle hook (pprobe.hooks): the Lightning run stays unchanged.

``PPROBE_PLUGINS=lightning_plugin`` loads it at start-up; the Lightning integration then calls
the hook at Lightning's own boundaries (docs/integrations.md). Each epoch's metrics become a
row of ``python.epochs``.
"""

import pprobe
from pprobe.hooks import BaseHook, add


class EpochSummary(BaseHook):
    def __init__(self) -> None:
        super().__init__(name="epoch_summary")
        self.steps = 0

    def after_step(self, step: int) -> None:
        self.steps += 1

    def after_epoch(self, epoch: int, metrics: dict | None = None) -> None:
        row = {"epoch": epoch, "steps": self.steps}
        row.update(metrics or {})
        pprobe.record("epochs", row)

    def after_training(self, metrics: dict | None = None) -> None:
        trainer = self.get_service("trainer")
        print(f"pprobe hook: {self.steps} steps seen; Lightning says {trainer.global_step}")


class LightningPlugin(pprobe.Plugin):
    def on_load(self) -> None:
        add(EpochSummary())
