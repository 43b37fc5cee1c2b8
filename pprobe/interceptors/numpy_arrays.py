"""How pprobe describes NumPy arrays: metadata, statistics and the array to dump."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import values


class NumpyHandler:
    framework = "numpy"

    def meta(self, x: Any) -> tuple:
        return x.shape, x.dtype, "cpu", None

    def light(self, role: str, idx: str, x: Any) -> tuple:
        return (role, idx, x.shape, x.dtype, "cpu", None, None, None, None)

    def dtype_name(self, x: Any) -> str:
        return str(x.dtype)

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


def array_stats(a: np.ndarray) -> tuple | None:
    """(min, max, mean, std, nan_count, inf_count); min..std over finite values only."""
    kind = a.dtype.kind
    if kind not in "biufc" or a.dtype.fields is not None:
        return None
    if a.size == 0:
        return (None, None, None, None, 0, 0)
    if kind == "c":
        a = np.abs(a)
        kind = "f"
    nan = inf = 0
    if kind == "f":
        finite = np.isfinite(a)
        n_fin = int(np.count_nonzero(finite))
        if n_fin != a.size:
            nan = int(np.count_nonzero(np.isnan(a)))
            inf = a.size - n_fin - nan
            a = a[finite]
            if a.size == 0:
                return (None, None, None, None, nan, inf)
    elif kind == "b":
        a = a.view(np.uint8)
    with np.errstate(all="ignore"):
        return (
            float(a.min()),
            float(a.max()),
            float(a.mean(dtype=np.float64)),
            float(a.std(dtype=np.float64)),
            nan,
            inf,
        )


HANDLER = NumpyHandler()


def register() -> None:
    values.register(np.ndarray, HANDLER)
    values.register(np.generic, HANDLER)
    values.register_scalar(np.dtype)
