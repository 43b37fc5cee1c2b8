"""Buffered rows hold no reference to a cached small int (-5..256).

Before Python 3.12 small ints are shared, refcounted objects. NumPy's own tests count their
references around a call (``c = sys.getrefcount(123); np.add(...); assert sys.getrefcount(123)
== c``, ``dim = 1; np.zeros([dim] * 10)``: test_numeric.py::test_for_reference_leak,
test_regression.py::test_refcount_vdot, test_ufunc.py::test_ufunc_out_casterrors...). A row
waits in ``recorder.buffer`` until the writer flushes it, so whatever it keeps must not be one of
those ints: not in the row's head (seq, step, depth...), not in a shape, not in an argument
(``axis=1``, ``reshape(2, 3)``, an index), not in statistics (nan/inf counts).
"""

from __future__ import annotations

import json

import pytest
from helpers import ops, run_script, tensors

SCRIPT = """
import gc, json, sys
import numpy as np

SMALL = (0, 1, 2, 3, 6, 123, 256, -1, -5)


def counts():
    return [sys.getrefcount(x) for x in SMALL]


a = np.ones((2, 3))
b = np.arange(6.0).reshape(2, 3)
b[0, 1] = np.nan
out = np.empty((2, 3))
dim = 1


def calls():
    np.zeros([dim] * 10)
    np.add(a, a)
    np.add(a, 123, out=out)
    np.add(a, a, out=out, casting="unsafe")
    a.sum(axis=1)
    a.reshape(2, 3)
    a.reshape((3, 2))
    np.sum(b, axis=(0, 1))
    a[0:2, 1]
    a[1]
    np.ones((1, 1, 1))
    np.transpose(np.ones((2, 3, 6)), [2, 0, 1])
    np.isnan(b)


def rows():
    try:
        from pprobe import recorder
    except ImportError:
        return 0
    return len(recorder.buffer)


def settle():
    # The Python engine's dump writer is a Python thread: its own work makes and drops small
    # ints while it runs. Count when it is idle.
    try:
        from pprobe import recorder
    except ImportError:
        return
    if recorder._dumper is not None:
        recorder._dumper.barrier()


calls()  # first sight of each type and call site: pprobe's caches
calls()
gc.collect()
gc.disable()
n = rows()
settle()
before = counts()
calls()
calls()
settle()
after = counts()
print(json.dumps({"before": before, "after": after, "rows": rows() - n}))
"""


TORCH_CALLS = """
import torch

x = torch.ones(2, 3)


def calls():
    torch.zeros(1, 1, 1)
    torch.add(x, x)
    x.sum(dim=1)
    x.view(3, 2)
    x.reshape(torch.Size([6]))
    torch.cat([x, x], dim=0)
    x.permute(1, 0)
    torch.nn.functional.relu(x)
"""


def _run(tmp_path, env, script=SCRIPT):
    r = run_script(tmp_path, script, env=env).check()
    return json.loads(r.out.strip().splitlines()[-1])


def _torch_script():
    # SCRIPT's measurement around TORCH_CALLS' calls() instead of its NumPy ones
    head, tail = SCRIPT.split("\n\ndef rows():")
    head = head[: head.index("a = np.ones")]
    return head + TORCH_CALLS + "\n\ndef rows():" + tail


PROBED = {
    "PPROBE_COVERAGE": None,  # full: ndarray methods and operators too
    "PPROBE_FLUSH_SECONDS": "3600",  # the rows stay buffered: no flush in between
    "PPROBE_FLUSH_ROWS": "1000000",
}


def test_the_calls_leave_small_int_counts_alone_unprobed(tmp_path):
    # The check below means something only if the calls themselves are neutral.
    res = _run(tmp_path, {"PPROBE": "0"})
    assert res["after"] == res["before"]


@pytest.mark.parametrize("mode", ["log", "stats", "dump"])
def test_buffered_rows_hold_no_small_int(tmp_path, mode):
    res = _run(tmp_path, {"PPROBE_MODE": mode, **PROBED})
    assert res["rows"] >= 2 * 12  # the calls are rows (indexing is not), still buffered
    diff = {x: a - b for x, a, b in zip((0, 1, 2, 3, 6, 123, 256, -1, -5), res["after"],
                                         res["before"])}  # fmt: skip
    assert res["after"] == res["before"], diff


@pytest.mark.parametrize("mode", ["log", "stats", "dump"])
def test_buffered_torch_rows_hold_no_small_int(tmp_path, mode):
    pytest.importorskip("torch")
    script = _torch_script()
    unprobed = _run(tmp_path, {"PPROBE": "0"}, script)
    assert unprobed["after"] == unprobed["before"]
    res = _run(tmp_path, {"PPROBE_MODE": mode, **PROBED}, script)
    assert res["rows"] >= 2 * 8
    assert res["after"] == res["before"]


def test_rows_hold_no_small_int_in_process(tmp_path):
    """The same through pprobe.enable(); the log reads as before (args, shapes, counts)."""
    import gc
    import sys

    import numpy as np

    import pprobe
    from pprobe import recorder

    a = np.ones((2, 3))
    b = np.array([1.0, np.nan, np.inf, -np.inf])
    small = (0, 1, 2, 3, 123, -1)

    def calls() -> None:
        np.zeros([1] * 10)
        np.add(a, a)
        np.sum(a, axis=1)
        np.reshape(a, (2, 3))
        np.negative(b)  # statistics: nan/inf counts

    pprobe.enable(mode="stats", output=str(tmp_path / "out"), flush_seconds=3600)
    try:
        calls()
        gc.collect()
        gc.disable()
        try:
            before = [sys.getrefcount(x) for x in small]
            n = len(recorder.buffer)
            calls()
            after = [sys.getrefcount(x) for x in small]
            assert len(recorder.buffer) == n + 5
        finally:
            gc.enable()
        assert after == before
    finally:
        pprobe.disable()
    run = tmp_path / "out" / "latest"
    got = [(r["op"], r["args"]) for r in ops(run)][-5:]
    assert got == [
        ("numpy.zeros", "0=[1, 1, 1, 1, 1, 1, 1, 1, ...]"),
        ("numpy.add", None),
        ("numpy.sum", "axis=1"),
        ("numpy.reshape", "1=(2, 3)"),
        ("numpy.negative", None),
    ]
    shapes = [r["shape"] for r in tensors(run, "role = 'output'")]
    assert [1] * 10 in shapes and [2] in shapes and [2, 3] in shapes
    counts = {(r["nan_count"], r["inf_count"]) for r in tensors(run, "shape = [4]")}
    assert counts == {(1, 2)}
    assert {(r["nan_count"], r["inf_count"]) for r in tensors(run, "shape = [2, 3]")} == {(0, 0)}
