"""A plain PyTorch loop with nothing of pprobe in it; examples/hooks/pprobe.toml adds hooks.

    PYTHONPATH=bootstrap PPROBE_CONFIG=examples/hooks/pprobe.toml \
        python examples/hooks/hooks_loop.py
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(96, 8)
y = (x[:, :1] * 2 - x[:, 1:2]).tanh()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

for epoch in range(3):
    for xb, yb in train:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
    sched.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")
