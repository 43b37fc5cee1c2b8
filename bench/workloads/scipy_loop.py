"""Workload 4b: SciPy routines in a loop: scipy.linalg.solve (64x64) and scipy.signal.lfilter.

SciPy calls NumPy functions internally (asarray_chkfinite, ...): the probe records those as
top-level rows, so this measures what a NumPy-based library pays.
"""

from __future__ import annotations

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import numpy as np
import scipy.linalg
import scipy.signal
from _child import ARGS, Span, emit

iters, warmup = int(ARGS.get("iters", 2000)), int(ARGS.get("warmup", 50))
rng = np.random.default_rng(0)
A = rng.standard_normal((64, 64)) + 64 * np.eye(64)
rhs = rng.standard_normal(64)
sig = rng.standard_normal(1024)
bc, ac = scipy.signal.butter(4, 0.2)


def one() -> float:
    x = scipy.linalg.solve(A, rhs)
    f = scipy.signal.lfilter(bc, ac, sig)
    return float(x[0] + f[-1])


def main() -> None:
    for _ in range(warmup):
        one()
    acc = 0.0
    with Span() as loop:
        for _ in range(iters):
            acc += one()
    out = {"iters": iters, "units": warmup + iters, "check": acc}
    loop.put(out, "loop_s")
    emit(out)


main()
