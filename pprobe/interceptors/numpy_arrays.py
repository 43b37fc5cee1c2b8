"""How pprobe describes NumPy arrays: metadata, statistics and the array to dump."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .. import core, records, values

# A row names dtypes; it never holds the dtype object: NumPy's own tests count references to
# dtypes (test_api.py::test_array_array, test_arrayobject.py::test_cleanup_with_refs...), and a
# row lives on until the writer flushes it. ``str(dtype)`` costs microseconds, so names are
# looked up: NumPy's builtin descriptors are static singletons (kept here, so their ids stay
# theirs), other simple dtypes ('<U5', '<M8[ns]', '>f8') are named by their ``.str``.
_NAMES: dict[int, str] = {}  # id(builtin descriptor) -> str(dtype)
_REPRS: dict[int, values.Text] = {}  # id(builtin descriptor) -> repr(dtype), dtype arguments
_BUILTIN: list[Any] = []
_BY_STR: dict[str, str] = {}
_SIMPLE_CLASSES: frozenset[type] = frozenset()


def _init_names() -> None:
    global _SIMPLE_CLASSES
    classes = set()
    for c in np.typecodes["All"]:
        d = np.dtype(c)
        classes.add(type(d))
        if d.isbuiltin == 1 and id(d) not in _NAMES:
            _BUILTIN.append(d)
            _NAMES[id(d)] = str(d)
            _REPRS[id(d)] = values.Text(repr(d))
    _SIMPLE_CLASSES = frozenset(classes)


def dtype_name(dt: Any) -> str:
    n = _NAMES.get(id(dt))
    if n is not None:
        return n
    if type(dt) in _SIMPLE_CLASSES and dt.fields is None and dt.subdtype is None:
        key = dt.str
        n = _BY_STR.get(key)
        if n is None:
            n = str(dt)
            if len(_BY_STR) < 4096:
                _BY_STR[key] = n
        return n
    return str(dt)  # structured, subarray, user-defined dtypes: made now


def dtype_repr(dt: Any) -> values.Text:
    """The text of a dtype passed as an argument (``astype(np.dtype("f4"))``)."""
    r = _REPRS.get(id(dt))
    if r is not None:
        return r
    try:
        return values.Text(repr(dt))
    except Exception:
        return values.Text("<dtype>")


_SHAPE_PACK = values.SHAPE_PACK  # NumPy arrays have at most 64 dimensions


class NumpyHandler:
    framework = "numpy"

    # Shapes are packed into bytes: a row must hold no small int (values.SHAPE_PACK).
    def meta(self, x: Any) -> tuple:
        dt = x.dtype
        sh = x.shape
        return _SHAPE_PACK[len(sh)](*sh), _NAMES.get(id(dt)) or dtype_name(dt), "cpu", None

    def light(self, role: str, idx: str, x: Any) -> tuple:
        dt = x.dtype
        name = _NAMES.get(id(dt)) or dtype_name(dt)
        sh = x.shape
        return (role, idx, _SHAPE_PACK[len(sh)](*sh), name, "cpu", None, None, None, None)

    def dtype_name(self, x: Any) -> str:
        return dtype_name(x.dtype)

    def stats(self, x: Any) -> tuple | None:
        return array_stats(np.asarray(x))

    def dumpable(self, x: Any) -> tuple[Any, str | None]:
        a = np.asarray(x)
        if a.dtype.hasobject:
            return None, "object dtype: not dumped (pprobe never pickles)"
        note = None
        # Not np.ma: that attribute imports numpy.ma lazily, and while numpy.ma's own module
        # body runs (calling np.* functions we record) it recurses without end. A masked array
        # exists only once numpy.ma.core has defined the class.
        ma = sys.modules.get("numpy.ma.core")
        if ma is not None and isinstance(x, getattr(ma, "MaskedArray", ())):
            note = "masked array: data saved, mask not saved"
        return a, note


# NumPy's own functions, bound before pprobe patches anything: statistics are pprobe's work,
# and calling the originals skips the proxies' and patched methods' early exits.
_add_reduce = np.add.reduce
_min_reduce = np.minimum.reduce
_max_reduce = np.maximum.reduce
_subtract = np.subtract
_multiply = np.multiply
_isfinite = np.isfinite
_isnan = np.isnan
_count_nonzero = np.count_nonzero
_absolute = np.absolute
_errstate = np.errstate
_F64 = np.dtype(np.float64)


CHUNK = 1 << 16  # values per chunk: statistics never make temporaries larger than this


def array_stats(a: np.ndarray) -> tuple | None:
    """(min, max, mean, std, nan_count, inf_count); min..std over finite values only.

    Contiguous arrays of the common numeric types: one pass over memory in native code
    (pprobe/_dumpio.c). Otherwise NumPy's reductions (in one errstate: pprobe never makes the
    program print a warning), chunk by chunk, so the extra memory is bounded whatever the
    array's size; chunks are combined with Chan's formula, as exact as one float64 pass.
    """
    dt = a.dtype
    kind = dt.kind
    if kind not in "biufc" or dt.fields is not None:
        return None
    n = a.size
    if n == 0:
        return (None, None, None, None, 0, 0)
    fast = _native_stats()
    if fast is not None and kind != "c":
        r = fast(a)
        if r is not None:
            return r  # type: ignore[no-any-return]
    if a.ndim == 0:  # ufuncs return scalars for 0-d input; the in-place square needs an array
        a = a.reshape(1)
    with _errstate(all="ignore"):
        if n <= CHUNK:
            part = _chunk_stats(a, kind)
            return _finish(*part)
        acc = (0, 0.0, 0.0, math.inf, -math.inf, 0, 0)
        it: Any = np.nditer(a, flags=["external_loop", "buffered", "zerosize_ok"],
                       buffersize=CHUNK, order="K")  # fmt: skip
        for c in it:
            acc = _combine(acc, _chunk_stats(c, kind))
        return _finish(*acc)


def _chunk_stats(a: np.ndarray, kind: str) -> tuple:
    """(count of finite values, their mean, sum of squared deviations, min, max, nan, inf)"""
    if kind == "c":
        a = _absolute(a)
        kind = "f"
    elif kind == "b":
        a = a.view(np.uint8)
    n = a.size
    nan = inf = 0
    s = _add_reduce(a, axis=None, dtype=_F64)
    if kind == "f" and not math.isfinite(s):
        finite = _isfinite(a)
        n_fin = int(_count_nonzero(finite))
        nan = int(_count_nonzero(_isnan(a)))
        inf = n - n_fin - nan
        if n_fin == 0:
            return (0, 0.0, 0.0, math.inf, -math.inf, nan, inf)
        if n_fin != n:
            a = a[finite]
            n = n_fin
            s = _add_reduce(a, axis=None, dtype=_F64)
    mean = s / n
    d = _subtract(a, mean, dtype=_F64)
    _multiply(d, d, out=d)
    m2 = float(_add_reduce(d, axis=None))
    mn = float(_min_reduce(a, axis=None))
    mx = float(_max_reduce(a, axis=None))
    return (n, float(mean), m2, mn, mx, nan, inf)


def _combine(x: tuple, y: tuple) -> tuple:
    n1, m1, q1, lo1, hi1, nan1, inf1 = x
    n2, m2, q2, lo2, hi2, nan2, inf2 = y
    n = n1 + n2
    if n1 == 0 or n2 == 0:
        n0, m0, q0 = (n2, m2, q2) if n1 == 0 else (n1, m1, q1)
    else:
        delta = m2 - m1
        n0, m0, q0 = n, m1 + delta * n2 / n, q1 + q2 + delta * delta * n1 * n2 / n
    return (n0, m0, q0, min(lo1, lo2), max(hi1, hi2), nan1 + nan2, inf1 + inf2)


def _finish(n: int, mean: float, m2: float, mn: float, mx: float, nan: int, inf: int) -> tuple:
    if n == 0:
        return (None, None, None, None, nan, inf)
    return (mn, mx, mean, math.sqrt(m2 / n), nan, inf)


_fast_stats: Any = False


def _native_stats() -> Any:
    global _fast_stats
    if _fast_stats is False:
        mod = core.dumpio()
        _fast_stats = mod.stats if mod is not None else None
    return _fast_stats


HANDLER = NumpyHandler()


def _dtype_sid(dt: Any) -> int:
    return records.sid(dtype_name(dt))


def _native_init() -> None:
    """Hand the native core NumPy's types and the names of the builtin dtypes, and let it
    check NumPy's array struct on a live array (it raises if the struct is not the one it
    reads; then the Python path describes NumPy arrays)."""
    native = core.native
    if native is None:
        return
    scalars: dict[type, int] = {}
    for d in _BUILTIN:
        if d.kind in "biufc" and d.type not in scalars:
            scalars[d.type] = records.sid(_NAMES[id(d)])
    descrs = {id(d): records.sid(_NAMES[id(d)]) for d in _BUILTIN}
    try:
        native.numpy_init(np.ndarray, np.generic, np.ufunc, scalars, descrs, _dtype_sid,
                          np.zeros((2, 3), dtype=np.float32))  # fmt: skip
    except Exception as e:
        from .. import _report

        _report.internal_error("checking NumPy's array struct (native core)", e)


def register() -> None:
    values.register(np.ndarray, HANDLER)
    values.register(np.generic, HANDLER)
    _init_names()
    values.PLAIN_TYPES.update({np.ndarray, *(d.type for d in _BUILTIN)})
    values.PLAIN_DTYPE_CLASSES.update(_SIMPLE_CLASSES)
    values.register_text(np.dtype, dtype_repr)
    _native_init()
