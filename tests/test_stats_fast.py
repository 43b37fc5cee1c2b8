"""Stats mode's one-pass native statistics (issue #10): NumPy arrays of any strides and
float16 in pprobe/_dumpio.c, CPU torch tensors read through data_ptr/shape/stride, NumPy calls
statted inside the native core (pprobe/statscore.py), bounded memory whatever the size.

Every value is checked against an independent NumPy recomputation in float64."""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import meta, ops, run_script, tensors

torch = pytest.importorskip("torch")

NATIVE = os.environ.get("PPROBE_CORE", "auto") != "python"


STATS = ("min", "max", "mean", "std", "nan_count", "inf_count")


def expected(a: np.ndarray) -> tuple:
    """(min, max, mean, std, nan, inf) over the finite values, magnitudes for complex."""
    x = np.abs(a) if a.dtype.kind == "c" else a
    x = np.asarray(x, dtype=np.float64).ravel()
    nan = int(np.isnan(x).sum())
    inf = int(np.isinf(x).sum())
    f = x[np.isfinite(x)]
    if f.size == 0:
        return (None, None, None, None, nan, inf)
    return (float(f.min()), float(f.max()), float(f.mean()), float(f.std()), nan, inf)


def close(got: tuple, want: tuple, what: Any = "") -> None:
    assert len(got) == 6, (what, got)
    assert tuple(int(v) for v in got[4:]) == want[4:], (what, got, want)
    for g, w in zip(got[:4], want[:4]):
        if w is None:
            assert g is None, (what, got, want)
        else:
            assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12), (what, got, want)


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 10)) * 100
    base[1, 2] = np.nan
    base[4, 7] = np.inf
    base[5, 0] = -np.inf
    out = [base, base.T, base[::2, ::-3], base[:, 3], base[2:3, 1:2], base[0, 0, None]]
    out += [base.astype(np.float32).T, base.astype(np.float16)[::-1]]
    out += [np.full(5, np.nan), np.zeros((3, 0)), np.array(2.5), np.broadcast_to(base[0], (4, 10))]
    ints = np.arange(-30, 30).reshape(6, 10)
    for dt in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8"):
        out.append(np.abs(ints).astype(dt)[:, ::2] if dt[0] == "u" else ints.astype(dt)[::2])
    out.append(base > 0)
    out.append(np.array([np.iinfo(np.int64).max, -1, 3], dtype=np.int64))
    # dense memory in another order (read as one run), permuted and reversed, with and
    # without a NaN; and one with a gap (not one run)
    cube = rng.standard_normal((4, 8, 12)) * 3
    out += [cube.astype(np.float32).transpose(2, 0, 1)[::-1, :, ::-1], cube.T[:, ::-1]]
    nan_cube = cube.astype(np.float32)
    nan_cube[3, 7, 11] = np.nan
    out += [nan_cube.transpose(1, 2, 0), cube.transpose(2, 0, 1)[::2]]
    # contiguous bool runs (counted): mixed, all false, all true, transposed, and bytes
    # other than 0 and 1 (true for NumPy)
    out += [cube.T > 0, np.zeros(40, bool), np.ones(3, bool), np.frombuffer(b"\x00\x02\x01", bool)]
    return out


# ----------------------------------------------------------------------- in-process
@pytest.mark.skipif(not NATIVE, reason="the native statistics")
@pytest.mark.parametrize("i", range(len(_arrays())))
def test_native_stats_of_any_strides_equal_numpys(i: int) -> None:
    from pprobe import _dumpio

    a = _arrays()[i]
    got = _dumpio.stats(a)
    if a.size == 0:
        assert got == (None, None, None, None, 0, 0)
    else:
        close(got, expected(a), (a.dtype, a.shape, a.strides))


@pytest.mark.skipif(not NATIVE, reason="the native statistics")
def test_native_stats_take_scalars_and_decline_what_they_do_not_read() -> None:
    from pprobe import _dumpio

    close(_dumpio.stats(np.float32(3.5)), (3.5, 3.5, 3.5, 0.0, 0, 0))
    close(_dumpio.stats(np.int16(-4)), (-4.0, -4.0, -4.0, 0.0, 0, 0))
    for a in (np.arange(4, dtype=">i4"), np.ones(3, dtype=np.complex64), np.array(["a"])):
        assert _dumpio.stats(a) is None, a.dtype  # the Python path takes them


def _tensors() -> list[Any]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 10, generator=g, dtype=torch.float64) * 50
    x[2, 3] = float("nan")
    x[0, 9] = float("inf")
    out = [x, x.t(), x[1::2, ::3], x[:, 4], x.expand(2, 6, 10), x[0:1].expand(5, 10)]
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        out += [x.to(dt), x.to(dt).t()[::2]]
    ints = torch.arange(-30, 30).reshape(6, 10)
    for dt in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        v = ints.abs() if dt == torch.uint8 else ints
        out.append(v.to(dt)[:, 1::2])
    for n in ("uint16", "uint32", "uint64"):
        if hasattr(torch, n):
            out.append(ints.abs().to(getattr(torch, n)))
    out += [x > 0, torch.tensor(7.0), torch.ones(0, 4), x.to(torch.float32).requires_grad_()]
    return out


def _as_float64(t: Any) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


@pytest.mark.parametrize("i", range(len(_tensors())))
def test_cpu_tensor_stats_equal_numpys(i: int) -> None:
    from pprobe.interceptors import torch_values as tv

    t = _tensors()[i]
    fast = tv.native_cpu_stats(t)
    if NATIVE:
        assert fast is not None, t.dtype  # read from the tensor's memory, nothing converted
    else:
        assert fast is None  # the Python twin: the general path
    got = tv.TorchHandler().stats(t)
    if t.numel() == 0:
        assert got == (None, None, None, None, 0, 0)
    else:
        close(got, expected(_as_float64(t)), (t.dtype, tuple(t.shape), t.stride()))


def test_tensors_the_fast_path_leaves_to_the_general_one() -> None:
    from pprobe.interceptors import torch_values as tv

    neg = torch._neg_view(torch.tensor([1.0, -2.0, 3.0]))
    q = torch.quantize_per_tensor(torch.linspace(0, 1, 5), 0.1, 2, torch.quint8)
    c = torch.tensor([3 + 4j, 1j])
    for t in (neg, q, c, torch.eye(3).to_sparse(), torch.empty(2, device="meta")):
        assert tv.native_cpu_stats(t) is None, t
    h = tv.TorchHandler()
    close(h.stats(neg), expected(np.array([-1.0, 2.0, -3.0])))
    close(h.stats(c), expected(np.array([5.0, 1.0])))


class _Sub(torch.Tensor):
    pass


class _Seen(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not NATIVE, reason="the native statistics")
def test_stats_tensor_takes_and_declines_what_the_python_checks_do() -> None:
    """pprobe/_dumpio.c's stats_tensor makes checked_cpu_stats's checks and reads in C: the
    same answer (the same numbers, or None) for every tensor."""
    from pprobe import _dumpio
    from pprobe.interceptors import torch_values as tv

    tv.native_cpu_stats(torch.zeros(1))  # sets stats_tensor up

    def both(t: Any) -> tuple:
        return _dumpio.stats_tensor(t), tv.checked_cpu_stats(t, _dumpio.stats_at)

    x = torch.randn(5, 4, dtype=torch.float64)
    declined = [torch._neg_view(x), torch.quantize_per_tensor(x.float(), 0.1, 2, torch.quint8),
                torch.tensor([3 + 4j, 1j]), x.to_sparse(), torch.empty(2, device="meta"),
                x.as_subclass(_Sub), torch.nested.nested_tensor([x, x[:2]])]  # fmt: skip
    taken = [*_tensors(), torch.nn.Parameter(x), x[2:, 1:], torch.empty(0)]
    for t in taken:
        fast, checked = both(t)
        assert fast is not None and fast == checked, (t.dtype, tuple(t.shape), fast, checked)
    for t in declined:
        assert both(t) == (None, None), type(t)
    inside: list = []
    torch.vmap(lambda r: inside.append(both(r)) or r)(x)  # functorch-wrapped rows
    assert inside == [(None, None)]
    mode = _Seen()
    with mode:
        assert _dumpio.stats_tensor(x) is None
    assert mode.calls == []  # nothing read under a torch function mode
    assert _dumpio.stats_tensor(object()) is None and _dumpio.stats_tensor(x.numpy()) is None


# ----------------------------------------------------------------------- end to end
NUMPY_PROG = """
import pickle, sys
import numpy as np
rng = np.random.default_rng(1)
base = rng.standard_normal((8, 6)) * 10
base[1, 1] = np.nan
base[2, 5] = -np.inf
arrays = [base, base.T, base[::2, ::-2], base.astype(np.float16), base.astype(np.float32)[:, 1],
          np.arange(12, dtype=np.uint16).reshape(3, 4).T, base > 0,
          np.arange(6, dtype=">i4"), (base[:3, :2] * 1j).astype(np.complex64), np.zeros(0),
          np.array(3.25)]
for a in arrays:
    np.copy(a)
out = np.empty(6)
np.multiply(base[0], 2.0, out=out)
w, v = np.linalg.eigh(base[4:7, :3] @ base[4:7, :3].T)
with open(sys.argv[1], "wb") as f:
    pickle.dump(arrays, f)
"""


def test_numpy_calls_in_stats_mode_match_a_numpy_recomputation(tmp_path: Path) -> None:
    r = run_script(tmp_path, NUMPY_PROG, str(tmp_path / "a.pkl"), env={"PPROBE_MODE": "stats"})
    r.check()
    assert not meta(r.run_dir)["errors"], r.err
    arrays = pickle.loads((tmp_path / "a.pkl").read_bytes())
    rows = ops(r.run_dir, "op = 'numpy.copy'")
    assert len(rows) == len(arrays)
    for row, a in zip(rows, arrays):
        ins = tensors(r.run_dir, f"seq = {row['seq']}")
        assert [x["role"] for x in ins] == ["input", "output"]
        for x in ins:
            assert x["shape"] == list(a.shape)
            got = tuple(x[k] for k in STATS)
            if a.size == 0:
                assert got == (None, None, None, None, 0, 0), (a, got)
            else:
                close(got, expected(a), (a.dtype, a.shape))
    (mul,) = ops(r.run_dir, "op = 'numpy.multiply'")
    descs = {(x["role"], x["idx"]): x for x in tensors(r.run_dir, f"seq = {mul['seq']}")}
    assert descs[("input", "out")]["note"] == "out= buffer"
    assert descs[("input", "out")]["min"] is None and descs[("input", "out")]["nan_count"] is None
    b = arrays[0]
    got = tuple(descs[("output", "0")][k] for k in STATS)
    close(got, expected(b[0] * 2.0))
    (emp,) = tensors(r.run_dir, "role = 'output' AND seq IN (SELECT seq FROM ops "
                                "WHERE op = 'numpy.empty')")  # fmt: skip
    assert emp["note"].startswith("uninitialised memory") and emp["min"] is None
    (eig,) = ops(r.run_dir, "op = 'numpy.linalg.eigh'")
    outs = tensors(r.run_dir, f"seq = {eig['seq']} AND role = 'output'")
    m = b[4:7, :3] @ b[4:7, :3].T
    w, v = np.linalg.eigh(m)
    assert [x["idx"] for x in outs] == ["0", "1"]
    for x, want in zip(outs, (w, v)):
        got = tuple(x[k] for k in STATS)
        close(got, expected(want))


TORCH_PROG = """
import pickle, sys
import torch
g = torch.Generator().manual_seed(5)
x = torch.randn(8, 6, generator=g) * 10
x[1, 1] = float("nan")
x[3, 2] = float("inf")
ts = [x, x.t(), x[::2, 1::2], x.to(torch.bfloat16), x.to(torch.float16).t(), x.double()[:, 2],
      torch.arange(12, dtype=torch.int32).reshape(3, 4).t(), x > 0, x[0:1].expand(4, 6),
      torch.ones(0, 3), torch._neg_view(x[2])]
for t in ts:
    t.clone()
w = torch.randn(6, 6, generator=g, requires_grad=True)
y = (x.nan_to_num() @ w).relu().sum()
y.backward()
with open(sys.argv[1], "wb") as f:
    pickle.dump([t.resolve_neg().to(torch.float64).numpy() for t in ts], f)
"""


def test_torch_cpu_tensors_in_stats_mode_match_a_numpy_recomputation(tmp_path: Path) -> None:
    r = run_script(tmp_path, TORCH_PROG, str(tmp_path / "t.pkl"), env={"PPROBE_MODE": "stats"})
    r.check()
    assert not meta(r.run_dir)["errors"], r.err
    arrays = pickle.loads((tmp_path / "t.pkl").read_bytes())
    rows = ops(r.run_dir, "op = 'torch.Tensor.clone'")
    assert len(rows) == len(arrays)
    for row, a in zip(rows, arrays):
        descs = tensors(r.run_dir, f"seq = {row['seq']}")
        assert [x["role"] for x in descs] == ["input", "output"]
        for x in descs:
            assert x["shape"] == list(a.shape)
            got = tuple(x[k] for k in STATS)
            if a.size == 0:
                assert got == (None, None, None, None, 0, 0)
            else:
                close(got, expected(a), (x["dtype"], a.shape))
    (mm,) = ops(r.run_dir, "op LIKE '%matmul%'")
    ins = tensors(r.run_dir, f"seq = {mm['seq']} AND role = 'input'")
    assert all(x["min"] is not None and x["nan_count"] == 0 for x in ins)


BIG_PROG = """
import resource, sys
import numpy as np
import torch
n = 25_000_000                       # 200 MB of float64
t = torch.ones(n, dtype=torch.float64)
t[::1000] = float("nan")
a = np.ones(n)
a[::999] = np.nan
u = t[::3]                           # not contiguous
torch.sum(t[:10])
np.sum(a[:10])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
torch.sum(t)
torch.sum(u)
np.sum(a)
np.sum(a[::-3])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024)
"""


def test_statistics_of_200_mb_arrays_and_tensors_use_bounded_memory(tmp_path: Path) -> None:
    r = run_script(tmp_path, BIG_PROG, env={"PPROBE_MODE": "stats"}, timeout=300)
    r.check()
    grew_mb = int(r.out.split()[-1])
    assert grew_mb < 40, grew_mb  # an array-sized temporary would be 200 MB
    n = 25_000_000
    t_sums = tensors(r.run_dir, "role = 'input' AND seq IN (SELECT seq FROM ops "
                                "WHERE op = 'torch.sum')")  # fmt: skip
    want_t = [len(range(0, n, 1000)), len(range(0, n, 3000))]
    assert [x["nan_count"] for x in t_sums[1:]] == want_t
    np_sums = tensors(r.run_dir, "role = 'input' AND seq IN (SELECT seq FROM ops "
                                 "WHERE op = 'numpy.sum')")  # fmt: skip
    a = np.zeros(n, dtype=bool)
    a[::999] = True
    assert [x["nan_count"] for x in np_sums[1:]] == [int(a.sum()), int(a[::-3].sum())]
    for x in t_sums[1:] + np_sums[1:]:
        assert x["min"] == x["max"] == x["mean"] == 1.0 and x["std"] == 0.0


def _runs() -> list[np.ndarray]:
    """Contiguous float32/float64 arrays for the vector path (runs of up to 2048 values read
    straight from memory, 16 or 8 values a step, a scalar tail): lengths around the step and
    run sizes, NaN and inf in the first run, in a later run's middle and in the tail, -0.0,
    extremes (FLT_MAX sums: a non-finite sum tells a run holding NaN or inf)."""
    rng = np.random.default_rng(11)
    out = []
    for dt in (np.float32, np.float64):
        for n in (1, 7, 8, 9, 15, 16, 17, 33, 2047, 2048, 2049, 4100):
            out.append((rng.standard_normal(n) * 1e3 + 5).astype(dt))
        a = (rng.standard_normal(4100) * 10).astype(dt)
        for at, v in ((3, np.nan), (2500, np.inf), (4099, -np.inf), (4098, np.nan)):
            a = a.copy()
            a[at] = v
            out.append(a)
        ext = np.array([np.finfo(dt).max, -np.finfo(dt).max, -0.0, 0.0, np.finfo(dt).tiny] * 5,
                       dtype=dt)  # fmt: skip
        out += [ext, np.full(33, 3.25, dtype=dt), np.full(40, np.nan, dtype=dt)]
        out.append(rng.standard_normal((3, 700)).astype(dt)[:, 5:])  # rows of a 2-d slice
    return out


@pytest.mark.skipif(not NATIVE, reason="the native statistics")
@pytest.mark.parametrize("i", range(len(_runs())))
def test_native_stats_of_contiguous_float_runs_equal_numpys(i: int) -> None:
    from pprobe import _dumpio

    a = _runs()[i]
    from pprobe.interceptors import torch_values as tv

    close(_dumpio.stats(a), expected(a), (a.dtype, a.shape))
    t = torch.from_numpy(np.ascontiguousarray(a))
    close(tv.native_cpu_stats(t), expected(a), "a tensor, read from its memory")


def _bool_runs() -> list[np.ndarray]:
    """Contiguous bool runs for _dumpio.c's count_true (32 bytes a step, each lane counting
    in a byte for at most 255 steps): lengths around the step and the 255-step bound, any
    byte value (NumPy reads any byte but 0 as true), all false, all true."""
    rng = np.random.default_rng(13)
    out = []
    for n in (1, 31, 32, 33, 255 * 32 - 1, 255 * 32, 255 * 32 + 1, 3 * 255 * 32 + 45):
        raw = rng.integers(1, 256, n).astype(np.uint8)
        raw[rng.random(n) < 0.4] = 0
        out.append(raw.view(bool))
    out += [np.zeros(255 * 32 + 7, bool), np.ones(2 * 255 * 32 + 64, bool)]
    return out


@pytest.mark.skipif(not NATIVE, reason="the native statistics")
@pytest.mark.parametrize("i", range(len(_bool_runs())))
def test_native_stats_of_contiguous_bool_runs_count_every_true_byte(i: int) -> None:
    from pprobe import _dumpio

    a = _bool_runs()[i]
    got = _dumpio.stats(a)
    close(got, expected(a.view(np.uint8) != 0), a.shape)
    assert got[2] == np.count_nonzero(a.view(np.uint8)) / a.size  # the mean: count / n, exact
