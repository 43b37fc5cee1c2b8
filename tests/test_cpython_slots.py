"""Tests of pprobe._cpython alone: operator slots and method replacement on numpy.ndarray.

Every test that patches uses the ``probe`` fixture, which restores everything afterwards, so
the rest of the test suite sees an untouched NumPy.  Results are compared with the same
computation done *before* the patch, bit for bit (dtype, shape, bytes, type, mask) and, for
errors, exception type and message.
"""

from __future__ import annotations

import operator
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

from pprobe import _cpython as cp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("sum", "reshape", "astype", "mean")
FIELDS = sorted(set(cp.SLOT_OF.values()))


class EarlySub(np.ndarray):
    """A user subclass that exists before any patch."""


class EarlyOverride(np.ndarray):
    """A user subclass, defined before any patch, with its own ``__add__``."""

    def __add__(self, other: Any) -> Any:
        return "EarlyOverride.__add__"


class EarlyChild(EarlyOverride):
    """Inherits the override from its parent, the rest from ndarray."""


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


class Probe:
    """Counting wrappers around ndarray's original slot wrappers and methods."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        d = np.ndarray.__dict__
        assert all(type(d[n]).__name__ == "wrapper_descriptor" for n in cp.OPERATOR_DUNDERS)
        self.funcs = {n: self._wrap(n, d[n]) for n in cp.OPERATOR_DUNDERS}
        self.methods = {n: self._wrap(n, d[n]) for n in METHODS}

    def _wrap(self, name: str, orig: Any) -> Callable[..., Any]:
        counts, lock = self.counts, self.lock

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock:
                counts[name] += 1
            return orig(*args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper

    def install(self) -> None:
        cp.install_operator_slots(np.ndarray, self.funcs)
        for name, func in self.methods.items():
            cp.set_type_attr(np.ndarray, name, func)

    def take(self) -> Counter[str]:
        with self.lock:
            out = Counter(self.counts)
            self.counts.clear()
        return out


@pytest.fixture
def probe() -> Any:
    assert not cp.installed_types()
    p = Probe()
    yield p
    cp.restore_all()
    assert not cp.installed_types()


def norm(x: Any) -> Any:
    """A comparable, bit-exact description of a result or an exception."""
    if isinstance(x, BaseException):
        return ("raise", type(x), str(x))
    if isinstance(x, np.ma.MaskedArray):
        return ("masked", type(x), norm(x.data), norm(np.ma.getmaskarray(x)))
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            return ("objarr", type(x), x.shape, repr(x.tolist()))
        return ("arr", type(x), x.dtype.str, x.shape, x.strides, x.tobytes())
    if isinstance(x, np.generic):
        return ("scalar", type(x), x.dtype.str, x.tobytes())
    if isinstance(x, tuple):
        return ("tuple", tuple(norm(i) for i in x))
    return ("py", type(x), repr(x))


def evaluate(thunk: Callable[[], Any]) -> Any:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return norm(thunk())
        except Exception as exc:
            return norm(exc)


def operands() -> dict[str, Any]:
    """Fresh operands (in-place cases mutate them)."""
    return {
        "f2d": np.arange(12.0).reshape(3, 4) / 7 - 0.5,
        "f1d": np.linspace(-2, 2, 4),
        "i2d": np.arange(12).reshape(3, 4) - 5,
        "i1d": np.array([1, 2, 3, 4]),
        "u8": np.array([1, 200, 3, 7], dtype=np.uint8),
        "b1d": np.array([True, False, True, True]),
        "c1d": np.array([1 + 2j, -1j, 0.5, 3]),
        "z0f": np.array(2.5),
        "z0i": np.array(3),
        "sf64": np.float64(1.5),
        "si32": np.int32(3),
        "su64": np.uint64(2),
        "sbool": np.bool_(True),
        "pint": 3,
        "pfloat": -0.75,
        "pcomplex": 1j,
        "pbool": True,
        "list": [1, 2, 3, 4],
        "nested": [[1], [2], [3]],
        "str": "x",
    }


ARRAYS = ("f2d", "f1d", "i2d", "i1d", "u8", "b1d", "c1d", "z0f", "z0i")
OTHERS = ("sf64", "si32", "su64", "sbool", "pint", "pfloat", "pcomplex", "pbool", "list")
OTHERS += ("nested", "str")
BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "matmul": operator.matmul, "and": operator.and_,
    "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
    "rshift": operator.rshift, "divmod": divmod,
}  # fmt: skip
INPLACE = {
    "iadd": operator.iadd, "isub": operator.isub, "imul": operator.imul,
    "itruediv": operator.itruediv, "ifloordiv": operator.ifloordiv, "imod": operator.imod,
    "ipow": operator.ipow, "imatmul": operator.imatmul, "iand": operator.iand,
    "ior": operator.ior, "ixor": operator.ixor, "ilshift": operator.ilshift,
    "irshift": operator.irshift,
}  # fmt: skip
COMPARE = {
    "lt": operator.lt, "le": operator.le, "eq": operator.eq,
    "ne": operator.ne, "gt": operator.gt, "ge": operator.ge,
}  # fmt: skip
UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}


def operator_cases() -> list[tuple[str, Callable[[], Any]]]:
    cases: list[tuple[str, Callable[[], Any]]] = []

    def binary(label: str, op: Callable[..., Any], x: str, y: str) -> None:
        cases.append((label, lambda: op(operands()[x], operands()[y])))

    def inplace(label: str, op: Callable[..., Any], x: str, y: str) -> None:
        def run() -> Any:
            ops = operands()
            target = ops[x]
            result = op(target, ops[y])
            return result, ("same object", result is target), target

        cases.append((label, run))

    for name, op in {**BINARY, **COMPARE}.items():
        for x in ARRAYS:
            for y in ARRAYS + OTHERS:
                binary(f"{x} {name} {y}", op, x, y)
                if y in OTHERS:
                    binary(f"{y} {name} {x}", op, y, x)
    for name, op in INPLACE.items():
        for x in ARRAYS:
            for y in ARRAYS + OTHERS:
                inplace(f"{x} {name} {y}", op, x, y)
    for name, op in UNARY.items():
        for x in ARRAYS:
            binary(f"{name} {x}", lambda a, _b, op=op: op(a), x, x)
    cases.append(("pow3", lambda: pow(operands()["i1d"], 2, 3)))
    cases.append(("scalar+list", lambda: np.float64(1) + [1, 2]))
    cases.append(("int64+uint64", lambda: np.int64(1) + np.uint64(2)))
    cases.append(("broadcast error", lambda: np.ones(3) + np.ones(4)))
    return cases


def outcomes(cases: list[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
    return {label: evaluate(thunk) for label, thunk in cases}


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    bad = [label for label in before if before[label] != after[label]]
    assert not bad, f"{len(bad)} differ, e.g. {bad[:5]}: {before[bad[0]]} != {after[bad[0]]}"


def slot_snapshot(types_: list[type]) -> dict[type, Any]:
    out = {}
    for tp in types_:
        nb_ptr = cp._PyTypeObject.from_address(id(tp)).tp_as_number
        slots = {field: cp._current_slot(tp, field) for field in FIELDS}
        out[tp] = (dict(tp.__dict__), slots, nb_ptr)
    return out


def assert_snapshot_equal(before: dict[type, Any], after: dict[type, Any]) -> None:
    for tp, (d0, slots0, ptr0) in before.items():
        d1, slots1, ptr1 = after[tp]
        assert d0.keys() == d1.keys(), tp
        assert all(d0[k] is d1[k] for k in d0), tp
        assert slots0 == slots1, tp
        assert ptr0 == ptr1, tp


# ---------------------------------------------------------------------------------------------
# selftest
# ---------------------------------------------------------------------------------------------


def test_selftest_true_and_cheap() -> None:
    ok, why = cp.selftest()
    assert ok, why
    fresh = []
    for _ in range(5):
        t0 = time.perf_counter()
        ok2, _why, layout = cp._run_selftest()
        fresh.append(time.perf_counter() - t0)
        assert ok2 and layout is not None
    assert min(fresh) < 0.005


def test_selftest_does_not_import_numpy_and_touches_nothing() -> None:
    code = (
        "import sys; from pprobe import _cpython as c; before = dict(int.__dict__); "
        "print(c.selftest()[0], 'numpy' in sys.modules, "
        "all(before[k] is v for k, v in int.__dict__.items()))"
    )
    # -S -E: no site hooks, no PYTHON* variables; the repository root is the cwd
    out = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code], capture_output=True, text=True, cwd=ROOT
    )
    assert out.stdout.split() == ["True", "False", "True"], out.stderr


def test_selftest_false_means_nothing_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cp, "selftest", lambda: (False, "pretend unsupported"))
    before = dict(np.ndarray.__dict__)
    with pytest.raises(RuntimeError, match="pretend unsupported"):
        cp.install_operator_slots(np.ndarray, {"__add__": lambda a, b: 0})
    with pytest.raises(RuntimeError, match="pretend unsupported"):
        cp.set_type_attr(np.ndarray, "sum", lambda a: 0)
    assert all(before[k] is v for k, v in np.ndarray.__dict__.items())
    assert not cp.installed_types()


# ---------------------------------------------------------------------------------------------
# Operators: identical results and errors
# ---------------------------------------------------------------------------------------------


def test_every_operator_bit_identical(probe: Probe) -> None:
    cases = operator_cases()
    before = outcomes(cases)
    probe.install()
    after = outcomes(cases)
    assert_same(before, after)
    counts = probe.take()
    for name in cp.OPERATOR_DUNDERS:
        assert counts[name] > 0, name


def test_inplace_is_really_in_place(probe: Probe) -> None:
    probe.install()
    a = np.arange(6.0)
    view = a[::2]
    alias = a
    a += 1
    assert a is alias
    assert a.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    view *= 10  # writes through to the base array
    assert a.tolist() == [10.0, 2.0, 30.0, 4.0, 50.0, 6.0]
    i = np.arange(3)
    with pytest.raises(TypeError, match="Cannot cast ufunc"):
        i += 0.5
    assert probe.take() == Counter({"__iadd__": 2, "__imul__": 1})


def test_exactly_one_call_per_operator(probe: Probe) -> None:
    a, b = np.arange(1.0, 4.0), np.arange(4.0, 7.0)
    probe.install()
    expected = {
        "__add__": lambda: a + b, "__radd__": lambda: 1 + a, "__sub__": lambda: a - 1,
        "__rsub__": lambda: [1, 2, 3] - a, "__mul__": lambda: a * b,
        "__rtruediv__": lambda: 1.0 / a, "__matmul__": lambda: a @ b,
        "__rmatmul__": lambda: [1, 2, 3] @ a, "__divmod__": lambda: divmod(a, 2),
        "__rdivmod__": lambda: divmod(2, a), "__pow__": lambda: pow(a, 2),
        "__rpow__": lambda: 2**a, "__neg__": lambda: -a, "__abs__": lambda: abs(a),
        "__lt__": lambda: a < b, "__eq__": lambda: a == b, "__le__": lambda: 2 >= a,
    }  # fmt: skip
    for name, thunk in expected.items():
        thunk()
        assert probe.take() == Counter({name: 1}), name


def test_errors_propagate_unchanged(probe: Probe) -> None:
    cases = [
        ("broadcast", lambda: np.ones(3) + np.ones(4)),
        ("str", lambda: np.ones(3) + "x"),
        ("rstr", lambda: "x" + np.ones(3)),
        ("matmul", lambda: np.ones(3) @ np.ones(4)),
        ("pow3", lambda: pow(np.ones(3), 2, 3)),
        ("shift float", lambda: np.ones(3) << 1),
        ("invert float", lambda: ~np.ones(3)),
        ("cast", lambda: operator.iadd(np.arange(3), 0.5)),
        ("compare", lambda: np.ones(3) < np.ones(4)),
        ("object", lambda: np.array([object()]) + 1),
    ]
    before = outcomes(cases)
    assert all(v[0] == "raise" for v in before.values()), before
    probe.install()
    assert_same(before, outcomes(cases))


# ---------------------------------------------------------------------------------------------
# NotImplemented deferral
# ---------------------------------------------------------------------------------------------


class Deferrer:
    __array_ufunc__ = None

    def __radd__(self, other: Any) -> Any:
        return ("Deferrer.__radd__", type(other).__name__)

    def __rmatmul__(self, other: Any) -> Any:
        return ("Deferrer.__rmatmul__", type(other).__name__)

    def __gt__(self, other: Any) -> Any:  # reflected a < d
        return ("Deferrer.__gt__", type(other).__name__)


class Priority:
    __array_priority__ = 1000

    def __radd__(self, other: Any) -> Any:
        return ("Priority.__radd__", type(other).__name__)

    def __rsub__(self, other: Any) -> Any:
        return ("Priority.__rsub__", type(other).__name__)


class Plain:
    def __radd__(self, other: Any) -> Any:
        return "Plain.__radd__"


def test_notimplemented_deferral(probe: Probe) -> None:
    a = np.arange(3.0)
    cases = [
        ("array_ufunc None radd", lambda: a + Deferrer()),
        ("array_ufunc None rmatmul", lambda: a @ Deferrer()),
        ("array_ufunc None compare", lambda: a < Deferrer()),
        ("array_ufunc None iadd", lambda: operator.iadd(a.copy(), Deferrer())),
        ("priority radd", lambda: a + Priority()),
        ("priority rsub", lambda: a - Priority()),
        ("plain radd (object array)", lambda: a + Plain()),
        ("scalar + deferrer", lambda: np.float64(1) + Deferrer()),
    ]
    before = outcomes(cases)
    assert before["array_ufunc None radd"] == norm(("Deferrer.__radd__", "ndarray"))
    assert before["array_ufunc None rmatmul"] == norm(("Deferrer.__rmatmul__", "ndarray"))
    probe.install()
    assert_same(before, outcomes(cases))
    counts = probe.take()
    assert counts["__add__"] >= 2 and counts["__matmul__"] == 1


# ---------------------------------------------------------------------------------------------
# Subclasses
# ---------------------------------------------------------------------------------------------


def subclass_cases(tmp_path: Path) -> list[tuple[str, Callable[[], Any]]]:
    def mm() -> Any:
        m = np.memmap(tmp_path / "mm.bin", dtype=np.float64, mode="w+", shape=(4,))
        m[:] = [1, 2, 3, 4]
        return m

    def early() -> Any:
        return np.arange(4.0).view(EarlySub)

    def masked() -> Any:
        return np.ma.array([1.0, 2.0, 3.0, 4.0], mask=[0, 1, 0, 0])

    m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    sq = np.array([[0.0, 1.0], [1.0, 0.0]])
    return [
        ("matrix * matrix", lambda: m * m),
        ("ndarray * matrix", lambda: sq * m),
        ("matrix * ndarray", lambda: m * sq),
        ("matrix ** 2", lambda: m**2),
        ("matrix + 1", lambda: m + 1),
        ("matrix > 2", lambda: m > 2),
        ("-matrix", lambda: -m),
        ("masked + 1", lambda: masked() + 1),
        ("1 + masked", lambda: 1 + masked()),
        ("ndarray + masked", lambda: np.ones(4) + masked()),
        ("masked * masked", lambda: masked() * masked()),
        ("-masked", lambda: -masked()),
        ("masked > 1", lambda: masked() > 1),
        ("masked & ndarray", lambda: masked().astype(int) & np.ones(4, int)),
        ("masked iadd", lambda: operator.iadd(masked(), 1)),
        ("memmap + 1", lambda: mm() + 1),
        ("memmap == memmap", lambda: mm() == mm()),
        ("recarray", lambda: np.arange(3.0).view(np.recarray) * 2),
        ("chararray", lambda: np.char.array(["a", "b"]) + "c"),
        ("chararray eq", lambda: np.char.array(["a", "b"]) == "a"),
        ("early + early", lambda: early() + early()),
        ("early - 1", lambda: early() - 1),
        ("1 - early", lambda: 1 - early()),
        ("ndarray + early", lambda: np.ones(4) + early()),
        ("early < 2", lambda: early() < 2),
        ("override + override", lambda: np.ones(2).view(EarlyOverride) + 1),
        ("override - 1", lambda: np.ones(2).view(EarlyOverride) - 1),
        ("child + 1", lambda: np.ones(2).view(EarlyChild) + 1),
        ("child * 2", lambda: np.ones(2).view(EarlyChild) * 2),
    ]


def test_numpy_subclasses_identical(probe: Probe, tmp_path: Path) -> None:
    cases = subclass_cases(tmp_path)
    before = outcomes(cases)
    assert before["matrix * matrix"] == norm(np.matrix([[7.0, 10.0], [15.0, 22.0]]))
    assert before["masked + 1"][0] == "masked"
    probe.install()
    after = outcomes(cases)
    assert_same(before, after)


def test_existing_subclasses_see_new_operators(probe: Probe, tmp_path: Path) -> None:
    probe.install()
    e = np.arange(3.0).view(EarlySub)
    assert type(e + e) is EarlySub
    assert probe.take() == Counter({"__add__": 1})
    assert type(1 - e) is EarlySub and probe.take() == Counter({"__rsub__": 1})
    assert (e < 2).tolist() == [True, True, False] and probe.take() == Counter({"__lt__": 1})
    m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    m + m
    assert probe.take()["__add__"] == 1
    m * m  # matrix.__mul__ (its own) is a matrix product through np.dot
    assert probe.take()["__mul__"] == 0
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float64, mode="w+", shape=(3,))
    mm + 1
    assert probe.take()["__add__"] == 1
    np.arange(3.0).view(np.recarray) * 2
    assert probe.take()["__mul__"] == 1
    ma = np.ma.array([1.0, 2.0], mask=[0, 1])
    r = -ma  # MaskedArray does not define __neg__: the base's is used
    assert probe.take()["__neg__"] == 1
    assert r.tolist() == [-1.0, None]


def test_subclass_override_is_kept(probe: Probe) -> None:
    probe.install()
    o = np.ones(2).view(EarlyOverride)
    assert o + o == "EarlyOverride.__add__"
    assert np.ones(2).view(EarlyChild) + 1 == "EarlyOverride.__add__"
    assert probe.take()["__add__"] == 0
    assert type(o - 1) is EarlyOverride and probe.take() == Counter({"__sub__": 1})
    assert type(1 + o) is EarlyOverride and probe.take() == Counter({"__radd__": 1})


def test_subclass_defined_after_patch(probe: Probe) -> None:
    orig_add = cp._current_slot(np.ndarray, "nb_add")
    probe.install()

    class Late(np.ndarray):
        pass

    class LateOverride(np.ndarray):
        def __sub__(self, other: Any) -> Any:
            return "LateOverride.__sub__"

    late = np.arange(3.0).view(Late)
    assert type(late + late) is Late and probe.take() == Counter({"__add__": 1})
    assert type(-late) is Late and probe.take() == Counter({"__neg__": 1})
    lo = np.arange(3.0).view(LateOverride)
    assert lo - 1 == "LateOverride.__sub__" and probe.take()["__sub__"] == 0
    assert type(lo * 2) is LateOverride and probe.take() == Counter({"__mul__": 1})
    cp.restore_all()
    # restored like CPython would have built them: C function, unless overridden
    assert cp._current_slot(Late, "nb_add") == orig_add
    assert (
        cp._current_slot(LateOverride, "nb_subtract")
        == cp._layout_or_raise().generic["nb_subtract"]
    )
    assert type(late + late) is Late and lo - 1 == "LateOverride.__sub__"
    assert not probe.take()


def test_subclasses_false_leaves_subclasses_alone(probe: Probe) -> None:
    before = slot_snapshot([EarlySub, np.matrix])
    e = np.arange(3.0).view(EarlySub)
    expected = norm(e + e), norm(np.ones(3) + e)
    cp.install_operator_slots(np.ndarray, probe.funcs, subclasses=False)
    assert slot_snapshot([EarlySub, np.matrix]).keys() == before.keys()
    assert_snapshot_equal(before, slot_snapshot([EarlySub, np.matrix]))
    assert (norm(e + e), norm(np.ones(3) + e)) == expected
    assert probe.take()["__add__"] == 0  # C slots used directly: same result, not routed
    np.ones(3) + np.ones(3)
    assert probe.take() == Counter({"__add__": 1})
    assert cp.original(np.ndarray, "__add__") is not np.ndarray.__dict__["__add__"]
    assert type(cp.original(np.ndarray, "__add__")).__name__ == "wrapper_descriptor"


class NoUfuncs(np.ndarray):
    """An ndarray subclass that disables ufuncs (see Limits in pprobe._cpython)."""

    __array_ufunc__ = None


def test_known_limit_subclass_without_ufuncs(probe: Probe) -> None:
    cases = [
        ("a + s", lambda: np.ones(2) + np.ones(2).view(NoUfuncs)),
        ("s + a", lambda: np.ones(2).view(NoUfuncs) + np.ones(2)),
        ("1 + s", lambda: 1 + np.ones(2).view(NoUfuncs)),
        ("a < s", lambda: np.ones(2) < np.ones(2).view(NoUfuncs)),
    ]
    before = outcomes(cases)
    cp.install_operator_slots(np.ndarray, probe.funcs, subclasses=False)
    assert_same(before, outcomes(cases))  # not routed: identical
    cp.restore_all()
    cp.install_operator_slots(np.ndarray, probe.funcs)
    after = outcomes(cases)
    for label in before:  # routed: still TypeError, only two messages differ
        assert before[label][:2] == after[label][:2] == ("raise", TypeError)
    assert before["s + a"] == after["s + a"] and before["a < s"] == after["a < s"]


# ---------------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------------


def test_threads_lose_no_count(probe: Probe) -> None:
    probe.install()
    a, b = np.ones(10), np.ones(10)
    n_threads, n_calls = 4, 10_000
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(n_calls):
                r = a + b
            assert r[0] == 2.0
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert probe.take() == Counter({"__add__": n_threads * n_calls})


def test_install_and_restore_while_threads_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patching and restoring under running threads: every result stays right.

    ``PyType_Modified`` is delayed so that other threads surely run between the type-dict
    writes and the cache invalidation: the replaced functions must stay alive until then
    (they are only referenced by the type dict here, as ``Probe()`` is not kept).
    """
    type_modified = cp._type_modified

    def slow_type_modified(tp: type) -> None:
        time.sleep(0.0002)
        type_modified(tp)

    monkeypatch.setattr(cp, "_type_modified", slow_type_modified)
    a, b = np.arange(10.0), np.ones(10)
    expected = ((a + b).tobytes(), float(a.sum()), (a < b).tolist(), (-a).tobytes())
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def work() -> None:
        try:
            while not stop.is_set():
                got = ((a + b).tobytes(), float(a.sum()), (a < b).tolist(), (-a).tobytes())
                assert got == expected
                done[0] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=work) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for _ in range(30):
            Probe().install()
            time.sleep(0.001)
            cp.restore_all()
            time.sleep(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(interval)
        cp.restore_all()
    assert not errors
    assert done[0] > 0


def test_heap_type_path() -> None:
    """A heap type's embedded PyNumberMethods is written in place; its subclass follows."""

    class H(int):
        pass

    class HSub(H):
        pass

    calls: list[int] = []
    orig = int.__dict__["__add__"]

    def __add__(self: Any, other: Any) -> Any:
        calls.append(1)
        return orig(self, other)

    before = cp._current_slot(H, "nb_add")
    assert before == cp._current_slot(HSub, "nb_add") == cp._current_slot(int, "nb_add")
    cp.install_operator_slots(H, {"__add__": __add__})
    try:
        assert H(1) + 2 == 3 and HSub(1) + 2 == 3 and 2 + H(1) == 3
        assert len(calls) == 2  # 2 + H(1) is int's own nb_add; int is untouched
    finally:
        cp.restore(H)
    assert cp._current_slot(H, "nb_add") == before == cp._current_slot(HSub, "nb_add")
    assert "__add__" not in H.__dict__ and H(1) + 2 == 3 and len(calls) == 2


# ---------------------------------------------------------------------------------------------
# Methods replaced through set_type_attr
# ---------------------------------------------------------------------------------------------


def method_cases() -> list[tuple[str, Callable[[], Any]]]:
    def f() -> Any:
        return np.arange(12.0).reshape(3, 4) / 3

    return [
        ("sum", lambda: f().sum()),
        ("sum axis", lambda: f().sum(axis=0)),
        ("sum kw", lambda: f().sum(axis=1, dtype=np.float32, keepdims=True)),
        ("reshape", lambda: f().reshape(2, 6)),
        ("reshape tuple", lambda: f().reshape((4, -1), order="F")),
        ("reshape error", lambda: f().reshape(5)),
        ("astype", lambda: f().astype(np.int32)),
        ("astype error", lambda: f().astype("no such dtype")),
        ("mean", lambda: f().mean()),
        ("mean axis", lambda: f().mean(axis=1)),
        ("np.mean", lambda: np.mean(f())),
        ("matrix sum", lambda: np.matrix([[1, 2], [3, 4]]).sum(axis=0)),
        ("masked mean", lambda: np.ma.array([1.0, 2.0, 9.0], mask=[0, 0, 1]).mean()),
        ("early sum", lambda: np.arange(3.0).view(EarlySub).sum()),
    ]


def test_methods_counted_and_identical(probe: Probe) -> None:
    cases = method_cases()
    before = outcomes(cases)
    probe.install()
    after = outcomes(cases)
    assert_same(before, after)
    probe.take()
    a = np.arange(6.0)
    a.sum()
    a.reshape(2, 3)
    a.astype(np.float32)
    a.mean()
    np.arange(3.0).view(EarlySub).sum()
    counts = probe.take()
    assert counts["sum"] == 2 and counts["reshape"] == 1 and counts["astype"] == 1
    assert counts["mean"] == 1


def test_specialised_call_sites_see_the_change(probe: Probe) -> None:
    def call_sum(x: Any) -> Any:
        return x.sum()

    def add(x: Any, y: Any) -> Any:
        return x + y

    a = np.arange(3.0)
    for _ in range(200):  # let the adaptive interpreter specialise both call sites
        call_sum(a)
        add(a, a)
    probe.install()
    call_sum(a)
    add(a, a)
    assert probe.take() == Counter({"sum": 1, "__add__": 1})
    cp.restore_all()
    call_sum(a)
    add(a, a)
    assert not probe.take()


def test_set_type_attr_refuses_slot_dunders() -> None:
    for name in ("__add__", "__getitem__", "__len__", "__repr__", "__eq__"):
        with pytest.raises(ValueError):
            cp.set_type_attr(np.ndarray, name, lambda *a: None)
    with pytest.raises(ValueError):
        cp.install_operator_slots(np.ndarray, {"__getitem__": lambda *a: None})
    assert not cp.installed_types()


def test_del_type_attr_and_restore() -> None:
    assert not cp.installed_types()
    try:
        cp.set_type_attr(np.ndarray, "_pprobe_test_attr", 42)
        assert np.arange(2)._pprobe_test_attr == 42
        cp.del_type_attr(np.ndarray, "_pprobe_test_attr")
        assert not hasattr(np.arange(2), "_pprobe_test_attr")
        orig_sum = np.ndarray.__dict__["sum"]
        cp.del_type_attr(np.ndarray, "sum")
        assert not hasattr(np.arange(2), "sum")
        assert cp.original(np.ndarray, "sum") is orig_sum
    finally:
        cp.restore_all()
    assert "_pprobe_test_attr" not in np.ndarray.__dict__
    assert np.ndarray.__dict__["sum"] is orig_sum
    assert np.arange(3).sum() == 3


def test_refuses_type_already_using_generic_slots() -> None:
    class Heap:
        def __add__(self, other: Any) -> Any:
            return 1

    before = dict(Heap.__dict__)
    with pytest.raises(RuntimeError, match="generic"):
        cp.install_operator_slots(Heap, {"__add__": lambda a, b: 2})
    assert dict(Heap.__dict__) == before
    assert not cp.installed_types()


def test_other_static_type() -> None:
    """The mechanism is not NumPy-specific: datetime.timedelta is a static C type."""
    import datetime

    td = datetime.timedelta
    calls: list[str] = []
    orig_add, orig_radd = td.__dict__["__add__"], td.__dict__["__radd__"]

    def __add__(self: Any, other: Any) -> Any:
        calls.append("add")
        return orig_add(self, other)

    def __radd__(self: Any, other: Any) -> Any:
        calls.append("radd")
        return orig_radd(self, other)

    before = dict(td.__dict__)
    cp.install_operator_slots(td, {"__add__": __add__, "__radd__": __radd__})
    try:
        day = td(days=1)
        assert day + day == td(days=2)
        assert datetime.date(2020, 1, 1) + day == datetime.date(2020, 1, 2)
        with pytest.raises(TypeError, match="unsupported operand"):
            day + 1
        with pytest.raises(TypeError, match="unsupported operand"):
            1 + day  # type: ignore[operator]
        assert calls == ["add", "add", "radd"]  # date + timedelta is date's own nb_add
    finally:
        cp.restore(td)
    assert before.keys() == td.__dict__.keys()
    assert all(before[k] is v for k, v in td.__dict__.items())
    assert td(days=1) + td(days=1) == td(days=2) and len(calls) == 3


# ---------------------------------------------------------------------------------------------
# restore_all
# ---------------------------------------------------------------------------------------------


def test_restore_all_puts_everything_back(probe: Probe, tmp_path: Path) -> None:
    watched = [np.ndarray, *cp._iter_subclasses(np.ndarray)]
    assert EarlySub in watched and np.matrix in watched and np.ma.MaskedArray in watched
    before = slot_snapshot(watched)
    cases = operator_cases()[::7] + subclass_cases(tmp_path) + method_cases()
    results_before = outcomes(cases)

    probe.install()
    probe.install()  # a second install adds nothing and still restores exactly
    during = slot_snapshot(watched)
    assert during[np.ndarray][1]["nb_add"] != before[np.ndarray][1]["nb_add"]
    assert during[EarlySub][1]["nb_add"] == cp._layout_or_raise().generic["nb_add"]
    assert during[np.matrix][1]["nb_add"] == cp._layout_or_raise().generic["nb_add"]
    # EarlyOverride's nb_add already was generic (it defines __add__); its nb_subtract switched
    assert during[EarlyOverride][1]["nb_subtract"] == cp._layout_or_raise().generic["nb_subtract"]
    outcomes(cases)
    assert sum(probe.take().values()) > 0

    cp.restore_all()
    assert not cp.installed_types()
    assert_snapshot_equal(before, slot_snapshot(watched))
    assert_same(results_before, outcomes(cases))
    assert not probe.take()
    a = np.arange(3.0)
    a + a, a.sum(), -a, a < a  # noqa: B018
    assert not probe.take()
    cp.restore_all()  # idempotent
    assert_snapshot_equal(before, slot_snapshot(watched))


def test_patch_and_restore_in_fresh_interpreter() -> None:
    """Install, use and restore in a clean process (subclass set as NumPy creates it)."""
    code = """
import numpy as np
from pprobe import _cpython as cp
subs = [np.ndarray, *cp._iter_subclasses(np.ndarray)]
fields = sorted(set(cp.SLOT_OF.values()))
snap = lambda: [(dict(t.__dict__), [cp._current_slot(t, f) for f in fields]) for t in subs]
before = snap()
n = [0]
orig = np.ndarray.__dict__["__add__"]
def __add__(a, b):
    n[0] += 1
    return orig(a, b)
cp.install_operator_slots(np.ndarray, {"__add__": __add__})
np.ones(2) + 1; np.matrix([[1]]) + 1; np.ma.array([1]) + np.ones(1)
after_use = n[0]
cp.restore_all()
np.ones(2) + 1
after = snap()
same = all(d0.keys() == d1.keys() and all(d0[k] is d1[k] for k in d0) and s0 == s1
           for (d0, s0), (d1, s1) in zip(before, after))
print(after_use, n[0], same)
"""
    out = subprocess.run(
        [sys.executable, "-E", "-s", "-c", code], capture_output=True, text=True, cwd=ROOT
    )
    assert out.stdout.split() == ["2", "2", "True"], out.stderr


# ---------------------------------------------------------------------------------------------
# Call slots (ufuncs and array-function dispatchers)
# ---------------------------------------------------------------------------------------------


def _call_state(tp: type) -> tuple[int, int, Any]:
    view = cp._PyTypeObject.from_address(id(tp))
    return view.tp_call, view.tp_flags & cp._Py_TPFLAGS_HAVE_VECTORCALL, tp.__dict__["__call__"]


@pytest.mark.parametrize("tp", [np.ufunc, type(np.sum)], ids=["ufunc", "dispatcher"])
def test_call_slot_sees_every_call_path_and_restores_exactly(tp: type) -> None:
    import functools
    import pickle

    before = _call_state(tp)
    assert before[1]  # both are vectorcall types: the flag must be cleared and put back
    orig = tp.__dict__["__call__"]
    a = np.arange(6.0).reshape(2, 3)
    f = np.add if tp is np.ufunc else np.sum
    args = (a, 1.5) if tp is np.ufunc else (a,)
    want = f(*args)
    with pytest.raises(ValueError) as unprobed_err:
        np.add(np.ones(3), np.ones(4)) if tp is np.ufunc else np.sum(a, axis=5)
    seen: list[Any] = []

    def __call__(self: Any, *a: Any, **k: Any) -> Any:
        seen.append(self)
        return orig(self, *a, **k)

    cp.install_call_slot(tp, __call__)
    try:
        assert tp.__dict__["__call__"] is __call__
        got = [
            f(*args),  # the interpreter's call path (vectorcall)
            functools.partial(f, *args)(),  # PyObject_Call from C
            list(map(f, *[[x] for x in args]))[0],
            f.__call__(*args),
        ]
        assert all(type(g) is type(want) and np.array_equal(g, want) for g in got)
        assert seen.count(f) >= 4
        with pytest.raises(ValueError) as err:
            np.add(np.ones(3), np.ones(4)) if tp is np.ufunc else np.sum(a, axis=5)
        assert str(err.value) == str(unprobed_err.value)
        assert type(f) is tp and pickle.loads(pickle.dumps(f)) is f  # the object is untouched
    finally:
        cp.restore(tp)
    assert _call_state(tp) == before
    n = len(seen)
    assert np.array_equal(f(*args), want) and len(seen) == n


def test_call_slot_refuses_subclassable_types_and_writes_nothing() -> None:
    class Callable_:
        def __call__(self) -> int:
            return 1

    before = _call_state(type(np.sum))

    def __call__(self: Any, *a: Any, **k: Any) -> Any:
        return None

    with pytest.raises(RuntimeError, match="subclassed"):
        cp.install_call_slot(Callable_, __call__)
    assert Callable_ not in cp.installed_types() and Callable_()() == 1
    with pytest.raises(TypeError):
        cp.install_call_slot(type(np.sum), print)  # not a Python function
    assert _call_state(type(np.sum)) == before and type(np.sum) not in cp.installed_types()
