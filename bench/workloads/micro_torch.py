"""Workload 2: ns per call of torch.add and ``x + y`` on 10-element CPU tensors.

With ``profiler`` set, each timed loop runs inside torch.profiler.profile(record_shapes=True);
the profiler's exit (where it builds its events) is timed too and reported per call.
"""

from __future__ import annotations

from itertools import repeat

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import torch
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

if ARGS.get("torch_threads"):
    torch.set_num_threads(int(ARGS["torch_threads"]))
torch.set_grad_enabled(False)
x = torch.arange(10, dtype=torch.float32)
y = torch.ones(10, dtype=torch.float32)


def t_add(n: int) -> float:
    add, a, b = torch.add, x, y
    with Span() as sp:
        for _ in repeat(None, n):
            add(a, b)
    return sp.s * 1e9


def t_operator(n: int) -> float:
    a, b = x, y
    with Span() as sp:
        for _ in repeat(None, n):
            a + b
    return sp.s * 1e9


OPS = {"torch.add(x, y)": t_add, "x + y": t_operator}


def profiled(fn, n: int) -> tuple[float, float]:
    """(ns per call inside the profiler, ns per call counting the profiler's exit)."""
    from torch.profiler import ProfilerActivity, profile

    p = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    with Span() as sp:
        p.__enter__()
        inner = fn(n)
        p.__exit__(None, None, None)
    return inner / n, sp.s * 1e9 / n


def main() -> None:
    n, reps = int(ARGS.get("n", 20_000)), int(ARGS.get("reps", 5))
    target = float(ARGS.get("target_s", 0.25))
    prof = bool(ARGS.get("profiler"))
    out: dict = {
        "ns_per_call": {},
        "ns_per_call_with_exit": {},
        "rows_per_call": {},
        "n": {},
        "writer_us_per_row": {},
    }
    for name, fn in OPS.items():
        m = out["n"][name] = calibrated(fn, n, target)
        s = session()
        if s is not None:
            drain(s)
            w0 = writer_snapshot(s)
        if prof:
            runs = [profiled(fn, m) for _ in range(reps)]
            out["ns_per_call"][name] = median([r[0] for r in runs])
            out["ns_per_call_with_exit"][name] = median([r[1] for r in runs])
        else:
            out["ns_per_call"][name] = median([fn(m) / m for _ in range(reps)])
            if s is not None:  # the writer's CPU for this op's rows of the timed loops
                drain(s)
                out["writer_us_per_row"][name] = writer_us_per_row(w0, writer_snapshot(s))
            out["rows_per_call"][name] = rows_per_call(fn, 200)
    emit(out)


main()
