"""Buffered rows leave the garbage collector nothing to track (native engine).

A row waits in ``recorder.buffer`` until the writer flushes it (~1 s). Whatever GC-tracked
object it holds over that time survives the young collections and is promoted to the oldest
generation, where it counts towards the next full collection: a scan of every object of the
program (20-50 ms with SciPy or torch imported), on the program's threads. A SciPy loop under
the probe made 4 full collections in 20,000 iterations against none unprobed.

So the native core keeps a row's args as tuples of atomic values (str, bytes, numbers, None)
that it untracks at once, and the texts made during the call (a class, a dtype, an object
shown by its type) are plain ``str`` pairs ``(None, "name=text")``, not
:class:`pprobe.values.Text` (a tracked ``str`` subclass).
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import ops, run_script

SCRIPT = """
import gc, json
import numpy as np
from pprobe import recorder

x = np.ones(64)
A = np.ones((4, 4))


class Opaque:  # shown by its type: <__main__.Opaque>
    pass


o = Opaque()


def calls():
    x.astype(np.float64)                          # a class
    x.astype(np.dtype("float32"))                 # a dtype
    np.broadcast_to(x, (64,))                     # a short tuple with a small int (packed)
    np.broadcast_to(x, (2, 64))
    np.reshape(A, (2, 8), order="C")              # a str keyword
    np.array(x, copy=np._CopyMode.IF_NEEDED)      # an enum, shown by its type
    np.add(x, 1.5, out=None)                      # a float, None
    np.full((3,), 7.25)                           # a tuple, a float
    np.sum(A, axis=(0, 1), keepdims=True)        # a tuple of small ints, a bool
    np.moveaxis(A, [0], [1])                      # lists
    np.ones(3, dtype=object)                      # a class
    np.copyto(np.empty(3), np.ones(3), casting="same_kind", where=True)
    np.asarray(x, like=None)


for _ in range(50):
    calls()
gc.collect()
held = len(recorder.buffer)
before = {id(o) for o in gc.get_objects()}
N = 500
for _ in range(N):
    calls()
gc.collect()
new = [o for o in gc.get_objects() if id(o) not in before]
kinds = {}
for o in new:
    k = type(o).__name__
    kinds[k] = kinds.get(k, 0) + 1
print(json.dumps({"rows": len(recorder.buffer) - held, "tracked": len(new), "kinds": kinds,
                  "sample": [repr(o)[:120] for o in new[:5]]}))
"""

PROBED = {
    "PPROBE_MODE": "log",
    "PPROBE_FLUSH_SECONDS": "3600",  # the rows stay buffered
    "PPROBE_FLUSH_ROWS": "1000000",
}


@pytest.mark.skipif(
    os.environ.get("PPROBE_CORE") == "python",
    reason="the Python engine's rows with arguments are tuples the collector tracks (its "
    "twin: same log)",
)
def test_buffered_rows_hold_no_tracked_object(tmp_path):
    r = run_script(tmp_path, SCRIPT, env=PROBED).check()
    res = json.loads(r.out.strip().splitlines()[-1])
    assert res["rows"] >= 500 * 13  # every call is a row, still buffered
    # a few objects of the loop itself (the set, the list); not one per row or per call
    assert res["tracked"] < 50, res
    # the log says what it said before: the texts made during the call, the packed shapes
    args = [x["args"] for x in ops(r.run_dir) if x["args"]]
    for want in (
        "1=<class 'numpy.float64'>",
        "1=dtype('float32')",
        "1=(64,)",
        "1=(2, 64)",
        "order='C'",
        "copy=<numpy._CopyMode>",
        "1=1.5",
        "axis=(0, 1)",
        "keepdims=True",
        "dtype=<class 'object'>",
        "casting='same_kind'",
    ):
        assert any(want in a for a in args), (want, sorted(set(args))[:40])


PLAIN = """
import gc, json
import numpy as np
from pprobe import recorder

a, b = np.ones(16), np.ones(16)
M = np.ones((4, 4))


def calls():
    np.add(a, b)
    a * b
    -a
    np.dot(M, M)
    np.sqrt(a)


for _ in range(50):
    calls()
gc.collect()
held = len(recorder.buffer)
before = {id(o) for o in gc.get_objects()}
young = gc.get_count()[0], gc.get_stats()[0]["collections"]
N = 2000
for _ in range(N):
    calls()
after = gc.get_count()[0], gc.get_stats()[0]["collections"]
grown = after[0] - young[0] + (after[1] - young[1]) * gc.get_threshold()[0]
gc.collect()
new = [o for o in gc.get_objects() if id(o) not in before]
print(json.dumps({"rows": len(recorder.buffer) - held, "tracked": len(new),
                  "young_per_call": grown / (5 * N)}))
"""


def test_buffered_rows_without_arguments_hold_no_tracked_object(tmp_path):
    """Both engines: a row without arguments (operators, ufuncs on arrays) holds nothing the
    collector tracks while it waits for the flush, and raises its count of young objects by
    nothing (the Python engine's rows were tuples: +1 a call, so a loop that allocates
    nothing of its own ran young collections only because of the probe)."""
    r = run_script(tmp_path, PLAIN, env=PROBED).check()
    res = json.loads(r.out.strip().splitlines()[-1])
    assert res["rows"] >= 2000 * 5  # every call is a row, still buffered
    assert res["tracked"] < 50, res
    assert res["young_per_call"] < 0.1, res
    assert len(ops(r.run_dir, "op = 'numpy.dot'")) == 2050
