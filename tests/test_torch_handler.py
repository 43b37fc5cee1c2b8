"""The api level's handler: with the native engine ApiMode.__torch_function__ runs C (the
Python twin's function object with its vectorcall pointed at pprobe/_native.c), and both
engines write the same rows; warnings name the program's line; the tensor getters read
through their descriptors fall back when the tensor type changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ops, run_script, tensors

torch = pytest.importorskip("torch")

# Calls of every way in: a C-level torch function, an operator, a method, a Python-level
# torch function (dispatched through torch/overrides.py), keyword arguments, a non-tensor
# argument, a tuple result, an in-place method, a call that raises, and backward.
PROG = """
import json, sys, torch
import torch.nn.functional as F

x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
y = torch.ones(3, 4, dtype=torch.float64)
w = torch.randn(4, 2, requires_grad=True)
a = torch.add(x, y)
b = x + 2
c = x.sum(dim=1)
d = F.relu(x - 5)
e = torch.split(x, 2, dim=1)
f = torch.where(x > 3, x, torch.zeros(()))
x.mul_(2)
try:
    torch.add(torch.ones(2), torch.ones(3))
except RuntimeError:
    pass
loss = (x @ w).sum()
loss.backward()
mode = torch.overrides._get_current_function_mode()
handler = type(mode).__torch_function__
print(json.dumps({"handler": handler.__qualname__, "shape": list(a.shape)}))
"""


def _rows(run_dir: Path) -> list[tuple]:
    rows = ops(run_dir, "framework = 'torch'")
    out = []
    for r in sorted(rows, key=lambda r: r["seq"]):
        caller = Path(r["caller"]).name if r["caller"] else None  # each run has its folder
        out.append((r["op"], r["kind"], r["status"], r["phase"], r["depth"], caller, r["args"]))
    return out


def _tensors(run_dir: Path) -> list[tuple]:
    rows = tensors(run_dir)
    return sorted(
        (r["role"], r["idx"], str(r["shape"]), r["dtype"], r["device"], r["requires_grad"])
        for r in rows
    )


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for core in ("native", "python"):
        tmp = tmp_path_factory.mktemp(core)
        r = run_script(tmp, PROG, env={"PPROBE_MODE": "log", "PPROBE_CORE": core}).check()
        assert json.loads(r.out.splitlines()[-1])["shape"] == [3, 4]
        out[core] = r.run_dir
    return out


def test_both_engines_write_the_same_rows(both: dict[str, Path]) -> None:
    native, python = _rows(both["native"]), _rows(both["python"])
    assert native == python
    names = [r[0] for r in native]
    want_all = ("torch.add", "torch.Tensor.add", "torch.Tensor.sum", "torch.nn.functional.relu")
    for want in (*want_all, "torch.functional.split", "torch.Tensor.mul_"):
        assert want in names
    # the failing call is a row with the exception's name, on the line that made it
    failed = [r for r in native if r[2] == "RuntimeError"]
    assert [r[0] for r in failed] == ["torch.add"]
    line = PROG.splitlines().index("    torch.add(torch.ones(2), torch.ones(3))") + 1
    assert failed[0][5].endswith(f"prog.py:{line}")
    assert _tensors(both["native"]) == _tensors(both["python"])


def test_descriptions_match_the_tensors(both: dict[str, Path]) -> None:
    # torch.add(x, y): float32 (3, 4) + float64 (3, 4) -> float64 (3, 4)
    rows = ops(both["native"], "op = 'torch.add' and status = 'ok'")
    assert len(rows) == 1
    t = tensors(both["native"], f"seq = {rows[0]['seq']}")
    got = sorted((r["role"], r["dtype"], list(r["shape"])) for r in t)
    assert got == [("input", "float32", [3, 4]), ("input", "float64", [3, 4]),
                   ("output", "float64", [3, 4])]  # fmt: skip
    # requires_grad is read: the matmul's weight
    mm = ops(both["native"], "op = 'torch.Tensor.matmul'")
    assert len(mm) == 1
    grads = {
        r["idx"]: r["requires_grad"]
        for r in tensors(both["native"], f"seq = {mm[0]['seq']} and role = 'input'")
    }
    assert grads == {"0": False, "1": True}


def test_native_handler_is_the_python_functions_twin(tmp_path: Path) -> None:
    prog = PROG + (
        "import pprobe.core as core\n"
        "print(json.dumps({'native': core.native is not None,"
        " 'getters': [t.__name__ for t in core.native.torch_getters()] if core.native else []}))\n"
    )
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    last = json.loads(r.out.splitlines()[-1])
    first = json.loads(r.out.splitlines()[-2])
    assert first["handler"] == "ApiMode.__torch_function__" or not last["native"]
    if last["native"]:
        assert "Tensor" in last["getters"] and "Parameter" in last["getters"]


WARN = """
import warnings, json, torch
warnings.simplefilter("always")
x = torch.ones(3)
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    torch.tensor(x)
    x.resize_(5) if False else None
    torch.nn.functional.softmax(x)
print(json.dumps([(w.filename.endswith("prog.py"), w.lineno, str(w.message)[:30]) for w in ws]))
"""


def test_warnings_name_the_programs_line_as_unprobed(tmp_path: Path) -> None:
    bare = run_script(tmp_path / "bare", WARN, probe=False).check()
    probed = run_script(tmp_path / "probed", WARN, env={"PPROBE_MODE": "log"}).check()
    want = json.loads(bare.out.splitlines()[-1])
    assert len(want) == 2 and all(w[0] for w in want)
    assert json.loads(probed.out.splitlines()[-1]) == want


RETYPE = """
import torch
x = torch.ones(2, 3)
torch.add(x, x)
torch.Tensor.pprobe_test_attr = 1  # a change of the type: the cached getters are stale
torch.add(x, torch.ones(1, 3, dtype=torch.float64))
del torch.Tensor.pprobe_test_attr
torch.add(x, torch.ones(2, 1, dtype=torch.int64))
"""


def test_a_changed_tensor_type_is_still_described(tmp_path: Path) -> None:
    r = run_script(tmp_path, RETYPE, env={"PPROBE_MODE": "log"}).check()
    rows = ops(r.run_dir, "op = 'torch.add'")
    assert len(rows) == 3
    got = []
    for row in sorted(rows, key=lambda r: r["seq"]):
        t = tensors(r.run_dir, f"seq = {row['seq']} and role = 'input'")
        got.append(sorted((r["dtype"], list(r["shape"])) for r in t))
    assert got == [
        [("float32", [2, 3]), ("float32", [2, 3])],
        [("float32", [2, 3]), ("float64", [1, 3])],
        [("float32", [2, 3]), ("int64", [2, 1])],
    ]
