"""How two tensors are compared: element-wise from dumps (chunked, memory-mapped) or from their
statistics, and the verdict thresholds per dtype (docs/compare.md has every formula).

Pure functions on NumPy arrays and numbers; nothing here reads a run's log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import state

#: Elements per chunk: the float64 scratch buffers (3 x 512 KiB) stay in the CPU's cache.
CHUNK = 1 << 16
#: Relative-error levels whose "fraction of elements within" is reported.
REL_LEVELS = (1e-3, 5e-3)

#: (rtol, atol) per dtype: ``torch.testing.assert_close``'s defaults where it has them
#: (torch/testing/_comparison.py); integers and bool must be equal; float8 types use their
#: machine epsilon as rtol.
DTYPE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
    "float8_e4m3fn": (0.125, 1e-5),
    "float8_e4m3fnuz": (0.125, 1e-5),
    "float8_e5m2": (0.25, 1e-5),
    "float8_e5m2fnuz": (0.25, 1e-5),
}
EXACT = (0.0, 0.0)

PASS, WARN, FAIL = "pass", "warn", "fail"
SEVERITY = {PASS: 0, WARN: 1, FAIL: 2}


def dtype_tolerance(*dtypes: str | None) -> tuple[float, float]:
    """(rtol, atol) for a pair: the loosest of the dtypes' (bf16 vs fp32: bf16's)."""
    cands = [DTYPE_TOLERANCES.get(d or "", EXACT) for d in dtypes] or [EXACT]
    return max(c[0] for c in cands), max(c[1] for c in cands)


def verdict_of(ratio: float | None, warn_factor: float) -> str:
    """pass when the error is within the tolerance (ratio <= 1), warn within ``warn_factor``
    times it, fail beyond (NaN: fail)."""
    if ratio is None:
        return PASS
    if ratio <= 1.0:
        return PASS
    if ratio <= warn_factor:
        return WARN
    return FAIL


@dataclass
class Elementwise:
    """Metrics of two arrays of the same shape, compared in float64 (docs/compare.md)."""

    n: int = 0
    n_finite: int = 0  # elements finite in both
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    rmse: float | None = None
    within_1e3: float | None = None
    within_5e3: float | None = None
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    nonfinite_mismatch: int = 0  # positions where exactly NaN/+inf/-inf differ
    ratio: float | None = None  # max |b - a| / (atol + rtol |a|) over finite pairs
    identical: bool = False  # same dtype, equal values, NaN/inf at the same places
    bytes_read: int = 0


class _Acc:
    """Running sums over chunks."""

    def __init__(self) -> None:
        self.ab = self.aa = self.bb = self.dd = 0.0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.ratio = 0.0
        self.within = [0, 0]
        self.n = self.n_finite = 0
        self.nan_a = self.nan_b = self.inf_a = self.inf_b = self.mismatch = 0
        self.within_nonfinite = 0  # equal non-finite pairs: count as within every level


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    # einsum, not np.dot: BLAS's threads spin against each other on a busy machine (a 1-D
    # dot took 30x longer there) and einsum's 1-D loop is as fast on one core
    return float(np.einsum("i,i->", x, y))


def _finite_part(a: np.ndarray, b: np.ndarray, acc: _Acc) -> tuple[np.ndarray, np.ndarray]:
    """Count NaN/inf of both and where they disagree; return the pairs finite in both."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    na, nb = np.isnan(a), np.isnan(b)
    acc.nan_a += int(np.count_nonzero(na))
    acc.nan_b += int(np.count_nonzero(nb))
    acc.inf_a += int(a.size - np.count_nonzero(fa) - np.count_nonzero(na))
    acc.inf_b += int(b.size - np.count_nonzero(fb) - np.count_nonzero(nb))
    both = fa & fb
    nonfin = ~(fa | fb)  # both non-finite: equal when both NaN or the same infinity
    with np.errstate(invalid="ignore"):
        same = (na & nb) | (a == b)
    eq_nonfin = int(np.count_nonzero(nonfin & same))
    acc.within_nonfinite += eq_nonfin
    acc.mismatch += int(a.size - np.count_nonzero(both) - eq_nonfin)
    return a[both], b[both]


class _Buffers:
    """Scratch arrays for one comparison, allocated once (a fresh array per pass would
    page-fault its memory in again for every chunk)."""

    def __init__(self, n: int) -> None:
        self.a = np.empty(n)
        self.b = np.empty(n)
        self.t = np.empty(n)
        self.m = np.empty(n, dtype=bool)


def _chunk(
    a: np.ndarray, b: np.ndarray, acc: _Acc, rtol: float, atol: float, buf: _Buffers
) -> None:
    """Fold one chunk (float64, 1-D, same length; ``a`` and ``b`` may be overwritten) into
    ``acc``. About twenty passes over the chunk, all in the CPU's cache."""
    acc.n += a.size
    aa, bb = _dot(a, a), _dot(b, b)
    if not (math.isfinite(aa) and math.isfinite(bb)):
        # NaN or inf (or squares that overflow float64): count them, keep the finite pairs.
        a, b = _finite_part(a, b, acc)
        with np.errstate(over="ignore", invalid="ignore"):
            aa, bb = _dot(a, a), _dot(b, b)
    n = a.size
    acc.n_finite += n
    if n == 0:
        return
    t, m = buf.t[:n], buf.m[:n]
    d = np.subtract(b, a, out=b)  # b is not needed any more
    with np.errstate(over="ignore"):
        dd = _dot(d, d)
    acc.aa += aa
    acc.bb += bb
    acc.dd += dd
    # sum(a*b) = (sum(a^2) + sum(b^2) - sum(d^2)) / 2: one pass fewer; its rounding error
    # (~1e-16 of |a||b|) moves the cosine by ~1e-16
    acc.ab += (aa + bb - dd) / 2
    np.abs(d, out=d)
    acc.max_abs = max(acc.max_abs, float(d.max()))
    absa = np.abs(a, out=a)
    # within a relative error level: |d| <= level * |a| (0 vs 0 is within, x vs 0 is not)
    for k, level in enumerate(REL_LEVELS):
        np.multiply(absa, level, out=t)
        acc.within[k] += int(np.count_nonzero(np.less_equal(d, t, out=m)))
    # error / tolerance
    np.multiply(absa, rtol, out=t)
    t += atol
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(d, t, out=t)  # x/0 = inf where rtol = atol = 0 (exact dtypes); 0/0 = NaN
        r = float(np.fmax.reduce(t))  # ignores the NaN of 0/0
        acc.ratio = max(acc.ratio, 0.0 if math.isnan(r) else r)
        # max relative error |d| / |a|: inf where only a is 0; 0/0 (NaN) is left out
        np.divide(d, absa, out=t)
    r = float(np.fmax.reduce(t))
    acc.max_rel = max(acc.max_rel, 0.0 if math.isnan(r) else r)


def _as_float(x: np.ndarray, dtype: str | None) -> np.ndarray | None:
    """A 1-D view of the values that converts to float64 chunk by chunk; None when the dtype
    cannot be decoded here (its pair is compared from statistics)."""
    if dtype == "bfloat16" and x.dtype == np.uint16:
        return x.reshape(-1)  # decoded per chunk (_decode)
    if dtype is not None and dtype != x.dtype.name:
        return None  # raw bits of a dtype NumPy lacks (float8, complex32, ...)
    k = x.dtype.kind
    if k == "c":
        return np.ascontiguousarray(x).reshape(-1).view(x.real.dtype)
    if k in "fiub":
        return x.reshape(-1)
    return None


def _decode(x: np.ndarray, dtype: str | None, out: np.ndarray) -> np.ndarray:
    """The chunk's values as float64, in ``out``."""
    out = out[: x.size]
    if dtype == "bfloat16" and x.dtype == np.uint16:
        np.copyto(out, (x.astype(np.uint32) << 16).view(np.float32))
    else:
        np.copyto(out, x, casting="unsafe")
    return out


def load(path: str) -> np.ndarray:
    """A dump, memory-mapped (its pages are read as the chunks are); a dump stored with
    another codec than npy is decoded into memory (pprobe.codecs)."""
    from .codecs import load as load_dump

    return load_dump(path, mmap=True)


def compare_arrays(
    a: np.ndarray,
    b: np.ndarray,
    rtol: float,
    atol: float,
    dtype_a: str | None = None,
    dtype_b: str | None = None,
    chunk: int = CHUNK,
) -> Elementwise | None:
    """Element-wise metrics of ``b`` against the reference ``a`` (same shape), chunk by chunk
    in float64. None when a dtype cannot be decoded."""
    fa, fb = _as_float(a, dtype_a), _as_float(b, dtype_b)
    if fa is None or fb is None:
        return None
    res = Elementwise(bytes_read=int(a.nbytes + b.nbytes))
    if fa.size != fb.size:  # complex vs real: not comparable element by element
        return None
    acc = _Acc()
    buf = _Buffers(min(chunk, fa.size))
    for s in range(0, fa.size, chunk):
        ca = _decode(fa[s : s + chunk], dtype_a, buf.a)
        cb = _decode(fb[s : s + chunk], dtype_b, buf.b)
        _chunk(ca, cb, acc, rtol, atol, buf)
    res.n, res.n_finite = acc.n, acc.n_finite
    res.nan_a, res.nan_b, res.inf_a, res.inf_b = acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b
    res.nonfinite_mismatch = acc.mismatch
    if acc.n:
        res.within_1e3 = (acc.within[0] + acc.within_nonfinite) / acc.n
        res.within_5e3 = (acc.within[1] + acc.within_nonfinite) / acc.n
    if acc.n_finite:
        res.max_abs, res.max_rel, res.ratio = acc.max_abs, acc.max_rel, acc.ratio
        res.rmse = math.sqrt(acc.dd / acc.n_finite)
        if acc.aa == 0 and acc.bb == 0:
            res.cosine = 1.0
        elif acc.aa == 0 or acc.bb == 0:
            res.cosine = 0.0
        else:
            res.cosine = max(-1.0, min(1.0, acc.ab / math.sqrt(acc.aa) / math.sqrt(acc.bb)))
    res.identical = dtype_a == dtype_b and res.nonfinite_mismatch == 0 and not (res.max_abs or 0.0)
    return res


def compare_files(
    path_a: str,
    path_b: str,
    rtol: float,
    atol: float,
    dtype_a: str | None,
    dtype_b: str | None,
) -> Elementwise | None:
    """:func:`compare_arrays` of two dumps, memory-mapped."""
    a, b = load(path_a), load(path_b)
    try:
        if a.shape != b.shape:
            return None
        return compare_arrays(a, b, rtol, atol, dtype_a, dtype_b)
    finally:
        for x in (a, b):
            mm = getattr(x, "_mmap", None)
            if mm is not None:
                mm.close()


@dataclass
class StatsDiff:
    """Relative differences of min/max/mean/std, and the error/tolerance ratio they imply."""

    rel: dict[str, float | None]
    ratio: float | None


STATS = ("min", "max", "mean", "std")


def compare_stats(
    sa: dict[str, Any], sb: dict[str, Any], rtol: float, atol: float
) -> StatsDiff | None:
    """Statistics of ``b`` against ``a``. rel = |X_b - X_a| / |X_a| (0 when both are 0);
    ratio = max over X of |X_b - X_a| / (atol + rtol * max(|min_a|, |max_a|)): a value
    close element by element within (rtol, atol) has every ratio <= 1 (docs/compare.md).
    None when either side has no statistics."""
    if any(sa.get(k) is None or sb.get(k) is None for k in STATS):
        return None
    rel: dict[str, float | None] = {}
    ratio = 0.0
    scale = max(abs(sa["min"]), abs(sa["max"]))
    tol = atol + rtol * scale
    for k in STATS:
        x, y = float(sa[k]), float(sb[k])
        d = abs(y - x)
        if not math.isfinite(d):
            rel[k] = None if math.isnan(d) else math.inf
            ratio = math.inf
            continue
        rel[k] = (0.0 if d == 0 else math.inf) if x == 0 else d / abs(x)
        ratio = max(ratio, d / tol if tol > 0 else (0.0 if d == 0 else math.inf))
    return StatsDiff(rel, ratio)


def workers() -> int:
    """Threads for comparing dumps: NumPy releases the GIL in each chunk's passes."""
    return max(1, min(8, state.cores()))
