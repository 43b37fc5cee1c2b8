"""Lightning ``self.log`` values in ``python.metrics`` (pprobe/integrations/lightning.py).

End to end against the real Lightning: a tiny model logs ``train_loss`` every step, ``val_x``
in validation (with the default sanity check, whose values are not training's) and
``train_mean`` per epoch. A plain Callback in the script, added by the script itself, writes
what Lightning reports (``trainer.callback_metrics`` with ``trainer.global_step``) at the
same callback points; the rows of ``python.metrics`` must be exactly those observations that
are new or changed, bit for bit, and the training's results must not change with the probe.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from helpers import BOOTSTRAP, run_script, sql

from pprobe.integrations.lightning import MetricsSeen

SCRIPT = """
import json
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl

torch.manual_seed(0)

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("train_loss", loss)
        self.log("train_mean", y.mean(), on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, idx):
        x, y = batch
        self.log("val_x", (self.lin(x) - y).abs().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

seen = []  # what Lightning reports: [name, value (hex), global_step]

class Reference(pl.Callback):
    def _look(self, trainer):
        if trainer.sanity_checking:
            return
        for k, v in trainer.callback_metrics.items():
            seen.append([k, float(v.item()).hex(), trainer.global_step])

    def on_train_batch_end(self, trainer, *args):
        self._look(trainer)

    def on_validation_end(self, trainer, *args):
        self._look(trainer)

    def on_train_epoch_end(self, trainer, *args):
        self._look(trainer)

data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[Reference()])
net = Net()
trainer.fit(net, DataLoader(data, batch_size=4), DataLoader(data, batch_size=6))
weights = [p.detach().numpy().tobytes().hex() for p in net.parameters()]
print(json.dumps({"seen": seen, "weights": weights, "global_step": trainer.global_step}))
"""


def _run(tmp_path: Path, probe: bool) -> tuple[dict[str, Any], Any]:
    where = tmp_path / ("probed" if probe else "plain")
    env = {"PYTHONWARNINGS": "ignore"}
    if probe:
        env |= {"PPROBE_MODE": "log", "PYTHONPATH": BOOTSTRAP}
    r = run_script(where, SCRIPT, env=env, probe=probe, timeout=300).check()
    return json.loads(r.out.strip().splitlines()[-1]), r


def _changes(seen: list[list[Any]]) -> list[tuple[str, str, int]]:
    """Each observation whose value differs from the previous one of its name."""
    last: dict[str, str] = {}
    out = []
    for name, value, step in seen:
        if last.get(name) != value:
            last[name] = value
            out.append((name, value, step))
    return out


def test_self_log_values_reach_python_metrics_bit_for_bit(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    got, r = _run(tmp_path, probe=True)
    plain, _ = _run(tmp_path, probe=False)
    assert got == plain  # the weights and every value Lightning reported, bit for bit
    assert got["global_step"] == 9  # 3 steps an epoch, 3 epochs
    expected = _changes(got["seen"])
    names = {n for n, _, _ in expected}
    assert names == {"train_loss", "train_mean", "val_x"}
    rows = sql(r.run_dir, "SELECT name, value, step FROM python.metrics ORDER BY ts_ns")
    recorded = [(x["name"], float(x["value"]).hex(), x["step"]) for x in rows]
    assert sorted(recorded) == sorted(expected)
    # one row per training step for the loss, at steps 1..9 (global_step after the step)
    assert [s for n, _, s in recorded if n == "train_loss"] == list(range(1, 10))
    # validation runs at each epoch's end (global_step 3, 6, 9), the sanity check not recorded
    assert [s for n, _, s in recorded if n == "val_x"] == [3, 6, 9]


def test_metrics_seen_keeps_new_and_changed_values_only() -> None:
    seen = MetricsSeen()
    assert seen.new({"a": 1.0, "b": 2.0}) == {"a": 1.0, "b": 2.0}
    assert seen.new({"a": 1.0, "b": 2.5}) == {"b": 2.5}
    assert seen.new({"a": 1.0, "b": 2.5}) == {}
    got = seen.new({"c": math.nan})
    assert list(got) == ["c"] and math.isnan(got["c"])
    assert seen.new({"c": math.nan}) == {}  # a NaN again is not a change
    assert list(seen.new({"c": 0.0, "a": 1.0})) == ["c"]
