"""Where ndarray's operators and methods are patched: ``a + b``, ``x @ w``, ``a.sum()``, ...

None of these pass through the numpy namespace, and NumPy 2 has no hook for them. With the
CPython mechanism of :mod:`pprobe._cpython` (checked by its self-test on the running
interpreter first), ndarray's number and comparison slots are pointed at CPython's generic slot
functions, which call the Python functions installed here; each calls NumPy's original slot
wrapper through :func:`pprobe.recorder.call`. Public methods are replaced in ndarray's type
dict the same way. Rows: kind ``operator`` (op ``numpy.ndarray.__add__``, ``ufunc`` = the
ufunc it resolves to) and kind ``method`` (op ``numpy.ndarray.sum``).

Where the self-test fails (another CPython, a free-threaded build, PyPy) or
PPROBE_COVERAGE=namespace, nothing is patched and coverage is ``namespace``.
:func:`uninstall` restores ndarray exactly (type dict entries and slot pointers).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _cpython, _report, core, recorder

#: operator dunder -> the ufunc NumPy's slot resolves it to
OPERATORS = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "matmul": "matmul",
    "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift",
    "rshift": "right_shift",
}  # fmt: skip
UNARY = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}
COMPARE = {"lt": "less", "le": "less_equal", "eq": "equal", "ne": "not_equal",
           "gt": "greater", "ge": "greater_equal"}  # fmt: skip
#: Methods never replaced: protocol plumbing, and ``resize``: in place, it refuses an array that
#: more than its caller references (``refcheck``: NumPy counts the references), and the
#: references a recording wrapper holds during the call would make it refuse arrays it accepts
#: unprobed (NumPy's test_multiarray.py::TestResize). ``a.resize(...)`` is not a row.
SKIP_METHODS = frozenset({"__array_namespace__", "__dlpack__", "__dlpack_device__", "resize"})

_EMPTY: dict[str, Any] = {}
_installed = False
_state: dict[str, Any] = {}


def _binary(op: recorder.Op, orig: Any) -> Any:
    def f(self: Any, other: Any, _op: Any = op, _orig: Any = orig) -> Any:
        __tracebackhide__ = True
        return _call(_op, _orig, (self, other), _EMPTY)

    return f


def _power(op: recorder.Op, orig: Any) -> Any:
    def f(self: Any, other: Any, mod: Any = None, _op: Any = op, _orig: Any = orig) -> Any:
        return _call(_op, _orig, (self, other) if mod is None else (self, other, mod), _EMPTY)

    return f


def _unary(op: recorder.Op, orig: Any) -> Any:
    def f(self: Any, _op: Any = op, _orig: Any = orig) -> Any:
        return _call(_op, _orig, (self,), _EMPTY)

    return f


def _method(op: recorder.Op, orig: Any, owner: str = "ndarray") -> Any:
    def f(self: Any, *args: Any, _op: Any = op, _orig: Any = orig, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return _call(_op, _orig, (self, *args), kwargs)

    f.__name__ = orig.__name__
    f.__qualname__ = f"{owner}.{orig.__name__}"
    f.__doc__ = orig.__doc__
    f.__wrapped__ = orig  # type: ignore[attr-defined]
    return f


_call = recorder.call


def operator_functions() -> dict[str, Any]:
    """dunder -> recording function, for every operator of the issue's list."""
    d = np.ndarray.__dict__
    funcs: dict[str, Any] = {}

    def add(dunder: str, ufunc: str, maker: Any) -> None:
        op = recorder.op(f"numpy.ndarray.{dunder}", "operator", "numpy", ufunc)
        funcs[dunder] = maker(op, d[dunder])

    for short, uf in OPERATORS.items():
        maker = _power if short == "pow" else _binary
        add(f"__{short}__", uf, maker)
        add(f"__r{short}__", uf, maker)
        add(f"__i{short}__", uf, _binary)
    add("__divmod__", "divmod", _binary)
    add("__rdivmod__", "divmod", _binary)
    for short, uf in UNARY.items():
        add(f"__{short}__", uf, _unary)
    for short, uf in COMPARE.items():
        add(f"__{short}__", uf, _binary)
    return funcs


def public_methods() -> dict[str, Any]:
    out = {}
    for name, obj in np.ndarray.__dict__.items():
        if name.startswith("_") or name in SKIP_METHODS:
            continue
        if type(obj).__name__ == "method_descriptor":
            out[name] = obj
    return out


def install(coverage: str) -> dict[str, Any]:
    """Patch ndarray when ``coverage`` (auto|full|namespace) and the self-test allow it."""
    global _installed
    if coverage == "namespace":
        return {"coverage": "namespace", "reason": "PPROBE_COVERAGE=namespace"}
    if _native is not None:
        return _install_native()
    ok, reason = _cpython.selftest()
    if not ok:
        _report.warn_once(
            "coverage",
            f"operators and ndarray methods are not recorded on this interpreter ({reason}); "
            "coverage is namespace (np.* calls only).",
        )
        return {"coverage": "namespace", "reason": reason}
    if _installed:
        return {"coverage": "full"}
    methods = public_methods()
    operators = operator_functions()
    try:
        _cpython.install_operator_slots(np.ndarray, operators)
        for name, orig in methods.items():
            op = recorder.op(f"numpy.ndarray.{name}", "method", "numpy")
            _cpython.set_type_attr(np.ndarray, name, _method(op, orig))
    except Exception as e:
        try:
            _cpython.restore(np.ndarray)
        except Exception:
            pass
        _report.internal_error("patching ndarray operators", e)
        return {"coverage": "namespace", "reason": f"{type(e).__name__}: {e}"}
    _installed = True
    if "numpy.random" in sys.modules:
        patch_random(sys.modules["numpy.random"])
    return {"coverage": "full", "operators": len(operators), "methods": len(methods)}


#: Random number generators whose methods (rng.normal, ...) are rows: numpy.random's own
#: functions (np.random.rand) are bound methods of a RandomState, covered by the namespace.
RANDOM_TYPES = ("Generator", "RandomState")
_random_patched: list[type] = []


def patch_random(mod: Any) -> None:
    """Called when numpy.random is imported: its generators' methods become rows."""
    if not _installed or _random_patched:
        return
    for tname in RANDOM_TYPES:
        tp = getattr(mod, tname, None)
        if not isinstance(tp, type):
            continue
        _random_patched.append(tp)
        for name, orig in list(tp.__dict__.items()):
            if name.startswith("_") or type(orig).__name__ not in (
                "method_descriptor",
                "cython_function_or_method",
            ):
                continue
            op = recorder.op(f"numpy.random.{tname}.{name}", "method", "numpy")
            if _native is not None:
                _native.set_type_attr(tp, name, _native.MethodProbe(orig, op.index))
                _native_saved.append((tp, name, orig))
            else:
                _cpython.set_type_attr(tp, name, _method(op, orig, tname))


def uninstall() -> None:
    global _installed
    if _installed and _native is not None:
        for tp, name, orig in reversed(_native_saved):
            _native.set_type_attr(tp, name, orig)
        _native_saved.clear()
        _native.set_operators({})
        _random_patched.clear()
        _installed = False
    if _installed:
        _cpython.restore(np.ndarray)
        for tp in _random_patched:
            _cpython.restore(tp)
        _random_patched.clear()
        _installed = False


# ---------------------------------------------------------------------- native engine
# With the native core, ndarray's slots are left alone: an operator (``a + b``) reaches the
# ufunc NumPy's slot calls (np.add), whose vectorcall pointer the core switched; the core
# tells the operator from a call by the opcode the calling frame is executing (BINARY_OP,
# COMPARE_OP, UNARY_*), and names the row by the table below. NumPy's temporary elision and
# C code calling ndarray's number slots are as unprobed. Methods are MethodProbes in the type
# dict (no Python frame).
_native = core.native
_native_saved: list[tuple[type, str, Any]] = []  # (type, name, original)
K_BINARY, K_INPLACE, K_COMPARE, K_UNARY = 1, 2, 3, 4
#: ufuncs NumPy's ``a ** k`` fast path calls instead of power (k = 2, 0.5, -1, 1)
POWER_UFUNCS = ("power", "square", "sqrt", "reciprocal", "positive")


def opcode_table() -> bytes:
    """The operator class (K_*) of each (opcode << 8 | oparg) of this interpreter."""
    import opcode  # what dis reads its tables from, without dis's own imports

    t = bytearray(65536)
    opmap = opcode.opmap

    def fill(name: str, k: int, arg: int | None = None) -> None:
        code = opmap.get(name)
        if code is None:
            return
        for a in range(256) if arg is None else (arg,):
            t[code << 8 | a] = k

    if "BINARY_OP" in opmap:  # 3.11+: one opcode, the operator in its oparg
        for i, (name, _sym) in enumerate(opcode._nb_ops):  # type: ignore[attr-defined]
            fill("BINARY_OP", K_INPLACE if "INPLACE" in name else K_BINARY, i)
    for name in opmap:
        if name.startswith("BINARY_") and name not in (
            "BINARY_OP",
            "BINARY_SUBSCR",
            "BINARY_SLICE",
        ):
            fill(name, K_BINARY)  # 3.10: BINARY_ADD, ...
        elif name.startswith("INPLACE_"):
            fill(name, K_INPLACE)
    fill("COMPARE_OP", K_COMPARE)
    for name in ("UNARY_NEGATIVE", "UNARY_INVERT", "UNARY_POSITIVE"):
        fill(name, K_UNARY)
    fill("CALL_INTRINSIC_1", K_UNARY, 5)  # 3.12+: INTRINSIC_UNARY_POSITIVE
    return bytes(t)


def operator_ops() -> dict[tuple[int, str, int], int]:
    """(operator class, ufunc name, reflected) -> op index of the ndarray operator row."""
    table: dict[tuple[int, str, int], int] = {}

    def op(dunder: str, ufunc: str) -> int:
        return recorder.op(f"numpy.ndarray.{dunder}", "operator", "numpy", ufunc).index

    for short, uf in OPERATORS.items():
        fwd, ref, inp = op(f"__{short}__", uf), op(f"__r{short}__", uf), op(f"__i{short}__", uf)
        for u in POWER_UFUNCS if short == "pow" else (uf,):
            table[(K_BINARY, u, 0)] = fwd
            table[(K_BINARY, u, 1)] = ref
            table[(K_INPLACE, u, 0)] = inp
            table[(K_INPLACE, u, 1)] = ref
    for short, uf in UNARY.items():
        if short != "abs":  # abs(a) is a call of the builtin: a row of numpy.absolute
            table[(K_UNARY, uf, 0)] = op(f"__{short}__", uf)
    for short, uf in COMPARE.items():
        table[(K_COMPARE, uf, 0)] = op(f"__{short}__", uf)
    return table


def _install_native() -> dict[str, Any]:
    global _installed
    if _installed:
        return {"coverage": "full"}
    assert _native is not None
    methods = public_methods()
    try:
        _native.set_opcodes(opcode_table())
        ops = operator_ops()
        _native.set_operators(ops)
        for name, orig in methods.items():
            op = recorder.op(f"numpy.ndarray.{name}", "method", "numpy")
            _native.set_type_attr(np.ndarray, name, _native.MethodProbe(orig, op.index))
            _native_saved.append((np.ndarray, name, orig))
    except Exception as e:
        for tp, name, orig in reversed(_native_saved):
            _native.set_type_attr(tp, name, orig)
        _native_saved.clear()
        _report.internal_error("patching ndarray methods", e)
        return {"coverage": "namespace", "reason": f"{type(e).__name__}: {e}"}
    _installed = True
    if "numpy.random" in sys.modules:
        patch_random(sys.modules["numpy.random"])
    return {"coverage": "full", "operators": len(set(ops.values())), "methods": len(methods)}
