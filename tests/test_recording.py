"""What is recorded: every ufunc and ufunc method, array functions of numpy and its public
submodules, names imported after start-up; outermost calls only (nested on request); never
pprobe's own work; no row lost or seq shared across threads; the caller column."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers import op_names, ops, run_script, write

#: Public modules and the name their functions are reported under (the documented namespaces).
PUBLIC = {
    "numpy": "numpy",
    "numpy.linalg": "numpy.linalg",
    "numpy.fft": "numpy.fft",
    "numpy.random": "numpy.random",
    "numpy.lib.scimath": "numpy.emath",
    "numpy.lib.stride_tricks": "numpy.lib.stride_tricks",
    "numpy.strings": "numpy.strings",
    "numpy.char": "numpy.char",
    "numpy.ma": "numpy.ma",
    "numpy.polynomial.polynomial": "numpy.polynomial.polynomial",
}


def test_every_ufunc_and_every_ufunc_method_is_a_row(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        NUMERIC = set("?bhilqBHILQefdgFDG")
        ufuncs = {}
        for name in dir(np):
            f = getattr(np, name)
            if isinstance(f, np.ufunc):
                ufuncs.setdefault(f.__name__, f)

        def inputs(f):
            for sig in f.types:
                ins = sig.split("->")[0]
                if set(ins) <= NUMERIC:
                    return [np.ones((2, 2), dtype=c) for c in ins]
            return [np.ones((2, 2))] * f.nin

        calls = []
        for name, f in sorted(ufuncs.items()):
            try:
                f(*inputs(f))
            except Exception:
                pass
            calls.append([name, "ufunc"])
        binary = [f for n, f in sorted(ufuncs.items()) if f.nin == 2 and f.nout == 1]
        for f in binary:
            a, b = inputs(f)
            for method, args in [
                ("reduce", (a,)),
                ("accumulate", (a,)),
                ("reduceat", (a.ravel(), [0, 2])),
                ("outer", (a[0], b[0])),
                ("at", (a.copy(), [0, 0], b[0, 0])),
            ]:
                try:
                    getattr(f, method)(*args)
                except Exception:
                    pass
                calls.append([f.__name__, "ufunc." + method])
        print(json.dumps(calls))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_EXCLUDE": "numpy.ones"},
    ).check()
    expected = [tuple(c) for c in json.loads(r.out)]
    assert len(expected) > 250  # ~90 ufuncs, ~40 binary ones with 5 methods each
    rows = ops(r.run_dir, "kind <> 'method'")  # a.copy(), a.ravel() are rows too
    got = [(row["ufunc"], row["kind"]) for row in rows]
    assert got == expected
    assert all(row["depth"] == 0 for row in rows)
    for row in rows:  # names: numpy.<public name>[.<method>]
        assert row["op"].startswith("numpy.")
        if row["kind"] != "ufunc":
            assert row["op"].endswith("." + row["kind"].split(".")[1])


@pytest.mark.parametrize("coverage", ["full", "namespace"])
def test_public_callables_are_probed_and_restored(tmp_path: Path, coverage: str) -> None:
    import importlib
    import inspect
    import types

    import numpy as np
    from numpy._core.overrides import ARRAY_FUNCTIONS

    import pprobe
    from pprobe.interceptors.numpy_namespace import HIDDEN, FunctionProxy, probed

    dispatchers = {id(f) for f in ARRAY_FUNCTIONS}
    mods = [importlib.import_module(m) for m in PUBLIC]
    before = {m.__name__: dict(vars(m)) for m in mods}
    funcs = [f for d in before.values() for f in d.values() if isinstance(f, types.FunctionType)]
    codes = [(f, f.__code__, "__signature__" in vars(f)) for f in funcs]

    def recordable(v: object) -> bool:
        return isinstance(v, np.ufunc) or id(v) in dispatchers

    pprobe.enable(mode="log", output=str(tmp_path / "out"), coverage=coverage)
    try:
        checked = in_place = 0
        for m in mods:
            for name, orig in before[m.__name__].items():
                if name.startswith("_") or name in HIDDEN:
                    continue
                now = getattr(m, name)
                if recordable(orig):
                    assert probed(now), f"{m.__name__}.{name} is not probed"
                    if coverage == "full" and not isinstance(orig, types.BuiltinFunctionType):
                        # NumPy's own object, recorded where it is (C builtins such as
                        # np.arange have neither a type nor code of their own: proxies)
                        assert now is orig
                        in_place += 1
                    else:
                        assert isinstance(now, FunctionProxy) and now._self_orig is orig
                    checked += 1
                elif coverage == "full" and isinstance(orig, types.FunctionType):
                    plain = not orig.__code__.co_freevars and not inspect.isgeneratorfunction(orig)
                    if orig.__module__.startswith("numpy") and plain:
                        assert now is orig and probed(now), f"{m.__name__}.{name}"
                        in_place += 1
        assert checked > 390  # 397 with NumPy 2.0, more with later versions
        assert coverage == "namespace" or in_place > 550
    finally:
        pprobe.disable()
    for m in mods:  # every original is back, nothing left behind
        for name, orig in before[m.__name__].items():
            assert getattr(m, name) is orig, f"{m.__name__}.{name} not restored"
            assert not probed(orig), f"{m.__name__}.{name} still probed"
        assert not [k for k, v in vars(m).items() if isinstance(v, FunctionProxy)]
        assert "__pprobe_patched__" not in vars(m)
    assert type(np.ufunc.__dict__["__call__"]).__name__ == "wrapper_descriptor"
    assert type(np.ufunc.__dict__["reduce"]).__name__ == "method_descriptor"
    assert all(f.__code__ is code and ("__signature__" in vars(f)) == sig for f, code, sig in codes)


def test_functions_of_public_submodules_are_rows(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        from numpy.lib import stride_tricks
        a = np.arange(6.0)
        m = a.reshape(2, 3)
        np.linalg.svd(m)
        np.linalg.solve(np.eye(2), np.ones(2))
        np.fft.ifft(a)
        np.emath.log(-1.0)
        stride_tricks.sliding_window_view(a, 2)
        np.strings.upper(np.array(["ab"]))
        np.char.join("-", np.array(["ab"]))
        np.ma.concatenate([np.ma.masked_where(a > 3, a), a])
        np.polynomial.polynomial.polyadd([1.0], [2.0])
        np.einsum("ij->j", m)
        np.where(a > 2, a, 0)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert op_names(r.run_dir, "kind NOT IN ('method', 'operator')") == [
        "numpy.arange",
        "numpy.linalg.svd",
        "numpy.eye",
        "numpy.ones",
        "numpy.linalg.solve",
        "numpy.fft.ifft",
        "numpy.emath.log",
        "numpy.lib.stride_tricks.sliding_window_view",
        "numpy.array",
        "numpy.strings.upper",
        "numpy.array",
        "numpy.char.join",
        "numpy.ma.masked_where",
        "numpy.ma.concatenate",
        "numpy.polynomial.polynomial.polyadd",
        "numpy.einsum",
        "numpy.where",
    ]


def test_names_imported_after_startup_are_recorded(tmp_path: Path) -> None:
    write(
        tmp_path / "mylib.py",
        """
        from numpy import add, sum as npsum
        from numpy.linalg import norm
        def f(x):
            return npsum(add(x, 1)), norm(x)
        """,
    )
    r = run_script(
        tmp_path,
        """
        import numpy as np
        from numpy import multiply
        from numpy.fft import rfft
        import mylib
        multiply(np.ones(2), 2)
        rfft(np.ones(4))
        mylib.f(np.ones(3))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert op_names(r.run_dir) == [
        "numpy.ones",
        "numpy.multiply",
        "numpy.ones",
        "numpy.fft.rfft",
        "numpy.ones",
        "numpy.add",
        "numpy.sum",
        "numpy.linalg.norm",
    ]


NESTING_PROG = """
    import numpy as np
    a = np.arange(10.0)
    np.mean(a)
    np.percentile(a, 50)
    np.linalg.norm(a)
    np.unique(np.concatenate([a, a]))
"""


def test_only_the_outermost_call_by_default(tmp_path: Path) -> None:
    r = run_script(tmp_path, NESTING_PROG, env={"PPROBE_MODE": "log"}).check()
    rows = ops(r.run_dir)
    assert [x["op"] for x in rows] == [
        "numpy.arange",
        "numpy.mean",
        "numpy.percentile",
        "numpy.linalg.norm",
        "numpy.concatenate",
        "numpy.unique",
    ]
    assert {(x["depth"], x["parent"]) for x in rows} == {(0, None)}


def test_nested_gives_depth_and_parent(tmp_path: Path) -> None:
    r = run_script(tmp_path, NESTING_PROG, env={"PPROBE_MODE": "log", "PPROBE_NESTED": "1"})
    rows = ops(r.check().run_dir)
    top = [x["op"] for x in rows if x["depth"] == 0]
    assert top == [
        "numpy.arange",
        "numpy.mean",
        "numpy.percentile",
        "numpy.linalg.norm",
        "numpy.concatenate",
        "numpy.unique",
    ]
    by_seq = {x["seq"]: x for x in rows}
    assert len(by_seq) == len(rows)
    inner = [x for x in rows if x["depth"] > 0]
    assert inner, "np.percentile calls np.* functions inside: they must be rows with nesting on"
    for x in rows:
        if x["depth"] == 0:
            assert x["parent"] is None
            continue
        p = by_seq[x["parent"]]
        assert p["depth"] == x["depth"] - 1
        assert p["seq"] < x["seq"]
        assert p["ts_ns"] <= x["ts_ns"]
        assert x["ts_ns"] + x["dur_ns"] <= p["ts_ns"] + p["dur_ns"]
    assert {by_seq[x["parent"]]["op"] for x in inner if x["depth"] == 1} >= {"numpy.percentile"}


def test_pprobes_own_numpy_work_never_appears(tmp_path: Path) -> None:
    prog = """
        import numpy as np
        a = np.array([1.0, np.nan, np.inf, -2.0])
        c = np.array([1 + 2j, np.nan])
        b = np.add(a, c[:1])
        np.multiply(np.array([True, False]), 3)
        np.negative(np.array([], dtype=np.float32))
        np.add(np.zeros((2, 0)), 1)
        np.sum(np.ma.masked_where([False, True], [1.0, 2.0]))
    """
    expected = [
        "numpy.array",
        "numpy.array",
        "numpy.add",
        "numpy.array",
        "numpy.multiply",
        "numpy.array",
        "numpy.negative",
        "numpy.zeros",
        "numpy.add",
        "numpy.ma.masked_where",
        "numpy.sum",
    ]

    # log mode does no NumPy work of its own (no statistics, no dumps): the reference.
    def rows_for(mode: str, nested: str) -> list[tuple]:
        r = run_script(
            tmp_path,
            prog,
            env={"PPROBE_MODE": mode, "PPROBE_NESTED": nested},
            output=tmp_path / f"{mode}{nested}",
        ).check()
        assert r.pprobe_lines() == []
        rows = ops(r.run_dir)
        pos = {x["seq"]: i for i, x in enumerate(rows)}
        return [(x["op"], x["depth"], pos.get(x["parent"])) for x in rows]

    for nested in ("0", "1"):
        reference = rows_for("log", nested)
        assert [x[0] for x in reference if x[1] == 0] == expected
        assert (nested == "1") == any(x[1] > 0 for x in reference)
        # statistics (isfinite, count_nonzero, abs, ...) and dumps (numpy.lib.format) run
        # inside pprobe: the same rows, nested or not, with the same parents.
        assert rows_for("stats", nested) == reference
        assert rows_for("dump", nested) == reference


def test_threads_lose_no_row_and_never_share_a_seq(tmp_path: Path) -> None:
    n_threads, n_calls = 8, 400
    r = run_script(
        tmp_path,
        f"""
        import threading
        import numpy as np
        a = np.ones(4)
        barrier = threading.Barrier({n_threads})
        def work(t):
            barrier.wait()
            for i in range({n_calls}):
                np.add(a, t * 100000 + i)
        ts = [threading.Thread(target=work, args=(t,), name=f"worker-{{t}}")
              for t in range({n_threads})]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        """,
        env={"PPROBE_MODE": "log", "PPROBE_FLUSH_ROWS": "500", "PPROBE_FLUSH_SECONDS": "0.05"},
    ).check()
    rows = ops(r.run_dir, "op = 'numpy.add'")
    assert len(rows) == n_threads * n_calls
    codes = [int(re.fullmatch(r"1=(\d+)", x["args"]).group(1)) for x in rows]
    assert sorted(codes) == sorted(t * 100000 + i for t in range(n_threads) for i in range(n_calls))
    all_seqs = [x["seq"] for x in ops(r.run_dir)]
    assert len(set(all_seqs)) == len(all_seqs)
    thread_of: dict[int, set[str]] = {}
    for code, x in zip(codes, rows):
        thread_of.setdefault(code // 100000, set()).add(x["thread"])
    assert all(len(v) == 1 for v in thread_of.values())
    assert len({next(iter(v)) for v in thread_of.values()}) == n_threads


def test_thread_column_names_threads_that_ended_before_the_flush(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import threading
        import numpy as np
        t = threading.Thread(target=lambda: np.add(np.ones(2), 1), name="short-lived")
        t.start()
        t.join()
        np.add(np.ones(2), 2)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    threads = [x["thread"] for x in ops(r.run_dir, "op = 'numpy.add'")]
    assert threads == ["short-lived", "MainThread"]


def test_threads_keep_their_names_when_thread_ids_are_reused(tmp_path: Path) -> None:
    # Short-lived threads one after the other: the OS hands the same ids out again, and a
    # later thread must not lend its name to an earlier one's rows.
    r = run_script(
        tmp_path,
        """
        import threading
        import numpy as np
        ids = set()
        for k in range(8):
            t = threading.Thread(target=lambda k=k: np.add(np.ones(2), k), name=f"worker-{k}")
            t.start()
            t.join()
            ids.add(t.ident)
        print(len(ids))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "60"},
    ).check()
    assert int(r.out.split()[-1]) < 8  # ids were reused: the case this test is about
    rows = ops(r.run_dir, "op = 'numpy.add'")
    assert [x["thread"] for x in rows] == [f"worker-{k}" for k in range(8)]
    assert [x["args"] for x in rows] == [f"1={k}" for k in range(8)]


def test_caller_points_at_the_users_file_and_line(tmp_path: Path) -> None:
    lib = write(
        tmp_path / "mylib.py",
        """
        import numpy as np
        def helper(x):
            return np.add(x, 1)  # LIB-ADD
        """,
    )
    prog = """
        import numpy as np
        import mylib
        a = np.ones(3)  # MAIN-ONES
        def f(x):
            return np.mean(x)  # MAIN-MEAN
        f(a)
        mylib.helper(a)
        vals = [np.percentile(a, q) for q in (10, 90)]  # MAIN-PCT
    """
    for nested in ("0", "1"):
        r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log", "PPROBE_NESTED": nested})
        rows = ops(r.check().run_dir)
        script = tmp_path / "prog.py"

        def line_of(path: Path, marker: str) -> str:
            lines = path.read_text().splitlines()
            return f"{path}:{next(i for i, s in enumerate(lines, 1) if marker in s)}"

        want = {
            "numpy.ones": (line_of(script, "MAIN-ONES"), "<module>"),
            "numpy.mean": (line_of(script, "MAIN-MEAN"), "f"),
            "numpy.add": (line_of(lib, "LIB-ADD"), "helper"),
            # Python 3.12 inlines comprehensions (PEP 709): no frame of their own.
            "numpy.percentile": (
                line_of(script, "MAIN-PCT"),
                "<listcomp>" if sys.version_info < (3, 12) else "<module>",
            ),
        }
        top = [x for x in rows if x["depth"] == 0]
        assert [x["op"] for x in top] == [
            "numpy.ones",
            "numpy.mean",
            "numpy.add",
            "numpy.percentile",
            "numpy.percentile",
        ]
        for x in top:
            assert (x["caller"], x["caller_function"]) == want[x["op"]]
        # Calls NumPy makes inside are attributed to the user's line that led to them.
        by_seq = {x["seq"]: x for x in rows}
        for x in rows:
            top = x
            while top["depth"] > 0:
                top = by_seq[top["parent"]]
            assert x["caller"] == top["caller"], x
        assert nested == "0" or any(x["depth"] > 0 for x in rows)


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_uninitialised_outputs_get_no_statistics_and_no_dump(tmp_path: Path, mode: str) -> None:
    from helpers import sql

    r = run_script(
        tmp_path,
        """
        import numpy as np
        a = np.empty((30, 40))
        b = np.empty_like(a)
        a.fill(1.5)
        c = np.add(a, 1.0)
        z = np.zeros_like(a)
        """,
        env={"PPROBE_MODE": mode},
    ).check()
    rows = sql(
        r.run_dir,
        "SELECT o.op, t.role, t.min, t.max, t.nan_count, t.dump_path, t.note "
        "FROM ops o JOIN tensors t USING (pid, seq) WHERE t.role = 'output' ORDER BY o.seq",
    )
    by_op = {x["op"]: x for x in rows}
    for name in ("numpy.empty", "numpy.empty_like"):
        x = by_op[name]
        assert (x["min"], x["max"], x["nan_count"], x["dump_path"]) == (None, None, None, None)
        assert x["note"] == "uninitialised memory: no statistics, not dumped"
    for name, value in (("numpy.add", 2.5), ("numpy.zeros_like", 0.0)):
        x = by_op[name]
        assert x["min"] == x["max"] == value and x["note"] is None
        assert (x["dump_path"] is not None) == (mode == "dump")
