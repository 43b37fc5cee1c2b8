"""The Python engine's log-mode fast path (pprobe.recorder.call) writes the rows of its
general path, byte for byte.

The same program runs twice under ``PPROBE_CORE=python PPROBE_MODE=log``: once as it comes,
once with ``recorder.FAST_PATH`` off (every call through ``_call_general``, ``_begin`` and
``_end``, the path the fast one replaces). Every column of ``ops``, ``tensors`` and ``stacks``
but the clocks must be equal. The program takes the fast path's every branch: NumPy arrays of
plain and unusual dtypes, shapes past the inline dimensions, arguments that are not arrays,
keywords, several outputs, exceptions, operators deferring with NotImplemented, subclasses,
code that is not a file, threads, call stacks of several depths.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_script, sql

from pprobe import recorder, records, values
from pprobe.interceptors import numpy_arrays

PROGRAM = """
import sys, threading, warnings
import numpy as np
from pprobe import recorder

if sys.argv[1] == "general":
    recorder.FAST_PATH = False
    recorder.refresh_active()

a = np.arange(10.0)
b = np.linspace(0.0, 1.0, 10)


class Defers:
    __array_ufunc__ = None

    def __radd__(self, other):
        return "deferred"


def leaf(x, y):
    return np.add(x, y)


def middle(x, y):
    return leaf(x, y) + middle_inner(x)


def middle_inner(x):
    return x * 2.0


def work(tag):
    out = []
    for i in range(3):
        out.append(np.add(a, b))
        out.append(a + b)
        out.append(a.sum())
        out.append(np.mean(a))
        out.append(a * 2.0)
        out.append(a + 1)
        out.append(-a)
        out.append(a < b)
        c = np.empty_like(a)
        np.add(a, b, out=c)
        out.append(a.reshape(2, 5))
        out.append(np.sum(a, axis=0))
        out.append(np.divmod(a, 3.0))
        out.append(a.argmax())
        out.append(np.add(a.astype(np.float32), np.int8(3)))
        out.append(np.zeros((1,) * 9) + 1.0)
        out.append(np.zeros(3, dtype=[("x", "f4"), ("y", "i2")]).copy())
        out.append(np.arange(4).astype("M8[s]") + np.timedelta64(1, "s"))
        out.append(np.array(["ab", "c"]).copy())
        out.append(np.ma.masked_array(a, a > 5) + 1.0)
        out.append(np.matrix([[1.0, 2.0]]) * 2.0)
        out.append(middle(a, b))
        out.append(a + Defers())
        try:
            np.add(a, np.ones(3))
        except ValueError:
            out.append("raised")
        exec("np.multiply(a, b)")
        out.append([np.subtract(x, 1.0) for x in (a, b)])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            np.log(-a)
        print(tag, "warning at", w[0].filename, w[0].lineno)
    return out


work("main")
t = threading.Thread(target=work, args=("thread",))
t.start()
t.join()
print("fast sites", len(recorder._at_first))
"""

CLOCKS = ("ts_ns", "dur_ns", "run_id", "pid", "host")


def _rows(run_dir: Path, view: str, order: str) -> list[dict[str, Any]]:
    rows = sql(run_dir, f"SELECT * FROM {view} ORDER BY {order}")
    return [{k: v for k, v in r.items() if k not in CLOCKS} for r in rows]


def test_fast_path_rows_are_the_general_paths(tmp_path: Path) -> None:
    env = {"PPROBE_CORE": "python", "PPROBE_MODE": "log"}
    runs = {}
    for how in ("fast", "general"):
        r = run_script(tmp_path, PROGRAM, how, env=env, output=tmp_path / how).check()
        runs[how] = (r, r.run_dir)
    fast, general = runs["fast"][0], runs["general"][0]
    # the fast run took the fast path (it cached call sites); the general one never did
    n_fast = int(fast.out.split("fast sites ")[1])
    assert n_fast > 10
    assert "fast sites 0" in general.out
    # warnings name the program's line either way
    lines = [ln for ln in fast.out.splitlines() if "warning at" in ln]
    assert lines and all(ln.split()[-2].endswith("prog.py") for ln in lines)
    log_line = next(i for i, t in enumerate(PROGRAM.splitlines(), 1) if "np.log(-a)" in t)
    assert {int(ln.split()[-1]) for ln in lines} == {log_line}
    assert lines == [ln for ln in general.out.splitlines() if "warning at" in ln]

    ops_f = _rows(runs["fast"][1], "ops", "seq")
    ops_g = _rows(runs["general"][1], "ops", "seq")
    assert len(ops_f) > 100
    assert ops_f == ops_g
    t_f = _rows(runs["fast"][1], "tensors", "seq, role, idx")
    t_g = _rows(runs["general"][1], "tensors", "seq, role, idx")
    assert t_f == t_g
    s_f = _rows(runs["fast"][1], "stacks", "stack_id, level")
    assert s_f == _rows(runs["general"][1], "stacks", "stack_id, level")
    # what the program did is there: both threads, deep stacks, errors, 9-d shapes
    assert {r["thread"] for r in ops_f} == {"MainThread", "Thread-1 (work)"}
    assert any(r["status"] == "ValueError" for r in ops_f)
    assert any(len(r["shape"]) == 9 for r in t_f)
    leaf = [r for r in ops_f if r["caller_function"] == "leaf"]
    assert leaf and all(r["op"] == "numpy.add" for r in leaf)
    levels = {r["stack_id"]: 0 for r in leaf}
    for s in s_f:
        if s["stack_id"] in levels:
            levels[s["stack_id"]] += 1
    assert set(levels.values()) == {3}  # leaf <- middle <- work (PPROBE_STACK_DEPTH=3)
    # a call from code that is not a file names the program's frame that ran it
    mul = [r for r in ops_f if r["op"] == "numpy.multiply"]
    assert mul and all(r["caller_function"] == "work" for r in mul)


# ------------------------------------------------------------------ in-process unit tests
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(10.0),
        np.zeros((2, 3), dtype=np.float32),
        np.float64(1.5),
        np.int8(3),
        np.zeros((1,) * 8),
        np.array(["ab"]),
        np.arange(3).astype("M8[ns]"),
        np.zeros(2, dtype=">f8"),
    ],
)
def test_cached_desc_records_are_the_encoders(arr: Any) -> None:
    numpy_arrays.register()
    h = numpy_arrays.HANDLER
    for role, name in ((0, "input"), (1, "output")):
        key = (role, "1", arr.shape, arr.dtype)
        recorder._rests.pop(key, None)
        rest = recorder._rest_miss(key, arr, h)
        want = records.encode_descs(7, [h.light(name, "1", arr)], [])
        assert isinstance(rest, bytes)
        assert records.pack_seq(7) + rest == want
        assert recorder._rests[key] == rest
        recorder._rests.pop(key, None)


@pytest.mark.parametrize(
    "arr",
    [
        np.zeros(3, dtype=[("x", "f4"), ("y", "i2")]),
        np.zeros((1,) * 9),
    ],
)
def test_unusual_arrays_are_not_cached(arr: Any) -> None:
    numpy_arrays.register()
    key = (0, "0", arr.shape, arr.dtype)
    d = recorder._rest_miss(key, arr, numpy_arrays.HANDLER)
    assert d == numpy_arrays.HANDLER.light("input", "0", arr)
    assert key not in recorder._rests


def test_equal_dtypes_share_a_name() -> None:
    """The cache finds a record by a dtype equal to the one it was made for: equal plain
    dtypes have one name."""
    numpy_arrays.register()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = [
            (np.dtype("f8"), np.dtype("f8", metadata={"a": 1})),
            (np.dtype("q"), np.dtype("l")),
            (np.dtype("=i4"), np.dtype("<i4")),
        ]
    for x, y in pairs:
        assert x == y
        assert numpy_arrays.dtype_name(x) == numpy_arrays.dtype_name(y)
    assert np.ndarray in values.PLAIN_TYPES and np.float64 in values.PLAIN_TYPES
    assert np.ma.MaskedArray not in values.PLAIN_TYPES
