"""ndarray operators and methods as rows (full coverage), and the namespace fallback.

The mechanism alone is tested in test_cpython_slots.py; here it is pprobe end to end:
rows, names, tensors and dumps of ``a + b`` and ``a.sum()``, nesting, restore on disable(),
and the fallback when the interpreter self-test fails or PPROBE_COVERAGE=namespace.
"""

from __future__ import annotations

import operator
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import load_dump, meta, ops, run_script, sql, tensors

import pprobe
from pprobe import _cpython, core
from pprobe.interceptors import numpy_ndarray

FULL = {"PPROBE_COVERAGE": "full", "PPROBE_MODE": "log"}

BINARY = ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
          "lshift", "rshift"]  # fmt: skip


SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
           "pow": "**", "and": "&", "or": "|", "xor": "^", "lshift": "<<",
           "rshift": ">>"}  # fmt: skip


def test_every_operator_form_is_a_row_naming_its_ufunc(tmp_path: Path) -> None:
    lines = []
    for name in BINARY:
        s = SYMBOLS[name]
        lines += [
            f"a {s} b",  # a.__name__(b)
            f"3 {s} a",  # a.__rname__(3)
            "c = a.copy()",
            "try:",
            f"    c {s}= b",  # c.__iname__(b), in place
            "except TypeError:",
            "    pass  # int /= int cannot cast in place: still a row, with its status",
        ]
    prog = (
        "import numpy as np\n"
        "a = np.arange(1, 7, dtype=np.int64).reshape(2, 3)\n"
        "b = np.full((2, 3), 2, dtype=np.int64)\n"
        + "\n".join(lines)
        + """
a @ a.T
2 * a
divmod(a, b)
-a; +a; abs(a); ~a
a < b; a <= b; a == b; a != b; a > b; a >= b
"""
    )
    r = run_script(tmp_path, prog, env=FULL).check()
    rows = ops(r.run_dir, "kind = 'operator'")
    got = [(x["op"].rsplit(".", 1)[1], x["ufunc"]) for x in rows]
    ufunc = numpy_ndarray.OPERATORS
    expected = []
    for name in BINARY:
        expected += [(f"__{name}__", ufunc[name]), (f"__r{name}__", ufunc[name]),
                     (f"__i{name}__", ufunc[name])]  # fmt: skip
    expected += [("__matmul__", "matmul"), ("__rmul__", "multiply")]
    # The native engine tells an operator by the caller's opcode: divmod() and abs() are calls
    # of builtins there, rows of their ufuncs (numpy.divmod, numpy.absolute).
    native = core.ENGINE == "native"
    if not native:
        expected += [("__divmod__", "divmod")]
    expected += [(f"__{u}__", numpy_ndarray.UNARY[u]) for u in ("neg", "pos", "abs", "invert")
                 if not (native and u == "abs")]  # fmt: skip
    expected += [(f"__{c}__", numpy_ndarray.COMPARE[c]) for c in ("lt", "le", "eq", "ne", "gt",
                                                                   "ge")]  # fmt: skip
    assert got == expected
    if native:
        calls = [x["op"] for x in ops(r.run_dir, "op in ('numpy.divmod', 'numpy.absolute')")]
        assert calls == ["numpy.divmod", "numpy.absolute"]
    assert {x["framework"] for x in rows} == {"numpy"}
    failed = [x for x in rows if x["status"] != "ok"]
    with pytest.raises(TypeError) as exc:
        c = np.arange(1, 7, dtype=np.int64)
        c /= c
    assert [(x["op"], x["status"]) for x in failed] == [
        ("numpy.ndarray.__itruediv__", type(exc.value).__name__)]  # fmt: skip
    assert all(x["caller"].endswith("prog.py:" + x["caller"].rsplit(":", 1)[1]) for x in rows)
    # a + b: two array inputs, one output with the broadcast shape
    add = rows[0]
    t = tensors(r.run_dir, f"seq = {add['seq']}")
    assert [(x["role"], x["idx"], x["shape"], x["dtype"]) for x in t] == [
        ("input", "0", [2, 3], "int64"),
        ("input", "1", [2, 3], "int64"),
        ("output", "0", [2, 3], "int64"),
    ]


def test_methods_are_rows_and_mean_is_one_row(tmp_path: Path) -> None:
    prog = """
        import numpy as np
        a = np.arange(12.0)
        b = a.reshape(3, 4)
        b.sum(); b.mean(); b.std(); b.var(); b.min(); b.max(); b.argmax()
        b.transpose(); b.astype(np.float32); b.dot(b.T); b.clip(1, 5); b.cumsum()
        c = b.copy(); c.fill(3.0)
    """
    r = run_script(tmp_path, prog, env=FULL).check()
    names = [x["op"] for x in ops(r.run_dir, "kind = 'method'")]
    assert names == [f"numpy.ndarray.{m}" for m in (
        "reshape", "sum", "mean", "std", "var", "min", "max", "argmax", "transpose", "astype",
        "dot", "clip", "cumsum", "copy", "fill")]  # fmt: skip
    # b.mean() runs numpy/_core/_methods.py, which calls add.reduce and true_divide: one row.
    assert [x["depth"] for x in ops(r.run_dir)] == [0] * len(ops(r.run_dir))


def test_operator_values_are_dumped_at_call_time(tmp_path: Path) -> None:
    prog = """
        import numpy as np
        a = np.linspace(0.0, 1.0, 5)
        b = np.arange(5.0)
        a += b          # in place: the dumped input0 must be a's old value
        c = a * 2
    """
    r = run_script(tmp_path, prog, env={"PPROBE_COVERAGE": "full", "PPROBE_MODE": "dump"})
    r.check()
    rows = {x["op"]: x for x in ops(r.run_dir, "kind = 'operator'")}
    iadd = rows["numpy.ndarray.__iadd__"]
    files = {
        (t["role"], t["idx"]): t["dump_path"] for t in tensors(r.run_dir, f"seq = {iadd['seq']}")
    }
    old_a = load_dump(r.run_dir / files[("input", "0")])
    assert np.array_equal(old_a, np.linspace(0.0, 1.0, 5))
    out = load_dump(r.run_dir / files[("output", "0")])
    assert np.array_equal(out, np.linspace(0.0, 1.0, 5) + np.arange(5.0))
    assert (
        files[("input", "0")] == f"op_numpy.ndarray.__iadd___input0_{iadd['pid']}-{iadd['seq']}.npy"
    )
    mul = rows["numpy.ndarray.__mul__"]
    t = {(x["role"], x["idx"]): x for x in tensors(r.run_dir, f"seq = {mul['seq']}")}
    assert np.array_equal(load_dump(r.run_dir / t[("output", "0")]["dump_path"]), out * 2)
    assert t[("output", "0")]["max"] == float((out * 2).max())


def test_behaviour_is_unchanged_under_full_coverage(tmp_path: Path) -> None:
    """Errors, deferral, subclasses (one defined before start-up), scalars, lists, in place."""

    class Early(np.ndarray):  # defined before the probe patches ndarray
        pass

    class Defer:
        __array_ufunc__ = None

        def __radd__(self, other: object) -> str:
            return "deferred"

    def results() -> list[object]:
        out: list[object] = []
        a = np.arange(6.0).reshape(2, 3)
        for thunk in (
            lambda: np.ones(3) + np.ones(4),
            lambda: a + "x",
            lambda: a + Defer(),
            lambda: a + [1, 2, 3],
            lambda: np.float64(2.0) * a,
            lambda: a.view(Early) + 1,
            lambda: type(a.view(Early) + 1),
            lambda: np.matrix([[1, 2], [3, 4]]) * np.matrix([[1, 2], [3, 4]]),
            lambda: np.ma.masked_array([1.0, 2.0], mask=[0, 1]) * 3,
            lambda: (a > 2).sum(),
            lambda: a.reshape(-1).tolist(),
        ):
            try:
                v = thunk()
                out.append(repr(v) if not isinstance(v, np.ndarray) else (type(v), v.tobytes()))
            except Exception as e:
                out.append((type(e), str(e)))
        c = a.copy()
        ident = id(c)
        c *= 2
        out.append((id(c) == ident, c.tobytes()))
        return out

    before = results()
    pprobe.enable(mode="log", coverage="full", output=str(tmp_path / "out"))
    try:
        assert numpy_ndarray._installed
        during = results()
    finally:
        pprobe.disable()
    assert during == before


def test_disable_restores_ndarray_exactly(tmp_path: Path) -> None:
    d_before = dict(np.ndarray.__dict__)
    u_before = dict(np.ufunc.__dict__)
    pprobe.enable(mode="log", coverage="full", output=str(tmp_path / "out"))
    assert np.ndarray.__dict__["sum"] is not d_before["sum"]
    assert np.ufunc.__dict__["reduce"] is not u_before["reduce"]
    if core.native is not None:
        # the native engine leaves ndarray's slots alone and switches ufuncs' vectorcalls
        assert np.ndarray.__dict__["__add__"] is d_before["__add__"]
        assert core.native.is_hooked(np.add) and core.native.is_hooked(np.sum)
    else:
        assert np.ndarray.__dict__["__add__"] is not d_before["__add__"]
    pprobe.disable()
    d_after = dict(np.ndarray.__dict__)
    assert d_after.keys() == d_before.keys()
    assert all(d_after[k] is d_before[k] for k in d_before)
    u_after = dict(np.ufunc.__dict__)
    assert u_after.keys() == u_before.keys() and all(u_after[k] is u_before[k] for k in u_before)
    assert not _cpython.installed_types()
    if core.native is not None:
        assert not core.native.is_hooked(np.add) and not core.native.is_hooked(np.sum)
    assert np.add.__class__ is np.ufunc and type(np.add) is np.ufunc  # namespace restored too


def test_threads_lose_no_operator_row(tmp_path: Path) -> None:
    prog = """
        import threading
        import numpy as np
        a = np.ones(4); b = np.ones(4)
        def work():
            for _ in range(2000):
                a + b
                a.sum()
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
    """
    r = run_script(tmp_path, prog, env=FULL).check()
    counts = {
        x["op"]: x["n"]
        for x in sql(
            r.run_dir, "SELECT op, count(*) AS n, count(DISTINCT seq) AS s FROM ops GROUP BY op"
        )
    }
    assert counts["numpy.ndarray.__add__"] == 8000
    assert counts["numpy.ndarray.sum"] == 8000
    assert sql(r.run_dir, "SELECT count(*) = count(DISTINCT seq) AS ok FROM ops")[0]["ok"]


@pytest.mark.skipif(
    core.native is not None, reason="the Python engine's slot self-test; the native core has none"
)
def test_fallback_when_the_self_test_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_cpython, "selftest", lambda: (False, "simulated: unknown layout"))
    d_before = dict(np.ndarray.__dict__)
    run_dir = pprobe.enable(mode="log", coverage="auto", output=str(tmp_path / "out"))
    try:
        a = np.ones(3)
        a + a
        np.add(a, a)
    finally:
        pprobe.disable()
    assert all(np.ndarray.__dict__[k] is v for k, v in d_before.items())
    err = capsys.readouterr().err
    assert err.count("simulated: unknown layout") == 1
    assert "coverage is namespace" in err
    m = meta(run_dir)
    assert m["coverage"]["coverage"] == "namespace"
    assert [x["op"] for x in ops(run_dir)] == ["numpy.ones", "numpy.add"]


def test_namespace_coverage_on_request(tmp_path: Path) -> None:
    prog = """
        import numpy as np
        a = np.ones(3)
        a + a
        a.sum()
        np.add(a, a)
    """
    r = run_script(tmp_path, prog, env={"PPROBE_COVERAGE": "namespace", "PPROBE_MODE": "log"})
    r.check()
    assert [x["op"] for x in ops(r.run_dir)] == ["numpy.ones", "numpy.add"]
    assert meta(r.run_dir)["coverage"]["coverage"] == "namespace"
    assert "coverage" not in r.err  # asked for: nothing to warn about
    r2 = run_script(tmp_path / "full", prog, env=FULL).check()
    assert meta(r2.run_dir)["coverage"]["coverage"] == "full"
    assert [x["op"] for x in ops(r2.run_dir)] == [
        "numpy.ones", "numpy.ndarray.__add__", "numpy.ndarray.sum", "numpy.add"]  # fmt: skip


def test_in_process_threads_share_one_patch(tmp_path: Path) -> None:
    """Concurrent operators while enable() patches and disable() restores never misbehave."""
    stop = threading.Event()
    errors: list[BaseException] = []
    a = np.arange(5.0)

    def spin() -> None:
        while not stop.is_set():
            try:
                assert np.array_equal(operator.add(a, a), a * 2)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                return

    t = threading.Thread(target=spin)
    t.start()
    try:
        for _ in range(5):
            pprobe.enable(mode="log", coverage="full", output=str(tmp_path / "out"))
            pprobe.disable()
    finally:
        stop.set()
        t.join()
    assert not errors


def test_random_generator_methods_are_rows_and_hide_their_insides(tmp_path: Path) -> None:
    prog = """
        import numpy as np
        rng = np.random.default_rng(0)
        x = rng.standard_normal((3, 2))
        y = rng.integers(0, 5, size=4)
        np.save("x.npy", x)
    """
    r = run_script(tmp_path, prog, env=FULL).check()
    assert [x["op"] for x in ops(r.run_dir)] == [
        "numpy.random.Generator.standard_normal",
        "numpy.random.Generator.integers",
        "numpy.save",
    ]
    out = tensors(r.run_dir, "role = 'output'")
    assert [x["shape"] for x in out] == [[3, 2], [4]]
    expected = np.random.default_rng(0).standard_normal((3, 2))
    assert np.array_equal(np.load(tmp_path / "x.npy"), expected)
