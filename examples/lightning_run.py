"""A plain Lightning training run: nothing in it mentions pprobe (docs/integrations.md).

Run it under the probe, with the hook of examples/lightning_plugin.py:
    PYTHONPATH=bootstrap:examples PPROBE_PLUGINS=lightning_plugin PPROBE_MODE=log \\
        python examples/lightning_run.py
then:
    pprobe query "SELECT step, count(*) AS ops FROM ops GROUP BY step ORDER BY step"
    pprobe query "SELECT * FROM python.epochs"
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x[:, :1] * 2 - x[:, 1:2]
    train = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=16)
    val = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=16)
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Regressor(), train, val)
    print(f"trained: global_step={trainer.global_step} epochs={trainer.current_epoch}")


if __name__ == "__main__":
    main()
