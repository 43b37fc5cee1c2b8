"""The ``phase`` column: init, forward, backward, optimizer, other (docs/schema.md).

Each program line below does one kind of work; the rows it made are found by their caller
line (what pprobe records independently of the phase) and must all carry that line's phase.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_script, sql

torch = pytest.importorskip("torch")

TORCH_PROG = """
import numpy as np
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)                    # L7 init
    def forward(self, x):
        h = self.fc(x)
        return torch.tanh(h) + float(np.sum(np.ones(2)))  # L10 forward (numpy too)

torch.manual_seed(0)
data = torch.randn(8, 4) * 2                              # L13 init
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for i in range(3):
    opt.zero_grad()
    out = net(data)                                       # L18 forward (module rows)
    loss = out.pow(2).mean()                              # L19 other
    loss.backward()                                       # L20 backward (+ the call: other)
    opt.step()                                            # L21 optimizer
print(float(np.add(1.0, 2.0)))                            # L22 other
"""


def _by_line(run: Path, prog: str) -> dict[int, set[tuple[str, str]]]:
    """(kind, phase) of the rows of each marked line (``# Ln``: the marker, not the number)."""
    marks = {}
    for number, text in enumerate(prog.splitlines(), 1):  # the file is prog as written
        if "# L" in text:
            marks[number] = int(text.split("# L")[1].split()[0])
    rows = sql(run, "SELECT caller, kind, phase FROM ops WHERE caller LIKE '%prog.py:%'")
    out: dict[int, set[tuple[str, str]]] = {}
    for r in rows:
        line = int(r["caller"].rsplit(":", 1)[1])
        out.setdefault(marks.get(line, -line), set()).add((r["kind"], r["phase"]))
    return out


def test_torch_phases(tmp_path: Path) -> None:
    env = {"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "api,aten,module"}
    r = run_script(tmp_path, TORCH_PROG, env=env).check()
    assert r.out.strip() == "3.0"
    lines = _by_line(r.run_dir, TORCH_PROG)
    phases = {ln: {p for _, p in kp} for ln, kp in lines.items()}
    assert phases[7] == {"init"}
    assert phases[13] == {"init"}
    assert phases[10] == {"forward"}
    numpy_rows = sql(r.run_dir, "SELECT DISTINCT op, phase FROM ops WHERE op LIKE 'numpy.%'")
    assert {(x["op"], x["phase"]) for x in numpy_rows} == {
        ("numpy.ones", "forward"),  # NumPy inside a module's forward
        ("numpy.sum", "forward"),
        ("numpy.add", "other"),
    }
    assert phases[18] == {"forward"}
    assert phases[19] == {"other"}
    # the autograd engine's ATen ops, and the Tensor.backward call itself (outside modules)
    assert lines[20] >= {("aten", "backward"), ("method", "other")}
    # ... but the seed gradient (ones_like) is made before the engine starts
    assert lines[20] == {("aten", "backward"), ("method", "other"), ("aten", "other")}
    seed = sql(r.run_dir, "SELECT DISTINCT op FROM ops WHERE kind = 'aten' AND phase = 'other'")
    assert {x["op"] for x in seed} == {"aten.ones_like.default", "aten.mean.default",
                                       "aten.pow.Tensor_Scalar"}  # fmt: skip
    assert phases[21] == {"optimizer"}
    assert phases[22] == {"other"}
    # no row without a phase
    assert sql(r.run_dir, "SELECT count(*) AS n FROM ops WHERE phase IS NULL")[0]["n"] == 0


NUMPY_PROG = """
import numpy as np
w = np.ones(3)                  # line 3 (line 1 is empty): init
for i in range(4):
    w = np.add(w, 1.0)          # line 5: other, the loop's steps (PPROBE_STEP_AT=prog.py:5)
np.multiply(w, 2.0)             # line 6: other
"""


def test_numpy_phases_with_step_at(tmp_path: Path) -> None:
    r = run_script(
        tmp_path, NUMPY_PROG, env={"PPROBE_MODE": "log", "PPROBE_STEP_AT": "prog.py:5"}
    ).check()
    rows = sql(r.run_dir, "SELECT caller, step, phase FROM ops ORDER BY seq")
    got = [(x["caller"].rsplit(":", 1)[1], x["step"], x["phase"]) for x in rows]
    assert got == [("3", 0, "init")] + [("5", i, "other") for i in range(4)] + [("6", 3, "other")]


def test_numpy_without_steps_is_init(tmp_path: Path) -> None:
    # no step, no module: pprobe never learns that training started
    r = run_script(tmp_path, NUMPY_PROG, env={"PPROBE_MODE": "log"}).check()
    assert sql(r.run_dir, "SELECT DISTINCT phase FROM ops") == [{"phase": "init"}]


def test_optimizer_step_that_raised(tmp_path: Path) -> None:
    prog = """
    import torch

    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    def boom():
        raise RuntimeError("closure")
    net(torch.ones(1, 2)).sum().backward()
    try:
        opt.step(boom)  # SGD calls the closure inside step(): no post-hook
    except RuntimeError:
        pass
    torch.zeros(1).add(1)              # mark A: still optimizer (documented)
    opt.step()
    torch.zeros(1).add(2)              # mark B: other again
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    marks = {}
    for number, text in enumerate(prog.splitlines(), 1):
        if "# mark" in text:
            marks[number] = text.split("# mark ")[1][0]
    rows = sql(r.run_dir, "SELECT caller, phase FROM ops WHERE op = 'torch.Tensor.add'")
    got = {marks[int(x["caller"].rsplit(":", 1)[1])]: x["phase"] for x in rows}
    assert got == {"A": "optimizer", "B": "other"}
