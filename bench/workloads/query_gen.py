"""Workload 7, part 1: make a log of ``rows`` op rows by running a probed NumPy loop.

Run under the bootstrap in log mode. Eight ops on tiny arrays per iteration, so GROUP BY op
has groups to make and the tensors table holds two or three rows per op.
"""

from __future__ import annotations

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import numpy as np
from _child import ARGS, Span, emit

rows = int(ARGS["rows"])
a = np.arange(8, dtype=np.float32)
b = np.ones(8, dtype=np.float64)
i8 = np.arange(8, dtype=np.int64)
OPS = (
    lambda: np.add(a, a),
    lambda: np.multiply(b, b),
    lambda: np.sum(a),
    lambda: np.maximum(i8, 3),
    lambda: np.exp(b),
    lambda: np.concatenate((a, a)),
    lambda: np.where(i8 > 2, a, 0),
    lambda: np.dot(b, b),
)


def main() -> None:
    with Span() as loop:
        for _ in range(rows // len(OPS)):
            for f in OPS:
                f()
    out = {"rows": rows}
    loop.put(out, "loop_s")
    emit(out)


main()
