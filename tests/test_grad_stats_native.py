"""GradientFlowHook's native gradient statistics (pprobe/_dumpio.c ``grad_columns``) against
NumPy and against the torch path they stand in for (``builtin.grad_stats``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pprobe import core
from pprobe.hooks import builtin

torch = pytest.importorskip("torch")

native = pytest.mark.skipif(core.dumpio() is None, reason="PPROBE_CORE=python: the torch path")


def expected(g: Any) -> tuple:
    """NumPy's (norm, max_abs, mean, zero_frac, nan_count, inf_count) of ``g``, in double:
    the hook's columns (max_abs as the hook defines it: max(-min, max), NaN with a NaN)."""
    a = g.detach().double().numpy().ravel()
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    lo, hi = (float("nan"),) * 2 if nan else (float(a.min()), float(a.max())) if a.size else (0, 0)
    size = max(1, a.size)
    with np.errstate(invalid="ignore", over="ignore"):
        return (math.sqrt(float((a * a).sum())), hi if nan else max(-lo, hi),
                float(a.sum()) / size, int(a.size - (a != 0).sum()) / size, nan, inf)  # fmt: skip


def same(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == pytest.approx(y, rel=1e-12, abs=1e-300)


@native
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_against_numpy(dtype: str) -> None:
    g = torch.Generator().manual_seed(1)
    dt = getattr(torch, dtype)
    grads = [torch.randn(300, 7, generator=g).to(dt), torch.zeros(5, dtype=dt),
             torch.empty(0, dtype=dt), torch.randn(4, 4, generator=g).relu().to(dt)]  # fmt: skip
    bad = torch.randn(50, generator=g).to(dt)
    bad[3], bad[7], bad[9] = float("nan"), float("inf"), float("-inf")
    inf_only = torch.ones(6, dtype=dt)
    inf_only[2] = float("-inf")
    grads += [bad, inf_only]
    # around the 16-value step of the vector kernels, a non-finite value in the tail
    grads += [torch.randn(k, generator=g).relu().to(dt) for k in (15, 16, 17, 33)]
    tail = torch.randn(35, generator=g).to(dt)
    tail[34] = float("nan")
    inf_tail = torch.randn(35, generator=g).to(dt)
    inf_tail[33] = float("inf")
    grads += [tail, inf_tail]
    got = builtin.native_grad_columns(torch, grads)
    assert got is not None and len(got) == 6
    assert all(len(c) == len(grads) for c in got)
    for i, t in enumerate(grads):
        r, e = tuple(c[i] for c in got), expected(t)
        assert all(same(x, y) for x, y in zip(r[:3], e[:3])), (dtype, r, e)
        assert r[3:] == e[3:], (dtype, r, e)
        assert [type(x) for x in r] == [float] * 4 + [int] * 2


@native
def test_rows_match_the_torch_path() -> None:
    """The hook's rows from the native numbers equal the torch path's (up to float32
    rounding of torch's own reductions)."""
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(64, 128, generator=g), torch.randn(10, generator=g).relu()]
    names, numels = ["w", "b"], [g_.numel() for g_ in grads]
    hook = builtin.GradientFlowHook(frequency=1)
    fast = builtin.rows_of(hook._cpu_cols(torch, 3, names, numels, grads))
    fl, it = builtin.grad_stats(torch, grads, counts=True)
    slow = builtin.rows_of(
        builtin._cols(hook.name, 3, names, numels, fl.tolist(), it.tolist(), None)
    )
    assert [r["param"] for r in fast] == names
    for a, b in zip(fast, slow):
        for k in ("norm", "max_abs", "mean"):
            assert a[k] == pytest.approx(b[k], rel=1e-5), k
        for k in ("numel", "zero_frac", "nan_count", "inf_count", "step", "hook"):
            assert a[k] == b[k], k


def test_declines_what_it_does_not_read() -> None:
    """Other dtypes, non-contiguous views and subclasses go to the torch path (None)."""
    x = torch.randn(6, 4)
    f = builtin.native_grad_columns

    class Sub(torch.Tensor):
        pass

    assert f(torch, [x, x.t()]) is None  # not contiguous
    assert f(torch, [torch.ones(3, dtype=torch.int64)]) is None
    assert f(torch, [torch.ones(3, dtype=torch.complex64)]) is None
    assert f(torch, [x, x.as_subclass(Sub)]) is None
    assert f(torch, [x._neg_view()]) is None
    assert f(torch, [torch.ones(3, device="meta")]) is None
    assert f(torch, [x.to_sparse()]) is None
    assert f(torch, []) is None
    if core.dumpio() is None:
        assert f(torch, [x]) is None
    else:
        assert f(torch, [x]) is not None
