"""Module rows see ``forward``'s keyword arguments (call-time values), as well as positional
ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import load_dump, run_script, sql

torch = pytest.importorskip("torch")

PROG = """
import torch
import torch.nn as nn


class Scale(nn.Module):
    def forward(self, x, *, scale=None, shift=0.0, flag=False):
        out = x * scale + shift
        scale.mul_(10.0)                     # changed in place after use: rows keep call time
        return out


torch.manual_seed(0)
m = Scale()
x = torch.randn(3, 4)
s = torch.rand(3, 4) + 1.0
torch.save({"x": x.clone(), "s": s.clone()}, "inputs.pt")
m(x, scale=s, shift=1.5, flag=True)
m(x, scale=s)                                # defaults are not arguments: not seen
"""


def module_rows(run_dir: Path) -> list[dict]:
    return sql(
        run_dir,
        "SELECT o.seq, o.args, t.role, t.idx, t.mean, t.max, t.dump_path FROM ops o "
        "JOIN tensors t USING (pid, seq) WHERE o.kind = 'module' ORDER BY o.seq, t.role, t.idx",
    )


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_module_rows_describe_keyword_arguments_at_call_time(tmp_path: Path, mode: str) -> None:
    r = run_script(
        tmp_path, PROG, env={"PPROBE_MODE": mode, "PPROBE_TORCH_LEVEL": "module"}
    ).check()
    inputs = torch.load(tmp_path / "inputs.pt")
    x, s = inputs["x"].numpy(), inputs["s"].numpy()
    rows = module_rows(r.run_dir)
    seqs = sorted({row["seq"] for row in rows})
    assert len(seqs) == 2
    first = [row for row in rows if row["seq"] == seqs[0]]
    second = [row for row in rows if row["seq"] == seqs[1]]
    assert [(row["role"], row["idx"]) for row in first] == [
        ("input", "0"),
        ("input", "scale"),
        ("output", "0"),
    ]
    assert first[0]["args"] == "shift=1.5, flag=True"
    by_idx = {(row["role"], row["idx"]): row for row in first}
    assert by_idx[("input", "scale")]["mean"] == pytest.approx(float(s.mean(dtype=np.float64)))
    assert by_idx[("output", "0")]["mean"] == pytest.approx(
        float((x * s + 1.5).mean(dtype=np.float64)), rel=1e-6
    )
    # the second call got the tensor after the first call's mul_: ten times larger
    by_idx2 = {(row["role"], row["idx"]): row for row in second}
    assert by_idx2[("input", "scale")]["max"] == pytest.approx(float(s.max()) * 10.0, rel=1e-6)
    assert second[0]["args"] is None
    if mode == "dump":
        got = load_dump(r.run_dir / by_idx[("input", "scale")]["dump_path"])
        np.testing.assert_array_equal(got, s)  # the values when forward was called


def test_kwargs_are_read_only_from_module_call_impl() -> None:
    from pprobe.interceptors import torch_modules as tm

    def inner() -> dict:  # the right name, but not torch's file: not trusted
        kwargs = {"a": 1}
        return kwargs and level1()

    def level1() -> dict:
        return level2()

    def level2() -> dict:
        return tm._forward_kwargs()

    assert inner() == {}
