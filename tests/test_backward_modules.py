"""Backward aten rows carry the module path of the forward they differentiate, and a NaN born
in backward is named by its module in ``pprobe nan``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, ops, run_script

torch = pytest.importorskip("torch")

PROG = """
import torch
import torch.nn as nn


class Root(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.root = Root()

    def forward(self, x):
        h = torch.tanh(x)                   # before the inner modules: the block's own node
        h = self.lin(h)
        return self.root(h * h * 0.0)       # sqrt(0): a finite forward, an inf gradient


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(Block())

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
net = Net()
x = torch.randn(2, 4, requires_grad=True)
loss = net(x).sum()                         # outside every module
loss.backward()
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bw")
    r = run_script(tmp, PROG, env={"PPROBE_MODE": "stats", "PPROBE_TORCH_LEVEL": "aten"})
    return r.check().run_dir


def backward_rows(run_dir: Path) -> list[dict]:
    return ops(run_dir, "phase = 'backward' AND kind = 'aten'")


def test_backward_rows_name_the_module_of_their_forward(run_dir: Path) -> None:
    rows = backward_rows(run_dir)
    by_op: dict[str, set] = {}
    for row in rows:
        by_op.setdefault(row["op"], set()).add(row["module_path"])
    block = "net.body.0"
    # Each backward formula runs in the node its forward op made, inside the module that ran it.
    assert by_op["aten.expand.default"] == {None}  # SumBackward: sum() ran outside the model
    assert by_op["aten.div.Tensor"] == {f"{block}.root"}  # SqrtBackward
    assert by_op["aten.mm.default"] == {f"{block}.lin"}  # AddmmBackward: the weight's grad
    assert f"{block}" in by_op["aten.mul.Tensor"]  # h * h, * 0.0: the block's own ops
    assert by_op["aten.sum.dim_IntList"] == {f"{block}.lin"}  # the bias's grad
    # tanh's backward (1 - y^2) * grad: its node was made by the block before its inner calls
    tanh_bw = [row for row in rows if row["op"] == "aten.tanh_backward.default"]
    assert [row["module_path"] for row in tanh_bw] == [block]
    # forward rows keep theirs (unchanged by the backward naming)
    fwd = {row["op"]: row["module_path"] for row in ops(run_dir, "phase = 'forward'")}
    assert fwd["aten.sqrt.default"] == f"{block}.root"
    assert fwd["aten.tanh.default"] == block


def test_a_nan_born_in_backward_is_named_by_its_module(run_dir: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "nan", str(run_dir), "--format", "json"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 1, p.stderr
    rep = json.loads(p.stdout)
    text = json.dumps(rep)
    assert "net.body.0.root" in text
    origins = [o for o in _walk(rep) if isinstance(o, dict) and o.get("op") == "aten.div.Tensor"]
    assert origins and origins[0].get("module_path") == "net.body.0.root"
    assert origins[0].get("phase") == "backward"


def _walk(x: object) -> list:
    out = [x]
    if isinstance(x, dict):
        for v in x.values():
            out += _walk(v)
    elif isinstance(x, list):
        for v in x:
            out += _walk(v)
    return out


def test_no_grad_and_the_api_level_leave_nodes_untagged(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import torch
        import torch.nn as nn
        from pprobe.interceptors import torch_modules
        lin = nn.Linear(3, 3)
        with torch.no_grad():
            y = lin(torch.ones(1, 3))
        z = lin(torch.ones(1, 3))
        print(y.grad_fn is None, torch_modules.NODE_KEY in z.grad_fn.metadata)
        """,
        env={"PPROBE_MODE": "log"},  # api level only: nothing reads the tags
    ).check()
    assert r.out.split() == ["True", "False"]


# ---------------------------------------------------------------------- in process
def test_tag_marks_the_nodes_of_one_forward_only() -> None:
    from pprobe.interceptors import torch_modules as tm

    key = tm.NODE_KEY
    a = torch.ones(3, requires_grad=True)
    before = a * 2  # made before the forward
    first = tm._seq_nr()
    inner = torch.exp(before)
    tm._tag(inner, "m.inner", first, tm._seq_nr())
    out = (inner + 1).sum()
    tm._tag(out, "m", first, tm._seq_nr())
    assert out.grad_fn.metadata[key] == "m"  # SumBackward
    add = out.grad_fn.next_functions[0][0]
    assert add.metadata[key] == "m"
    exp = add.next_functions[0][0]
    assert exp.metadata[key] == "m.inner"  # the inner forward's tag stays
    mul = exp.next_functions[0][0]
    assert key not in mul.metadata  # made before: not this forward's
    assert key not in mul.next_functions[0][0].metadata  # AccumulateGrad of a leaf


def test_tensors_of_a_result() -> None:
    from pprobe.interceptors.torch_modules import _tensors

    t = torch.ones(1)
    assert len(_tensors(t)) == 1
    assert len(_tensors((t, [t, {"a": t}], {"b": t}, 3))) == 3  # two levels down, not three
    assert _tensors("x") == []


def test_the_cost_benchmark_runs(tmp_path: Path) -> None:
    """bench/backward_modules_cost.py (docs/performance.md, "Call stacks and backward rows")
    runs; its figure is not checked (no timed assertions)."""
    from helpers import REPO

    p = subprocess.run(
        [sys.executable, "-m", "bench.backward_modules_cost", "--rounds", "1", "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env=clean_env(),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "backward rows named by module" in p.stdout
