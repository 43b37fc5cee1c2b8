"""Recording a call holds no lasting reference to a builtin NumPy dtype.

Builtin dtypes (``np.dtype(np.int32)``...) are shared singletons, and NumPy's own tests count
their references around a call (test_api.py::test___array___refcount,
test_arrayobject.py, test_nditer.py, test_indexing.py, test_function_base.py). pprobe's caches
of descriptions (the Python engine's desc records by shape and dtype, the native core's dtype
ids, ``.npy`` headers and argument texts) must not hold one: a cache entry made at the first
sight of a dtype would be one reference more after that call than before it.

The calls below are each dtype's first sight (no warm-up), the writer does not flush
meanwhile (its own NumPy work makes and drops references while it runs).
"""

from __future__ import annotations

import json

import pytest
from helpers import run_script

SCRIPT = """
import gc, json, sys
import numpy as np

DTS = list({id(d): d for d in (np.dtype(c) for c in np.typecodes["All"])}.values())


def counts():
    return [sys.getrefcount(d) for d in DTS]


class MyArray:  # NumPy's test___array___refcount (its -1 does not fit every dtype)
    def __init__(self, dtype):
        self.val = np.array(1, dtype=dtype)

    def __array__(self, dtype=None, copy=None):
        return self.val.__array__(dtype=dtype, copy=copy)


gc.collect()
gc.disable()
before = counts()
for k, d in enumerate(DTS):
    if d.kind in "OSUVMm":
        continue
    a = np.ones(k + 2, dtype=d)  # a dtype as an argument
    np.add(a, a) if d.kind != "b" else np.logical_and(a, a)
    a.sum()
    (a + a) if d.kind != "b" else (a & a)
    np.array(a[:1])
    a.reshape(-1, 1)
    np.array(MyArray(d))
    np.array(MyArray(d), dtype=d)
    a.astype(d)
del a, d
after = counts()
try:
    from pprobe import recorder
    rows = len(recorder.buffer)
except ImportError:
    rows = 0
print(json.dumps({"diff": {str(d): y - x for d, x, y in zip(DTS, before, after) if x != y},
                  "rows": rows}))
"""

PROBED = {
    "PPROBE_FLUSH_SECONDS": "3600",  # the rows stay buffered: the writer does not run
    "PPROBE_FLUSH_ROWS": "1000000",
}


def _run(tmp_path, env):
    r = run_script(tmp_path, SCRIPT, env=env).check()
    return json.loads(r.out.strip().splitlines()[-1])


def test_the_calls_leave_dtype_counts_alone_unprobed(tmp_path):
    # The check below means something only if the calls themselves are neutral.
    assert _run(tmp_path, {"PPROBE": "0"})["diff"] == {}


@pytest.mark.parametrize("mode", ["log", "stats", "dump"])
def test_recording_holds_no_builtin_dtype(tmp_path, mode):
    res = _run(tmp_path, {"PPROBE_MODE": mode, **PROBED})
    assert res["rows"] >= 16 * 8  # the calls were recorded, still buffered
    assert res["diff"] == {}
