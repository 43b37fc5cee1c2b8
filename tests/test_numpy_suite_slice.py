"""NumPy's own test suite under the probe: a slice of it gives the same outcome for every test.

``tools/numpy_suite.py --slice`` runs a few of the test modules shipped in the NumPy wheel
(operators and ndarray methods, ufuncs and their methods, indexing, stacking, overrides,
linalg, lib functions) without and with the probe (log mode, full coverage) and compares the
outcome of every test. The full comparison (numpy/_core, numpy/linalg, numpy/lib) is
``python tools/numpy_suite.py``; it takes too long for every CI run (about 40 minutes here).

Differences listed in the tool's ``EXPLAINED`` table (np.X is a proxy: identity checks such as
``pickle.loads(...) is np.cos``) are printed and allowed; any other difference fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, clean_env, run_script

TOOL = REPO / "tools" / "numpy_suite.py"


@pytest.mark.slow
def test_numpy_suite_slice_same_outcomes(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(TOOL), "--slice"],
        cwd=str(tmp_path),
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-20000:]
    assert "RESULT: same outcomes" in out, out[-20000:]
    # Both runs ran the slice (not an empty selection), and the probe recorded operators,
    # ndarray methods and ufuncs, not only np.* functions.
    table = out[out.index("== outcomes") :]
    total = next(line for line in table.splitlines() if line.startswith("total"))
    n_without, n_with = (int(x) for x in total.split()[1:3])
    assert n_without == n_with > 5000, table
    probe = next(line for line in out.splitlines() if line.startswith("== probe:"))
    for kind in ("operator ", "method ", "ufunc ", "function "):
        assert kind in probe, probe


# ---------------------------------------------------------------------------------------------
# What the full comparison found, one fast test each (the fixes in pprobe it led to).
def test_a_failing_call_numpy_makes_runs_once_and_is_not_pprobes_error(tmp_path: Path) -> None:
    import numpy as np

    import pprobe
    from pprobe import _report

    class Counting:
        calls = 0

        def __sub__(self, other: object) -> object:
            Counting.calls += 1
            raise TypeError("boom")

    def go() -> int:
        Counting.calls = 0
        with pytest.raises((TypeError, AssertionError)):
            np.testing.assert_array_equal(Counting(), Counting())
        return Counting.calls

    unprobed = go()
    pprobe.enable(mode="log", output=str(tmp_path / "out"))
    try:
        # numpy.testing's own np.* call raises: it used to be reported as pprobe's failure
        # ("internal error in recording inputs") and run a second time.
        assert go() == unprobed == 1
        assert _report.errors == []
    finally:
        pprobe.disable()


def test_buffered_rows_hold_no_dtype_or_class(tmp_path: Path) -> None:
    import numpy as np

    import pprobe
    from pprobe import recorder

    dt = np.dtype([("a", "f8"), ("b", "O")])
    a = np.ones(3)

    def calls() -> None:
        np.zeros(2, dtype=dt)
        a.astype(np.float32)
        np.add(a, a, dtype=np.dtype("f8"))

    pprobe.enable(mode="log", output=str(tmp_path / "out"), flush_seconds=3600)
    try:
        calls()  # first sight of each type: pprobe's per-type caches
        before = [sys.getrefcount(x) for x in (dt, np.float32, np.dtype("f8"))]
        n = len(recorder.buffer)
        calls()
        assert len(recorder.buffer) >= n + 3  # still buffered, not yet flushed
        after = [sys.getrefcount(x) for x in (dt, np.float32, np.dtype("f8"))]
        assert after == before  # NumPy's test_api.py / test_arrayobject.py count these
    finally:
        pprobe.disable()


def test_long_sequences_are_looked_into_up_to_a_bound(tmp_path: Path) -> None:
    import numpy as np

    import pprobe
    from pprobe import recorder, records, values

    a = np.ones(1)
    pprobe.enable(mode="log", output=str(tmp_path / "out"), flush_seconds=3600)
    try:
        out = np.concatenate((a,) * 100_000)
        heads, _descs, _objs, n = recorder.buffer.take()
        assert out.shape == (100_000,)
        op_dt, _ = records.numpy_dtypes()
        n_descs = int(np.frombuffer(heads, dtype=op_dt)["n_descs"][n - 1])
        assert n_descs == values.MAX_ELEMENTS + 1  # inputs looked into, and the output
    finally:
        pprobe.disable()


def test_resize_in_place_and_dispatcher_wrapped(tmp_path: Path) -> None:
    import numpy as np

    import pprobe

    impl = np.concatenate.__wrapped__  # the C function behind the dispatcher
    pprobe.enable(mode="log", output=str(tmp_path / "out"))
    try:
        a = np.zeros(3)
        a.resize(5)  # refcheck: NumPy counts the array's references
        assert a.shape == (5,)
        assert np.concatenate.__wrapped__ is impl
        assert impl.__text_signature__
    finally:
        pprobe.disable()


@pytest.mark.parametrize("coverage", ["full", "namespace"])
def test_c_code_reading_numpy_ufuncs_gets_the_originals(tmp_path: Path, coverage: str) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        # Its module init registers loops on np.add... via PyObject_GetAttrString + a cast.
        import numpy._core._rational_tests as rt
        assert np.add(rt.rational(1, 2), rt.rational(1, 3)) == rt.rational(5, 6)
        # Registers loops on numpy.multiply... when first called, and checks their type.
        from numpy._core._multiarray_umath import _get_sfloat_dtype
        SF = _get_sfloat_dtype()
        print(np.multiply(np.array([1.0], dtype=SF(2.0)), np.array([3.0], dtype=SF(1.0))))
        import numpy._core.umath as u
        try:
            u._add_newdoc_ufunc(np.add, "doc")
        except ValueError as e:  # as unprobed: a ufunc with a docstring already
            print("ValueError")
        print(type(np.add).__name__, type(np.multiply).__name__)
        """,
        env={"PPROBE_MODE": "log", "PPROBE_COVERAGE": coverage},
    )
    r.check()
    # Full coverage keeps NumPy's objects; namespace coverage has proxies there, and C code
    # reading them gets the originals.
    kind = "ufunc" if coverage == "full" else "UfuncProxy"
    assert r.out.splitlines()[-2:] == ["ValueError", f"{kind} {kind}"]
    assert not r.pprobe_lines(), r.err


def test_a_transient_difference_is_rerun_and_others_are_not(tmp_path: Path) -> None:
    """tools/numpy_suite.py reruns, probed, a TRANSIENT test whose outcome differed (NumPy's
    dtype refcount tests: pprobe's writer thread holds dtype references while it flushes);
    the same outcome as without the probe on the rerun counts as the same outcome. A
    difference in any other test is not rerun and fails the comparison."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import numpy_suite as ns
    finally:
        sys.path.pop(0)
    refs = "numpy/_core/tests/test_api.py::test___array___refcount"
    other = "numpy/_core/tests/test_api.py::test_copyto"
    assert ns.transient(refs) and not ns.transient(other)

    def run(outcomes: dict[str, str], label: str) -> ns.RunResult:
        res = {t: ns.Outcome(o) for t, o in outcomes.items()}
        return ns.RunResult(label, "numpy._core.tests.test_api", 1, 1.0, False, res, "", True)

    plain = [run({refs: "passed", other: "passed"}, "without")]
    probed = [run({refs: "failed", other: "passed"}, "with")]
    args = ns.parse_args(["--tests", "numpy._core.tests.test_api"])
    reruns = ns.rerun_transient(plain, probed, args, tmp_path, 0)  # a real probed pytest run
    assert reruns == {refs: ["passed"]}
    assert ns.probe_facts(tmp_path / "pprobe-runs")["rows"] > 0  # the rerun was probed
    facts = {"rows": 1, "errors": [], "by_kind": ns.Counter(), "coverage": {},
             "warnings": set(), "runs": 1, "processes": 1}  # fmt: skip
    assert ns.report(plain, probed, facts, 10, False, reruns) == 0
    # the same difference in a test that is not TRANSIENT: no rerun, a failed comparison
    probed = [run({refs: "passed", other: "failed"}, "with")]
    assert ns.rerun_transient(plain, probed, args, tmp_path, 5) == {}
    assert ns.report(plain, probed, facts, 10, False, {}) == 1
