"""Programs the torch tests run in subprocesses (kept here so that they can be read and run by
hand: ``PYTHONPATH=bootstrap python -c "$(python -c 'import torch_progs; print(...)')"``)."""

from __future__ import annotations

#: An MLP and a small transformer built from torch.nn, trained for real (20 SGD / Adam
#: steps each). Prints one JSON line: every loss as float.hex(), the final parameters' sums.
TRAIN = """
import json, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(F.relu(self.fc2(torch.relu(self.fc1(x)))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=64, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


losses = {"mlp": [], "transformer": []}
net = MLP()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for _ in range(STEPS):
    opt.zero_grad()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    losses["mlp"].append(loss.item().hex())

model = TinyTransformer()
opt2 = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 50, (8, 12))
for _ in range(STEPS):
    opt2.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt2.step()
    losses["transformer"].append(loss.item().hex())

with torch.no_grad():
    losses["eval"] = model(tokens).sum().item().hex()
with torch.inference_mode():
    losses["inference"] = net(x).sum().item().hex()
losses["params"] = [p.detach().double().sum().item().hex() for p in model.parameters()]
print(json.dumps(losses))
"""

#: Exceptions raised by torch and by modules: type, message and args must be the same probed.
ERRORS = """
import json
import torch
import torch.nn as nn


class Boom(Exception):
    pass


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        raise Boom("inside forward", h.shape)


def attempt(fn):
    try:
        fn()
        return "no error"
    except Exception as e:
        return [type(e).__module__, type(e).__qualname__, str(e), repr(e.args)]


cases = {
    "shape": lambda: torch.ones(3) + torch.ones(4),
    "matmul": lambda: torch.ones(2, 3) @ torch.ones(2, 3),
    "dtype": lambda: torch.ones(3, dtype=torch.int64).mean(),
    "index": lambda: torch.ones(3)[5],
    "cat": lambda: torch.cat([torch.ones(2, 2), torch.ones(3)]),
    "kwarg": lambda: torch.sum(torch.ones(3), bogus=1),
    "module": lambda: Bad()(torch.ones(2, 3)),
    "linear": lambda: nn.Linear(4, 2)(torch.ones(3, 5)),
}


def twice():
    w = torch.ones(2, requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    loss.backward()


cases["backward_twice"] = twice
out = {name: attempt(fn) for name, fn in cases.items()}
# After a module raised, the module path must be unwound: this runs at the top level.
lin = nn.Linear(2, 2)
lin(torch.ones(1, 2))
print(json.dumps(out))
"""
