"""A small PyTorch MLP trained with SGD on a synthetic task: no pprobe code in it.

Run it under the probe:  PYTHONPATH=bootstrap python examples/torch_mlp.py
Every torch call becomes a row of the log, with the nn.Module that ran it (``model.hidden.0``)
and the training step (counted from the optimizer's steps). Try
``PPROBE_TORCH_LEVEL=api,aten,module`` to see the ATen ops (backward included) and one row per
module call, and ``PPROBE_STEPS=3-4`` to capture only two steps.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, n_in: int = 20, width: int = 64, n_out: int = 3) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width))
        self.out = nn.Linear(width, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.hidden(x)))


def main(steps: int = 30, seed: int = 0) -> float:
    torch.manual_seed(seed)
    x = torch.randn(512, 20)
    y = (x[:, :3].argmax(dim=1) + (x[:, 3] > 1).long()) % 3  # a learnable labelling
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"final loss {loss.item():.4f}, accuracy {acc:.3f}")
    return loss.item()


if __name__ == "__main__":
    main()
