"""Make a static (immutable) type's operators and methods overridable from Python.

This module is pure mechanism: it knows nothing about pprobe's recorder and never imports
NumPy.  Nothing is touched at import time; every write happens in an explicit call.

Why it is needed
----------------
``a + b`` on two ``numpy.ndarray`` never looks anything up by name: CPython's
``binary_op1()`` (Objects/abstract.c) reads ``type(a)->tp_as_number->nb_add`` and calls the C
function stored there (NumPy's ``array_add``).  ``a > b`` likewise calls ``tp_richcompare``.
NumPy 2 has no hook for these and ``ndarray.__add__ = f`` is refused, because ndarray is a
static type (``Py_TPFLAGS_IMMUTABLETYPE``; ``type_setattro()`` refuses it).

What is done instead (CPython behaviour relied on)
--------------------------------------------------
* A Python class that defines ``__add__``/``__radd__`` gets, in ``nb_add``, CPython's *generic*
  slot function ``slot_nb_add`` (``SLOT1BINFULL`` in Objects/typeobject.c).  Those generic
  functions are plain C functions of libpython; their addresses are read from a throwaway
  class (``_make_probe``) and cross-checked against the slot table (``slotdefs``) that every
  C-level slot wrapper (``int.__dict__['__add__']``) points at.
* ``install_operator_slots`` puts Python functions into the type's real ``__dict__`` (the dict
  behind the mappingproxy; writing it directly bypasses the immutability check) and points the
  matching C slots at the generic functions.  From then on ``a + b`` runs
  ``slot_nb_add(a, b)``, which looks ``__add__`` up on ``type(a)`` (``_PyType_Lookup``) and
  calls our function.  ``PyType_Modified`` invalidates the method cache and the version tags
  that the 3.11+ specialising interpreter keys its inline caches on.
* The original slot wrappers (``ndarray.__dict__['__add__']``, a ``wrapper_descriptor``) keep a
  pointer to NumPy's C function (``d_wrapped``) and call it *directly*, not through the slot,
  so calling the saved original from the new ``__add__`` does not recurse.
* Exceptions propagate unchanged: generic slot functions are ordinary C code that returns NULL
  with the error set.  (Never put a ctypes CFUNCTYPE callback in a slot: it cannot return
  NULL-with-exception and turns errors into garbage.)

How ``slot_nb_add`` (``SLOT1BINFULL``, CPython 3.8-3.13) dispatches
------------------------------------------------------------------
One C slot serves both ``__add__`` and ``__radd__``.  ``binary_op1(v, w)`` calls
``slotv(v, w)`` and, when ``type(w)`` has a *different* ``nb_add``, ``slotw(v, w)`` -- always
with the operands in source order -- and calls it only once when both types carry the same
generic function.  ``slot_nb_add(self, other)`` therefore works out which side it is on:

1. ``do_other = type(self) is not type(other) and type(other)->nb_add == slot_nb_add``.
2. If ``type(self)->nb_add == slot_nb_add`` (self is a left operand whose class uses the generic
   slot):

   a. if ``do_other`` and ``type(other)`` is a subclass of ``type(self)`` and it *overrides*
      ``__radd__`` (``method_is_overloaded``: ``type(other).__radd__ is not
      type(self).__radd__``), call ``other.__radd__(self)`` first; a result other than
      NotImplemented is returned, else ``do_other`` is cleared;
   b. call ``type(self).__add__(self, other)`` (missing -> NotImplemented); return the result
      unless it is NotImplemented, and also return NotImplemented at once when both operands
      have the same type.
3. If ``do_other``: return ``type(other).__radd__(other, self)`` (missing -> NotImplemented).
4. Return NotImplemented; ``binary_op1`` then tries the other operand's own slot, then
   ``PyNumber_Add`` falls back to ``sq_concat`` and finally raises ``TypeError``.

Consequences: ``a + b`` on two arrays calls ``__add__`` exactly once; ``1 + a`` and
``[1] + a`` call ``a.__radd__(1)``; ``a + obj`` where ``obj``'s class defines ``__radd__`` in
Python calls ``a.__add__(obj)`` first (NumPy's ``array_add`` decides to defer, e.g. because
``obj.__array_ufunc__ is None``, and returns NotImplemented), then ``obj.__radd__(a)``: the same
order as unpatched.  In-place slots (``slot_nb_inplace_add``, ``SLOT1``) only call
``__iadd__``; a NotImplemented result makes ``binary_iop1`` fall back to ``nb_add``.
``slot_nb_power`` calls ``__pow__(self, other, mod)`` for three-argument ``pow()`` (no
``__rpow__``), ``slot_nb_inplace_power`` calls ``__ipow__(self, other)``.
``slot_tp_richcompare(self, other, op)`` looks up ``__lt__``... by ``op`` on ``type(self)``
(missing -> NotImplemented); ``do_richcompare`` does the reflected/subclass-first dance itself.
So the Python functions must be *descriptors* (plain functions): the generic slots bind them.

Subclasses
----------
A subclass copies its base's slot values when it is created (``inherit_slots``; a heap type
has its own ``PyNumberMethods`` inside its ``PyHeapTypeObject``, a static C subtype whose
``tp_as_number`` was NULL shares the base's struct pointer).  Changing the base does not reach
them: CPython only propagates slot changes from ``type_setattro`` -> ``update_slot`` ->
``update_subclasses``/``recurse_down_subclasses`` (walking ``tp_subclasses``, skipping a
subclass -- and everything below it -- whose own ``__dict__`` defines the name), recomputing
each slot with ``update_one_slot``: a slot gets the generic function as soon as one of its
dunders resolves through the MRO to something that is not a matching C slot wrapper.

``install_operator_slots`` does the same by hand for subclasses that exist at install time:
for every subclass (recursively via ``type.__subclasses__``), a slot is switched to the generic
function only if (a) it still holds the base's original C function (i.e. it was inherited) and
(b) no class between the subclass and the base in the MRO defines any dunder served by that
slot in its own ``__dict__``.  A subclass that defines e.g. ``__mul__`` in Python (np.matrix,
MaskedArray, chararray) already has the generic ``nb_multiply`` and keeps its own method; its
other, inherited operators now reach the new base functions.  A static subtype sharing the
base's struct pointer is pointed at the base's new struct.  Subclasses created *after* the
install inherit the generic slots and CPython's ``fixup_slot_dispatchers`` resolves their
dunders through the MRO, so they need nothing.  ``restore`` reverses this, including for
subclasses created while the patch was active.

Writes
------
For a static type the original ``PyNumberMethods`` struct (in the extension's data section)
is never written: the type's ``tp_as_number`` pointer is swapped to a private copy (kept
alive for ever), so ``restore`` is a single pointer write and exact.  A heap type's struct is
embedded in the type object and written in place (verified to be embedded first).
``tp_richcompare`` lives in the type object itself.  Every pointer is validated before it is
written: the type-object layout against ``type.__basicsize__``/``__flags__``/``__mro__``...,
each slot against the C slot wrapper that describes it (``d_base->offset``,
``d_wrapped``).  Writes happen while holding the GIL; another thread sees either the old or
the new slot, both of which compute the same result.  A value displaced from a type dict is
kept alive until ``PyType_Modified`` has run: until then the method cache and the inline
caches (keyed on the still-valid version tag) may hand it to another thread as a borrowed
pointer (freeing it earlier crashed the thread stress test).

Limits
------
* CPython 3.8-3.13 with the GIL (not PyPy, not free-threaded, not Py_TRACE_REFS builds);
  elsewhere ``selftest()`` says why and nothing is touched.
* C code that calls ``PyArray_Type.tp_as_number->nb_add(x, y)`` itself with two operands
  that are *not* arrays (custom scalar types such as ml_dtypes' bfloat16 fall back this way)
  now gets NotImplemented from the generic slot where it used to get ``array_add``'s result.
  NumPy 2's own scalars do not do this (``np.float64(1) + [1, 2]``,
  ``np.int64(1) + np.uint64(2)`` are unchanged).
* NumPy decides "forward or reflected call" by comparing the other operand's ``nb_add`` with
  ``array_add``.  For an ndarray *subclass* with ``__array_ufunc__ = None`` whose slot was
  switched, ``ndarray + sub`` and ``1 + sub`` therefore raise a ``TypeError`` with another
  message ("Concatenation operation is not implemented..." / "unsupported operand type(s)")
  instead of "operand 'sub' does not support ufuncs".  Results and exception types are
  otherwise identical.  ``subclasses=False`` avoids it (those
  subclasses' operators are then not routed).
* Routed calls hold extra references to the operands, so NumPy's temporary elision
  (``a + b + c`` reusing the temporary of large arrays) no longer applies: same values, one
  more temporary (measured: peak 16 MB instead of 8 MB for three 1e6-element arrays).
* The slots of subclasses created by other threads *during* an install are computed by
  CPython from whichever state it sees; all states compute the same results.
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

try:  # importable everywhere; selftest() reports why it is unusable
    import ctypes
except ImportError:  # pragma: no cover - ctypes missing (some embedded builds)
    ctypes = None  # type: ignore[assignment]

__all__ = [
    "OPERATOR_DUNDERS",
    "SLOT_OF",
    "del_type_attr",
    "install_call_slot",
    "install_operator_slots",
    "installed_types",
    "original",
    "restore",
    "restore_all",
    "selftest",
    "set_type_attr",
]

MIN_VERSION = (3, 8)
MAX_VERSION = (3, 13)  # newest minor version whose layout and slot functions were checked

# ---------------------------------------------------------------------------------------------
# Which dunder is served by which C slot
# ---------------------------------------------------------------------------------------------

_NB_FIELDS = (
    "nb_add", "nb_subtract", "nb_multiply", "nb_remainder", "nb_divmod", "nb_power",
    "nb_negative", "nb_positive", "nb_absolute", "nb_bool", "nb_invert", "nb_lshift",
    "nb_rshift", "nb_and", "nb_xor", "nb_or", "nb_int", "nb_reserved", "nb_float",
    "nb_inplace_add", "nb_inplace_subtract", "nb_inplace_multiply", "nb_inplace_remainder",
    "nb_inplace_power", "nb_inplace_lshift", "nb_inplace_rshift", "nb_inplace_and",
    "nb_inplace_xor", "nb_inplace_or", "nb_floor_divide", "nb_true_divide",
    "nb_inplace_floor_divide", "nb_inplace_true_divide", "nb_index", "nb_matrix_multiply",
    "nb_inplace_matrix_multiply",
)  # fmt: skip

_BINARY = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "power",
    "matmul": "matrix_multiply", "and": "and", "or": "or", "xor": "xor",
    "lshift": "lshift", "rshift": "rshift",
}  # fmt: skip
_UNARY = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}
_COMPARE = ("lt", "le", "eq", "ne", "gt", "ge")
_RICHCMP = "tp_richcompare"


def _slot_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for op, field in _BINARY.items():
        table[f"__{op}__"] = f"nb_{field}"
        table[f"__r{op}__"] = f"nb_{field}"
        table[f"__i{op}__"] = f"nb_inplace_{field}"
    table["__divmod__"] = table["__rdivmod__"] = "nb_divmod"
    for op, field in _UNARY.items():
        table[f"__{op}__"] = f"nb_{field}"
    for op in _COMPARE:
        table[f"__{op}__"] = _RICHCMP
    return table


#: dunder name -> the C slot that serves it (``nb_*`` field or ``tp_richcompare``).
SLOT_OF: dict[str, str] = _slot_table()
#: every dunder ``install_operator_slots`` accepts.
OPERATOR_DUNDERS: tuple[str, ...] = tuple(SLOT_OF)
#: slot -> all dunders it serves (a binary slot serves ``__op__`` and ``__rop__``).
_NAMES_OF: dict[str, tuple[str, ...]] = {}
for _name, _field in SLOT_OF.items():
    _NAMES_OF[_field] = (*_NAMES_OF.get(_field, ()), _name)
del _name, _field

# Dunders that CPython maps to *some* C slot (Objects/typeobject.c slotdefs).  Writing one of
# them into a type dict without updating the slot would desynchronise the two, so
# set_type_attr refuses them.
_OTHER_SLOT_DUNDERS = frozenset(
    "__getattribute__ __getattr__ __setattr__ __delattr__ __repr__ __hash__ __call__ "
    "__str__ __iter__ __next__ __get__ __set__ __delete__ __init__ __new__ __del__ "
    "__await__ __aiter__ __anext__ __bool__ __int__ __float__ __index__ __len__ "
    "__getitem__ __setitem__ __delitem__ __contains__ __buffer__ __release_buffer__".split()
)

_Py_TPFLAGS_IMMUTABLETYPE = 1 << 8
_Py_TPFLAGS_HEAPTYPE = 1 << 9
_Py_TPFLAGS_BASETYPE = 1 << 10
_Py_TPFLAGS_HAVE_VECTORCALL = 1 << 11
# Set and cleared at run time by other threads (method cache / version tags): not compared.
_Py_TPFLAGS_VALID_VERSION_TAG = 1 << 19

_MISSING: Any = object()  # marks "the type dict had no such entry"

# ---------------------------------------------------------------------------------------------
# ctypes views of the CPython structures used (identical prefix in 3.8 .. 3.13, GIL builds)
# ---------------------------------------------------------------------------------------------

if ctypes is not None:
    _P = ctypes.c_void_p
    _SSIZE = ctypes.c_ssize_t

    class _PyTypeObject(ctypes.Structure):
        """Include/cpython/object.h ``struct _typeobject``, up to ``tp_mro``."""

        _fields_ = [
            ("ob_refcnt", _SSIZE), ("ob_type", _P), ("ob_size", _SSIZE),
            ("tp_name", _P), ("tp_basicsize", _SSIZE), ("tp_itemsize", _SSIZE),
            ("tp_dealloc", _P), ("tp_vectorcall_offset", _SSIZE), ("tp_getattr", _P),
            ("tp_setattr", _P), ("tp_as_async", _P), ("tp_repr", _P),
            ("tp_as_number", _P), ("tp_as_sequence", _P), ("tp_as_mapping", _P),
            ("tp_hash", _P), ("tp_call", _P), ("tp_str", _P), ("tp_getattro", _P),
            ("tp_setattro", _P), ("tp_as_buffer", _P), ("tp_flags", ctypes.c_ulong),
            ("tp_doc", _P), ("tp_traverse", _P), ("tp_clear", _P),
            ("tp_richcompare", _P), ("tp_weaklistoffset", _SSIZE), ("tp_iter", _P),
            ("tp_iternext", _P), ("tp_methods", _P), ("tp_members", _P),
            ("tp_getset", _P), ("tp_base", _P), ("tp_dict", _P), ("tp_descr_get", _P),
            ("tp_descr_set", _P), ("tp_dictoffset", _SSIZE), ("tp_init", _P),
            ("tp_alloc", _P), ("tp_new", _P), ("tp_free", _P), ("tp_is_gc", _P),
            ("tp_bases", _P), ("tp_mro", _P),
        ]  # fmt: skip

    class _PyNumberMethods(ctypes.Structure):
        """Include/cpython/object.h ``PyNumberMethods`` (unchanged since 3.5)."""

        _fields_ = [(_f, _P) for _f in _NB_FIELDS]

    class _WrapperBase(ctypes.Structure):
        """Include/cpython/descrobject.h ``struct wrapperbase`` (one ``slotdefs`` entry)."""

        _fields_ = [
            ("name", _P), ("offset", ctypes.c_int), ("function", _P), ("wrapper", _P),
            ("doc", _P), ("flags", ctypes.c_int), ("name_strobj", _P),
        ]  # fmt: skip

    class _WrapperDescr(ctypes.Structure):
        """``PyWrapperDescrObject``: PyDescr_COMMON, ``d_base``, ``d_wrapped``."""

        _fields_ = [
            ("ob_refcnt", _SSIZE), ("ob_type", _P), ("d_type", _P), ("d_name", _P),
            ("d_qualname", _P), ("d_base", _P), ("d_wrapped", _P),
        ]  # fmt: skip


_WrapperDescriptorType = type(object.__dict__["__init__"])


def _read_ptr(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr).value or 0


def _write_ptr(addr: int, value: int) -> None:
    ctypes.c_void_p.from_address(addr).value = value or None


def _type_field_addr(tp: type, field: str) -> int:
    return id(tp) + getattr(_PyTypeObject, field).offset


def _nb_field_offset(field: str) -> int:
    return getattr(_PyNumberMethods, field).offset


def _real_dict(tp: type) -> dict[str, Any]:
    """The dict behind ``tp.__dict__`` (a mappingproxy whose only GC referent is that dict)."""
    import gc

    proxy = type.__dict__["__dict__"].__get__(tp)
    refs = gc.get_referents(proxy)
    if len(refs) != 1 or type(refs[0]) is not dict:
        raise RuntimeError(f"cannot reach the dict of {tp!r}")
    d: dict[str, Any] = refs[0]
    if len(d) != len(proxy):
        raise RuntimeError(f"the mappingproxy of {tp!r} does not wrap its dict")
    return d


# ---------------------------------------------------------------------------------------------
# Layout discovery and selftest
# ---------------------------------------------------------------------------------------------


class _Layout:
    """What selftest() established about the running interpreter."""

    def __init__(self, nb_heap_offset: int, generic: dict[str, int], generic_call: int) -> None:
        #: offsetof(PyHeapTypeObject, as_number), as used by CPython's own slotdefs table.
        self.nb_heap_offset = nb_heap_offset
        #: slot field -> address of CPython's generic slot function for it.
        self.generic = generic
        #: CPython's ``slot_tp_call``.
        self.generic_call = generic_call


_STATE_LOCK = threading.RLock()
_SELFTEST: tuple[bool, str] | None = None
_LAYOUT: _Layout | None = None


def _make_probe() -> type:
    """A throwaway class defining every operator dunder: its slots hold the generic functions."""

    def probe(self: Any, *args: Any) -> Any:  # pragma: no cover - never called
        return NotImplemented

    return type("_pprobe_slot_probe", (), dict.fromkeys((*OPERATOR_DUNDERS, "__call__"), probe))


def _check_type_prefix(tp: type) -> str | None:
    """Compare the ctypes view of a type object with what ``type``'s own members report."""
    view = _PyTypeObject.from_address(id(tp))
    checks = {
        "ob_type": id(type(tp)),
        "tp_basicsize": tp.__basicsize__,
        "tp_itemsize": tp.__itemsize__,
        "tp_flags": tp.__flags__,
        "tp_weaklistoffset": tp.__weakrefoffset__,
        "tp_dictoffset": tp.__dictoffset__,
        "tp_base": id(tp.__base__) if tp.__base__ is not None else 0,
        "tp_bases": id(tp.__bases__),
        "tp_mro": id(tp.__mro__),
    }
    if tp is type:  # instances of type keep their dict pointer in tp_dict
        checks["tp_dictoffset"] = _PyTypeObject.tp_dict.offset
    for field, expected in checks.items():
        got = getattr(view, field) or 0
        if field == "tp_flags":
            got, expected = (v & ~_Py_TPFLAGS_VALID_VERSION_TAG for v in (got, expected))
        if got != expected:
            return f"{field} of {tp.__name__} reads {got}, expected {expected}"
    # only dereference tp_name once the plain fields agree
    name = ctypes.string_at(view.tp_name) if view.tp_name else b""
    if name.rsplit(b".", 1)[-1] != tp.__name__.encode():
        return f"tp_name of {tp.__name__} reads {name!r}"
    tp_dict = view.tp_dict or 0
    # 3.12+ keeps the dict of static *builtin* types in the interpreter state (tp_dict NULL).
    static_builtin = not tp.__flags__ & _Py_TPFLAGS_HEAPTYPE and tp.__module__ == "builtins"
    if tp_dict != id(_real_dict(tp)) and not (tp_dict == 0 and static_builtin):
        return f"tp_dict of {tp.__name__} is not its __dict__"
    return None


def _read_wrapper(owner: type, name: str, descr: Any = None) -> tuple[int, int, int, int]:
    """Validate the C slot wrapper ``descr`` (default ``owner.__dict__[name]``).

    Returns ``(d_base->offset, d_base->function, d_base->wrapper, d_wrapped)``: the slot's
    offset in ``PyHeapTypeObject``, CPython's generic slot function for it, the wrapper's
    calling convention and the C function the descriptor calls.  Raises ``RuntimeError``.
    """
    if descr is None:
        descr = owner.__dict__.get(name)
    if type(descr) is not _WrapperDescriptorType:
        raise RuntimeError(f"{owner.__name__}.{name} is not a slot wrapper")
    view = _WrapperDescr.from_address(id(descr))
    if view.ob_type != id(_WrapperDescriptorType) or view.d_type != id(owner):
        raise RuntimeError(f"{owner.__name__}.{name}: unexpected descriptor layout")
    if view.d_name != id(descr.__name__) or not view.d_base or not view.d_wrapped:
        raise RuntimeError(f"{owner.__name__}.{name}: unexpected descriptor layout")
    base = _WrapperBase.from_address(view.d_base)
    raw = name.encode() + b"\0"
    if not base.name or ctypes.string_at(base.name, len(raw)) != raw:
        raise RuntimeError(f"{owner.__name__}.{name}: unexpected slotdefs entry")
    return base.offset, base.function or 0, base.wrapper or 0, view.d_wrapped


def _slot_heap_offset(field: str, layout: _Layout) -> int:
    if field == _RICHCMP:
        return _PyTypeObject.tp_richcompare.offset
    return layout.nb_heap_offset + _nb_field_offset(field)


def _discover() -> _Layout:
    """Establish the layout; raise RuntimeError with the reason when anything disagrees."""
    probe = _make_probe()
    for tp in (object, int, type, set, probe):
        problem = _check_type_prefix(tp)
        if problem:
            raise RuntimeError(problem)
    if not probe.__flags__ & _Py_TPFLAGS_HEAPTYPE or int.__flags__ & _Py_TPFLAGS_HEAPTYPE:
        raise RuntimeError("Py_TPFLAGS_HEAPTYPE bit is not where expected")
    if sys.version_info >= (3, 10) and (
        not int.__flags__ & _Py_TPFLAGS_IMMUTABLETYPE or probe.__flags__ & _Py_TPFLAGS_IMMUTABLETYPE
    ):
        raise RuntimeError("Py_TPFLAGS_IMMUTABLETYPE bit is not where expected")

    # offsetof(PyHeapTypeObject, as_number) as CPython's slotdefs table has it ...
    nb_heap_offset = _read_wrapper(int, "__add__")[0] - _nb_field_offset("nb_add")
    # ... must be where a heap type's tp_as_number points.
    probe_view = _PyTypeObject.from_address(id(probe))
    if probe_view.tp_as_number != id(probe) + nb_heap_offset:
        raise RuntimeError("heap type as_number is not at the slotdefs offset")
    if nb_heap_offset < ctypes.sizeof(_PyTypeObject):
        raise RuntimeError("as_number offset lies inside PyTypeObject")

    nb = _PyNumberMethods.from_address(probe_view.tp_as_number)
    generic = {f: getattr(nb, f) or 0 for f in set(SLOT_OF.values()) if f != _RICHCMP}
    generic[_RICHCMP] = probe_view.tp_richcompare or 0
    values = list(generic.values())
    if 0 in values or len(set(values)) != len(values):
        raise RuntimeError("generic slot functions are missing or not distinct")
    for field in ("nb_bool", "nb_int", "nb_reserved", "nb_float", "nb_index"):
        if getattr(nb, field):
            raise RuntimeError(f"{field} of the probe class is set: PyNumberMethods moved")
    # slot_tp_call: what the probe's tp_call holds, and what type.__call__'s slotdefs entry
    # names as the generic function of the tp_call slot
    generic_call = probe_view.tp_call or 0
    offset, function, _wrapper, wrapped = _read_wrapper(type, "__call__")
    if not generic_call or generic_call in values:
        raise RuntimeError("generic tp_call function is missing or not distinct")
    if offset != _PyTypeObject.tp_call.offset or function != generic_call:
        raise RuntimeError("slotdefs entry of __call__ disagrees with the layout")
    if (_PyTypeObject.from_address(id(type)).tp_call or 0) != wrapped:
        raise RuntimeError("type's tp_call is not what type.__call__ wraps")
    layout = _Layout(nb_heap_offset, generic, generic_call)

    # Builtin C types: their slots must be what their slot wrappers wrap, at the offsets and
    # with the generic functions that CPython's slotdefs table records.
    int_names = [n for n in OPERATOR_DUNDERS if n in int.__dict__]
    set_names = ["__isub__", "__iand__", "__ixor__", "__ior__", "__sub__", "__and__"]
    for owner, names in ((int, int_names), (set, set_names)):
        view = _PyTypeObject.from_address(id(owner))
        for name in names:
            field = SLOT_OF[name]
            offset, function, _wrapper, wrapped = _read_wrapper(owner, name)
            if offset != _slot_heap_offset(field, layout):
                raise RuntimeError(f"slotdefs offset of {name} disagrees with the layout")
            if function != generic[field]:
                raise RuntimeError(f"generic slot function of {name} disagrees")
            if field == _RICHCMP:
                current = view.tp_richcompare or 0
            else:
                current = _read_ptr(view.tp_as_number + _nb_field_offset(field))
            if current != wrapped:
                raise RuntimeError(f"{owner.__name__} slot for {name} is not what it wraps")
    if len(int_names) < 20:
        raise RuntimeError("int has fewer operator slot wrappers than expected")
    return layout


def _run_selftest() -> tuple[bool, str, _Layout | None]:
    impl = sys.implementation.name
    if impl != "cpython":
        return False, f"not CPython ({impl})", None
    version = sys.version_info[:2]
    if not MIN_VERSION <= version <= MAX_VERSION:
        return False, f"CPython {version[0]}.{version[1]} not in the verified range", None
    if ctypes is None:
        return False, "ctypes is not available", None
    # A free-threaded build also fails the object-header check below (its PyObject is
    # larger); these tests give the clearer reason.  sysconfig is not imported (it costs ms).
    sysconfig = sys.modules.get("sysconfig")
    if "t" in getattr(sys, "abiflags", "") or (
        sysconfig is not None and sysconfig.get_config_var("Py_GIL_DISABLED")
    ):
        return False, "free-threaded build (Py_GIL_DISABLED)", None
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return False, "the GIL is disabled", None
    if object.__basicsize__ != 2 * ctypes.sizeof(ctypes.c_void_p):
        return False, "unexpected PyObject header (Py_TRACE_REFS build?)", None
    if not hasattr(ctypes, "pythonapi") or not hasattr(ctypes.pythonapi, "PyType_Modified"):
        return False, "PyType_Modified not reachable through ctypes.pythonapi", None
    try:
        layout = _discover()
    except Exception as exc:  # any disagreement means: do not touch memory
        return False, f"layout check failed: {exc}", None
    return True, f"CPython {version[0]}.{version[1]}: type layout and slot table verified", layout


def selftest() -> tuple[bool, str]:
    """Whether slot patching is safe on this interpreter, and why (never raises).

    Checks: CPython (not PyPy) in the verified version range, GIL build, plain object header;
    then reads the type-object prefix of ``object``, ``int``, ``type``, ``set`` and a throwaway
    heap class and compares every field with what ``type`` reports (name, sizes, flags,
    immutable/heap bits, base, bases, mro, tp_dict is the real ``__dict__``); reads the slot
    wrappers of ``int``/``set`` and checks that the slotdefs offsets, generic slot functions
    and wrapped C functions agree with the ``PyNumberMethods``/``tp_richcompare`` fields.
    The result is cached (the first call costs well under a millisecond); NumPy is not
    imported.
    """
    global _SELFTEST, _LAYOUT
    with _STATE_LOCK:
        if _SELFTEST is None:
            ok, why, layout = _run_selftest()
            _SELFTEST, _LAYOUT = (ok, why), layout
        return _SELFTEST


def _layout_or_raise() -> _Layout:
    ok, why = selftest()
    if not ok or _LAYOUT is None:
        raise RuntimeError(f"slot patching unavailable: {why}")
    return _LAYOUT


def _type_modified(tp: type) -> None:
    """``PyType_Modified(tp)``: drop the type's version tag (and its subclasses')."""
    func = ctypes.pythonapi.PyType_Modified
    func.argtypes = (ctypes.py_object,)
    func.restype = None
    func(tp)


# ---------------------------------------------------------------------------------------------
# Records of what was changed, so that restore() can undo it exactly
# ---------------------------------------------------------------------------------------------


class _SubRecord:
    """What was changed on one subclass."""

    def __init__(self, sub: type) -> None:
        self.ref = weakref.ref(sub)
        self.fields: dict[str, int] = {}  # slot field -> original value (written in place)
        self.orig_nb_ptr = 0  # original tp_as_number of a static subtype (0: not swapped)
        self.new_nb: Any = None  # its private PyNumberMethods copy, if it had its own struct


class _TypeRecord:
    """What was changed on one patched type."""

    def __init__(self, tp: type) -> None:
        self.tp = tp
        self.dict_orig: dict[str, Any] = {}  # name -> original value or _MISSING
        self.slot_orig: dict[str, int] = {}  # slot field -> original value
        self.orig_nb_ptr = 0  # original tp_as_number of a static type (0: not swapped)
        self.new_nb: Any = None  # private PyNumberMethods copy (static types)
        self.subs: dict[int, _SubRecord] = {}
        self.call_orig = 0  # original tp_call (0: not switched)
        self.vectorcall_flag = 0  # the Py_TPFLAGS_HAVE_VECTORCALL bit that was cleared


_RECORDS: dict[type, _TypeRecord] = {}
# Private PyNumberMethods copies (about 300 bytes each) are never freed, so that no pointer
# to one that a type or C code may still hold can dangle.
_KEEPALIVE: list[Any] = []


def _record(tp: type) -> _TypeRecord:
    rec = _RECORDS.get(tp)
    if rec is None:
        rec = _RECORDS[tp] = _TypeRecord(tp)
    return rec


def _write_dict(d: dict[str, Any], name: str, value: Any, displaced: list[Any]) -> None:
    """``d[name] = value`` (``_MISSING``: delete), keeping the old value in ``displaced``.

    The caller must keep ``displaced`` alive until after ``PyType_Modified``: until then the
    method cache and the specialising interpreter's inline caches may still hand out the old
    value as a *borrowed* pointer (keyed on the unchanged version tag) to another thread that
    gets the GIL in between; freeing it first would be a use-after-free.
    """
    displaced.append(d.get(name))
    if value is _MISSING:
        d.pop(name, None)
    else:
        d[name] = value


def _remember_dict(rec: _TypeRecord, d: dict[str, Any], name: str) -> None:
    if name not in rec.dict_orig:
        rec.dict_orig[name] = d.get(name, _MISSING)


def _check_type(tp: Any) -> None:
    if not isinstance(tp, type):
        raise TypeError(f"expected a type, got {type(tp).__name__}")


def original(tp: type, name: str, default: Any = _MISSING) -> Any:
    """``tp.__dict__[name]`` as it was before this module first changed it."""
    with _STATE_LOCK:
        rec = _RECORDS.get(tp)
        if rec is not None and name in rec.dict_orig:
            value = rec.dict_orig[name]
        else:
            value = tp.__dict__.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise AttributeError(f"{tp.__name__!r} has no attribute {name!r} of its own")
        return default
    return value


def installed_types() -> list[type]:
    """Types that currently carry changes made by this module."""
    with _STATE_LOCK:
        return list(_RECORDS)


# ---------------------------------------------------------------------------------------------
# Plain attributes (methods such as ndarray.sum)
# ---------------------------------------------------------------------------------------------


def _check_plain_name(name: str) -> None:
    if not isinstance(name, str):
        raise TypeError("attribute name must be a str")
    if name in SLOT_OF or name in _OTHER_SLOT_DUNDERS:
        raise ValueError(
            f"{name} is served by a C slot; writing only the dict entry would not change "
            "behaviour (use install_operator_slots for operators)"
        )


def set_type_attr(tp: type, name: str, value: Any) -> None:
    """Set ``tp.<name> = value`` even if ``tp`` is a static/immutable type.

    Writes the entry of the type's real dict (reached through the mappingproxy's GC referent),
    then calls ``PyType_Modified(tp)`` so that the method cache and the specialising
    interpreter's inline caches (keyed on the type's version tag) drop the old value for
    ``tp`` and all its subclasses.  The first original value (or its absence) is remembered
    for ``restore``.  Names that CPython maps to a C slot are refused.  Replacing a method
    descriptor such as ``ndarray.sum`` with a Python function makes ``a.sum`` a bound method
    of that function; subclasses that do not define ``sum`` themselves see it too.
    """
    _check_type(tp)
    _check_plain_name(name)
    _layout_or_raise()
    with _STATE_LOCK:
        d = _real_dict(tp)
        _remember_dict(_record(tp), d, name)
        displaced: list[Any] = []
        _write_dict(d, name, value, displaced)
        _type_modified(tp)
        del displaced  # only now may the old value be freed


def del_type_attr(tp: type, name: str) -> None:
    """Delete ``tp.<name>`` from a static/immutable type's dict (remembered for restore)."""
    _check_type(tp)
    _check_plain_name(name)
    _layout_or_raise()
    with _STATE_LOCK:
        d = _real_dict(tp)
        if name not in d:
            raise AttributeError(f"{tp.__name__!r} has no attribute {name!r} of its own")
        _remember_dict(_record(tp), d, name)
        displaced: list[Any] = []
        _write_dict(d, name, _MISSING, displaced)
        _type_modified(tp)
        del displaced  # only now may the old value be freed


# ---------------------------------------------------------------------------------------------
# Operator slots
# ---------------------------------------------------------------------------------------------


def _resolve(tp: type, name: str, skip_self: bool = False) -> Any:
    for klass in tp.__mro__[1:] if skip_self else tp.__mro__:
        value = klass.__dict__.get(name, _MISSING)
        if value is not _MISSING:
            return value
    return _MISSING


def _current_slot(tp: type, field: str) -> int:
    view = _PyTypeObject.from_address(id(tp))
    if field == _RICHCMP:
        return view.tp_richcompare or 0
    if not view.tp_as_number:
        return 0
    return _read_ptr(view.tp_as_number + _nb_field_offset(field))


def _validate_slot(tp: type, field: str, layout: _Layout, rec: _TypeRecord) -> int:
    """The slot's original C function, after checking it against the wrappers describing it.

    Every dunder served by the slot must resolve (through the MRO, as CPython's
    ``update_one_slot`` does) either to nothing or to a C slot wrapper of a class in the MRO
    whose slotdefs offset is this slot and whose ``d_wrapped`` is the slot's current value.
    """
    current = rec.slot_orig.get(field)
    if current is None:
        current = _current_slot(tp, field)
    if current == layout.generic[field]:
        raise RuntimeError(f"{tp.__name__}.{field} already uses the generic slot function")
    expected_offset = _slot_heap_offset(field, layout)
    for name in _NAMES_OF[field]:
        if name in rec.dict_orig:  # already replaced by an earlier install
            value = rec.dict_orig[name]
            if value is _MISSING:
                value = _resolve(tp, name, skip_self=True)
        else:
            value = _resolve(tp, name)
        if value is _MISSING:
            continue
        if type(value) is not _WrapperDescriptorType:
            kind = type(value).__name__
            raise RuntimeError(f"{tp.__name__}.{name} is a {kind}, not a slot wrapper")
        owner = value.__objclass__
        if owner not in tp.__mro__:
            raise RuntimeError(f"{tp.__name__}.{name} wraps a slot of an unrelated type")
        offset, function, _wrapper, wrapped = _read_wrapper(owner, name, value)
        if offset != expected_offset or function != layout.generic[field]:
            raise RuntimeError(f"{tp.__name__}.{name}: slotdefs entry is not {field}")
        if wrapped != current:
            raise RuntimeError(f"{tp.__name__}.{field} is not the function {name} wraps")
    return current


def _overridden(sub: type, tp: type, names: tuple[str, ...]) -> bool:
    """Whether a class between ``sub`` and ``tp`` in ``sub``'s MRO defines one of ``names``."""
    for klass in sub.__mro__:
        if klass is tp:
            return False
        own = klass.__dict__
        if any(name in own for name in names):
            return True
    return True  # tp not in the MRO: leave the class alone


def _iter_subclasses(tp: type) -> Iterator[type]:
    seen: set[int] = set()
    stack: list[type] = list(type.__subclasses__(tp))
    while stack:
        sub = stack.pop()
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        yield sub
        stack.extend(type.__subclasses__(sub))


def _nb_is_embedded(tp: type, layout: _Layout) -> bool:
    view = _PyTypeObject.from_address(id(tp))
    return bool(tp.__flags__ & _Py_TPFLAGS_HEAPTYPE) and (
        view.tp_as_number == id(tp) + layout.nb_heap_offset
    )


def _plan_subclasses(
    tp: type, fields: list[str], originals: dict[str, int]
) -> list[tuple[type, list[str]]]:
    """Existing subclasses and which of their slots to switch (checked; nothing written).

    A slot is switched when it still holds ``tp``'s original C function and no class between
    the subclass and ``tp`` defines one of the dunders it serves.
    """
    plan = []
    for sub in _iter_subclasses(tp):
        todo = [
            field
            for field in fields
            if not _overridden(sub, tp, _NAMES_OF[field])
            and _current_slot(sub, field) == originals[field]
        ]
        if todo:
            problem = _check_type_prefix(sub)
            if problem:
                raise RuntimeError(f"subclass {sub.__qualname__}: {problem}")
            plan.append((sub, todo))
    return plan


def _patch_subclasses(
    rec: _TypeRecord, plan: list[tuple[type, list[str]]], layout: _Layout
) -> None:
    """Point inherited slots of existing subclasses at the generic functions (see docstring)."""
    new_nb_addr = ctypes.addressof(rec.new_nb) if rec.new_nb is not None else 0
    for sub, todo in plan:
        srec = rec.subs.get(id(sub))
        if srec is None or srec.ref() is not sub:  # new, or a dead class's id was reused
            srec = _SubRecord(sub)
        view = _PyTypeObject.from_address(id(sub))
        nb_todo = [field for field in todo if field != _RICHCMP]
        nb_ptr = view.tp_as_number or 0
        if nb_todo and nb_ptr:
            if sub.__flags__ & _Py_TPFLAGS_HEAPTYPE:
                if _nb_is_embedded(sub, layout):
                    for field in nb_todo:
                        addr = nb_ptr + _nb_field_offset(field)
                        srec.fields.setdefault(field, _read_ptr(addr))
                        _write_ptr(addr, layout.generic[field])
                # else: a heap type whose struct is elsewhere -- unknown, leave it alone
            elif rec.orig_nb_ptr and nb_ptr == rec.orig_nb_ptr:
                # a static subtype sharing the base's struct follows the base's new struct
                srec.orig_nb_ptr = nb_ptr
                _write_ptr(_type_field_addr(sub, "tp_as_number"), new_nb_addr)
            elif srec.new_nb is not None and nb_ptr == ctypes.addressof(srec.new_nb):
                for field in nb_todo:
                    setattr(srec.new_nb, field, layout.generic[field])
            elif nb_ptr != new_nb_addr:
                # a static subtype with a struct of its own: swap in a private copy
                copy = _copy_number_methods(nb_ptr)
                for field in nb_todo:
                    setattr(copy, field, layout.generic[field])
                srec.orig_nb_ptr, srec.new_nb = nb_ptr, copy
                _write_ptr(_type_field_addr(sub, "tp_as_number"), ctypes.addressof(copy))
        if _RICHCMP in todo:
            addr = _type_field_addr(sub, "tp_richcompare")
            srec.fields.setdefault(_RICHCMP, _read_ptr(addr))
            _write_ptr(addr, layout.generic[_RICHCMP])
        rec.subs[id(sub)] = srec
        _type_modified(sub)


def _copy_number_methods(addr: int) -> Any:
    copy = _PyNumberMethods()
    ctypes.memmove(ctypes.addressof(copy), addr, ctypes.sizeof(_PyNumberMethods))
    _KEEPALIVE.append(copy)
    return copy


def install_operator_slots(
    tp: type, funcs: dict[str, Callable[..., Any]], subclasses: bool = True
) -> None:
    """Route ``tp``'s operators through the given Python functions.

    For every dunder in ``funcs`` (see ``OPERATOR_DUNDERS``: binary, reflected and in-place
    ``+ - * / // % ** @ & | ^ << >>``, ``divmod``, unary ``- + abs ~`` and the six rich
    comparisons) the function is stored in ``tp``'s real dict and the C slot that serves it
    (``nb_add`` for ``__add__`` and ``__radd__``, ``nb_inplace_add`` for ``__iadd__``,
    ``tp_richcompare`` for all comparisons...) is pointed at CPython's generic slot function,
    which looks the dunder up on the type at each call (see the module docstring for the exact
    dispatch).  Dunders served by a patched slot but absent from ``funcs`` keep their original
    slot wrapper, which the generic function then calls: behaviour is unchanged.

    The functions must be plain Python functions (descriptors: the slot binds them); to call
    the original, save ``tp.__dict__[name]`` (a ``wrapper_descriptor``) *before* installing,
    or use ``original(tp, name)``, and call it as ``orig(self, other)``.  Binary functions get
    ``(self, other)``; ``__pow__`` also gets ``mod`` for three-argument ``pow()``.

    Already-existing subclasses whose slot was inherited from ``tp`` are updated too (see
    "Subclasses" in the module docstring) unless ``subclasses`` is false; then their
    operators keep calling the C functions directly (same results, not routed).

    Everything is validated before the first write; on a failed check ``RuntimeError`` is
    raised and nothing has been changed.  Calling it again for the same type adds or
    replaces functions; ``restore(tp)`` undoes all of it.
    """
    _check_type(tp)
    layout = _layout_or_raise()
    for name, func in funcs.items():
        if name not in SLOT_OF:
            raise ValueError(f"{name!r} is not an operator dunder handled here")
        if not isinstance(func, types.FunctionType) and not hasattr(type(func), "__get__"):
            raise TypeError(f"{name}: expected a Python function (a descriptor), got {func!r}")
    with _STATE_LOCK:
        fresh = tp not in _RECORDS
        rec = _record(tp)
        try:
            _install_locked(tp, funcs, layout, rec, subclasses)
        except BaseException:
            if fresh and not rec.dict_orig and not rec.slot_orig:
                del _RECORDS[tp]
            raise


def _install_locked(
    tp: type,
    funcs: dict[str, Callable[..., Any]],
    layout: _Layout,
    rec: _TypeRecord,
    subclasses: bool,
) -> None:
    d = _real_dict(tp)
    view = _PyTypeObject.from_address(id(tp))
    heap = bool(tp.__flags__ & _Py_TPFLAGS_HEAPTYPE)
    fields = sorted({SLOT_OF[name] for name in funcs})
    nb_fields = [f for f in fields if f != _RICHCMP]

    # ---- validate everything before the first write
    problem = _check_type_prefix(tp)
    if problem:
        raise RuntimeError(problem)
    if nb_fields:
        if not view.tp_as_number:
            raise RuntimeError(f"{tp.__name__} has no number protocol (tp_as_number is NULL)")
        if heap and not _nb_is_embedded(tp, layout):
            raise RuntimeError(f"{tp.__name__}: heap type whose as_number is not embedded")
        if (
            not heap
            and rec.new_nb is not None
            and (view.tp_as_number != ctypes.addressof(rec.new_nb))
        ):
            raise RuntimeError(f"{tp.__name__}.tp_as_number changed since the last install")
    originals = {field: _validate_slot(tp, field, layout, rec) for field in fields}
    plan = _plan_subclasses(tp, fields, originals) if subclasses else []

    # ---- remember originals
    for name in funcs:
        _remember_dict(rec, d, name)
    for field, value in originals.items():
        rec.slot_orig.setdefault(field, value)

    # ---- dict entries first: while the slots still hold the C functions they are unused
    displaced: list[Any] = []  # freed only after PyType_Modified (see _write_dict)
    for name, func in funcs.items():
        _write_dict(d, name, func, displaced)

    # ---- slots
    if nb_fields:
        if heap:
            for field in nb_fields:
                _write_ptr(view.tp_as_number + _nb_field_offset(field), layout.generic[field])
        else:
            if rec.new_nb is None:
                rec.orig_nb_ptr = view.tp_as_number
                rec.new_nb = _copy_number_methods(rec.orig_nb_ptr)
            for field in nb_fields:
                setattr(rec.new_nb, field, layout.generic[field])
            # one aligned pointer store switches every number slot at once
            _write_ptr(_type_field_addr(tp, "tp_as_number"), ctypes.addressof(rec.new_nb))
    if _RICHCMP in fields:
        _write_ptr(_type_field_addr(tp, "tp_richcompare"), layout.generic[_RICHCMP])
    _type_modified(tp)
    del displaced
    _patch_subclasses(rec, plan, layout)


def restore(tp: type) -> None:
    """Undo every change this module made to ``tp`` and its subclasses.

    Slot pointers get their original values (a static type gets its original
    ``tp_as_number`` pointer back; the original struct was never written), dict entries get
    their original objects back (entries that did not exist are deleted), subclasses that were
    switched to the generic functions -- and subclasses created meanwhile, unless they define
    the dunders themselves -- get the original C functions, and ``PyType_Modified`` is called.
    A type that was never patched is left alone.
    """
    with _STATE_LOCK:
        rec = _RECORDS.get(tp)
        if rec is None:
            return
        layout = _LAYOUT
        assert layout is not None
        _restore_locked(rec, layout)
        del _RECORDS[tp]


def _restore_locked(rec: _TypeRecord, layout: _Layout) -> None:
    tp = rec.tp
    new_nb_addr = ctypes.addressof(rec.new_nb) if rec.new_nb is not None else 0
    fields = list(rec.slot_orig)

    # ---- subclasses (also those created while patched: they inherited the generic slots)
    for sub in _iter_subclasses(tp):
        srec = rec.subs.get(id(sub))
        if srec is not None and srec.ref() is not sub:
            srec = None
        view = _PyTypeObject.from_address(id(sub))
        changed = False
        nb_ptr = view.tp_as_number or 0
        ours = [new_nb_addr]
        if srec is not None and srec.new_nb is not None:
            ours.append(ctypes.addressof(srec.new_nb))
        if nb_ptr and nb_ptr in ours:
            # a static subtype we pointed at a private struct, or one that was readied while
            # patched and shared the base's (private) struct
            orig = srec.orig_nb_ptr if srec is not None and srec.orig_nb_ptr else rec.orig_nb_ptr
            _write_ptr(_type_field_addr(sub, "tp_as_number"), orig)
            changed = True
            nb_ptr = 0
        for field in fields:
            if field == _RICHCMP:
                addr = _type_field_addr(sub, "tp_richcompare")
            elif nb_ptr and nb_ptr != rec.orig_nb_ptr:
                addr = nb_ptr + _nb_field_offset(field)
            else:
                continue
            if _read_ptr(addr) != layout.generic[field]:
                continue
            if _overridden(sub, tp, _NAMES_OF[field]):
                continue  # the subclass defines the dunder itself: generic is right
            if srec is not None and field in srec.fields:
                value = srec.fields[field]
            else:
                value = rec.slot_orig[field]
            # heap types: their own embedded struct; static subtypes readied while patched:
            # a field that inherit_slots wrote, so it is writable
            _write_ptr(addr, value)
            changed = True
        if changed:
            _type_modified(sub)

    # ---- the type itself
    view = _PyTypeObject.from_address(id(tp))
    if new_nb_addr and view.tp_as_number == new_nb_addr:
        _write_ptr(_type_field_addr(tp, "tp_as_number"), rec.orig_nb_ptr)
    elif rec.new_nb is None and view.tp_as_number:
        for field in fields:
            if field != _RICHCMP:
                _write_ptr(view.tp_as_number + _nb_field_offset(field), rec.slot_orig[field])
    if _RICHCMP in rec.slot_orig:
        _write_ptr(_type_field_addr(tp, "tp_richcompare"), rec.slot_orig[_RICHCMP])
    if rec.call_orig:
        _write_ptr(_type_field_addr(tp, "tp_call"), rec.call_orig)
        if rec.vectorcall_flag:
            flags = ctypes.c_ulong.from_address(_type_field_addr(tp, "tp_flags"))
            flags.value |= rec.vectorcall_flag

    d = _real_dict(tp)
    displaced: list[Any] = []  # freed only after PyType_Modified (see _write_dict)
    for name, value in rec.dict_orig.items():
        _write_dict(d, name, value, displaced)
    _type_modified(tp)
    del displaced


def restore_all() -> None:
    """``restore`` every type changed by this module (last changed first)."""
    with _STATE_LOCK:
        for tp in reversed(list(_RECORDS)):
            restore(tp)


# ---------------------------------------------------------------------------------------------
# Calls (ufuncs, array-function dispatchers)
# ---------------------------------------------------------------------------------------------


def install_call_slot(tp: type, func: Callable[..., Any]) -> None:
    """Route every call of an instance of ``tp`` through ``func(self, *args, **kwargs)``.

    ``np.add(x, y)`` looks nothing up by name either: CPython calls the object's vectorcall
    function (``PyUFuncObject.vectorcall``, found through ``tp_vectorcall_offset`` when the
    type has ``Py_TPFLAGS_HAVE_VECTORCALL``), else the type's ``tp_call``.  Here ``func`` goes
    into the type's real dict as ``__call__``, ``tp_call`` is pointed at CPython's generic
    ``slot_tp_call`` (which looks ``__call__`` up on the type and calls it with the instance
    prepended) and ``Py_TPFLAGS_HAVE_VECTORCALL`` is cleared, so that ``PyObject_Vectorcall``,
    ``PyObject_Call`` and the interpreter's generic call path all end up in ``tp_call``.

    The instances themselves are not touched: identity, type, pickling and everything NumPy's
    C code reads from them stay as they were.  ``func`` calls the original through the saved
    slot wrapper (``original(tp, "__call__")``, a ``wrapper_descriptor`` whose ``d_wrapped`` is
    the original ``tp_call``).  For a vectorcall type that original is ``PyVectorcall_Call``,
    which reads the instance's vectorcall pointer *without* checking the type flag, so it
    still reaches NumPy's fast path.  Nothing is written before every check passed:
    ``__call__`` must be ``tp``'s own slot wrapper of the ``tp_call`` slotdefs entry wrapping
    the current ``tp_call``, and ``tp`` may have no subclasses and admit none
    (``Py_TPFLAGS_BASETYPE`` unset: ``np.ufunc`` and NumPy's dispatcher type), so no
    inherited slot has to be followed.  ``restore(tp)`` undoes it.
    """
    _check_type(tp)
    layout = _layout_or_raise()
    if not isinstance(func, types.FunctionType):
        raise TypeError(f"expected a Python function (a descriptor), got {func!r}")
    with _STATE_LOCK:
        fresh = tp not in _RECORDS
        rec = _record(tp)
        try:
            _install_call_locked(tp, func, layout, rec)
        except BaseException:
            if fresh and not rec.dict_orig and not rec.slot_orig and not rec.call_orig:
                del _RECORDS[tp]
            raise


def _install_call_locked(tp: type, func: Any, layout: _Layout, rec: _TypeRecord) -> None:
    d = _real_dict(tp)
    problem = _check_type_prefix(tp)
    if problem:
        raise RuntimeError(problem)
    if tp.__flags__ & _Py_TPFLAGS_BASETYPE or type.__subclasses__(tp):
        raise RuntimeError(f"{tp.__name__} can be subclassed: its calls are not switched")
    view = _PyTypeObject.from_address(id(tp))
    if not rec.call_orig:
        offset, function, _wrapper, wrapped = _read_wrapper(tp, "__call__")
        if offset != _PyTypeObject.tp_call.offset or function != layout.generic_call:
            raise RuntimeError(f"{tp.__name__}.__call__: slotdefs entry is not tp_call")
        if (view.tp_call or 0) != wrapped:
            raise RuntimeError(f"{tp.__name__}.tp_call is not the function __call__ wraps")
        flag = tp.__flags__ & _Py_TPFLAGS_HAVE_VECTORCALL
        if flag and view.tp_vectorcall_offset <= 0:
            raise RuntimeError(f"{tp.__name__} has vectorcall but no vectorcall offset")
        _remember_dict(rec, d, "__call__")
        rec.call_orig, rec.vectorcall_flag = wrapped, flag
    displaced: list[Any] = []  # freed only after PyType_Modified (see _write_dict)
    _write_dict(d, "__call__", func, displaced)
    _write_ptr(_type_field_addr(tp, "tp_call"), layout.generic_call)
    if rec.vectorcall_flag:
        flags = ctypes.c_ulong.from_address(_type_field_addr(tp, "tp_flags"))
        flags.value &= ~rec.vectorcall_flag
    _type_modified(tp)
    del displaced
