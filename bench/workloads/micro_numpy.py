"""Workload 1: ns per call of np.add, ``a + b``, ``a.sum()`` and np.mean on 10-element arrays.

Each op runs ``reps`` timed loops of ``n`` calls after a warm-up; the median ns per call is
reported, with the log rows one call adds (0: the op is not covered, e.g. operators and
methods under namespace-only coverage; 1: recorded once).
"""

from __future__ import annotations

from itertools import repeat

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import numpy as np
from _child import (
    ARGS,
    Span,
    calibrated,
    drain,
    emit,
    median,
    rows_per_call,
    session,
    writer_snapshot,
    writer_us_per_row,
)

a = np.arange(10, dtype=np.float64)
b = np.ones(10, dtype=np.float64)


def t_add(n: int) -> float:
    add, x, y = np.add, a, b
    with Span() as sp:
        for _ in repeat(None, n):
            add(x, y)
    return sp.s * 1e9


def t_operator(n: int) -> float:
    x, y = a, b
    with Span() as sp:
        for _ in repeat(None, n):
            x + y
    return sp.s * 1e9


def t_method(n: int) -> float:
    x = a
    with Span() as sp:
        for _ in repeat(None, n):
            x.sum()
    return sp.s * 1e9


def t_mean(n: int) -> float:
    mean, x = np.mean, a
    with Span() as sp:
        for _ in repeat(None, n):
            mean(x)
    return sp.s * 1e9


OPS = {"np.add(a, b)": t_add, "a + b": t_operator, "a.sum()": t_method, "np.mean(a)": t_mean}


def main() -> None:
    n, reps = int(ARGS.get("n", 50_000)), int(ARGS.get("reps", 5))
    target = float(ARGS.get("target_s", 0.25))
    out: dict = {"ns_per_call": {}, "rows_per_call": {}, "n": {}, "writer_us_per_row": {}}
    for name, fn in OPS.items():
        # The calibration is the warm-up too: caches, the first dump files.
        m = out["n"][name] = calibrated(fn, n, target)
        s = session()
        if s is not None:
            drain(s)  # steady state: the one-time pyarrow import is not per-call cost
            w0 = writer_snapshot(s)
        out["ns_per_call"][name] = median([fn(m) / m for _ in range(reps)])
        if s is not None:  # the writer's CPU for this op's rows of the timed loops
            drain(s)
            out["writer_us_per_row"][name] = writer_us_per_row(w0, writer_snapshot(s))
        out["rows_per_call"][name] = rows_per_call(fn, 200)
    emit(out)


main()
