"""Describing the values an op receives and returns.

The hot path calls :func:`collect` on an op's arguments: arrays of a registered type come back
with their handler, everything else as a short value for the ``args`` column. Handlers know
their framework's arrays (shape, dtype, statistics, how to dump); NumPy's is registered when
NumPy is imported, torch's when torch is. Classification is cached per Python type.
"""

from __future__ import annotations

import reprlib
import struct
from collections.abc import Callable
from itertools import islice
from typing import Any, Protocol

#: One tensor description: the in-memory form of a row of the ``tensors`` table.
#: (role, idx, shape, dtype, device, requires_grad, stats, dump_path, note)
Desc = tuple


class ArrayHandler(Protocol):
    framework: str

    def meta(self, x: Any) -> tuple[bytes, Any, str | None, bool | None]:
        """Shape (packed: :func:`pack_shape`), dtype (any object whose str() is the name),
        device, requires_grad."""

    def light(self, role: str, idx: str, x: Any) -> tuple:
        """The log-mode description: (role, idx, packed shape, dtype, device, requires_grad,
        None, None, None). Must be cheap and must not synchronise an accelerator."""

    def dtype_name(self, x: Any) -> str: ...

    def stats(self, x: Any) -> Any:
        """(min, max, mean, std, nan_count, inf_count), None when not numeric, a :class:`Lazy`
        resolving to that tuple, or a str: why there are none (goes to the row's note)."""

    def dumpable(self, x: Any) -> tuple[Any, str | None]:
        """(numpy array or :class:`Dumpable` to save, note) or (None, reason it is not)."""


class Lazy:
    """A value still being computed (statistics on an accelerator, a dump being copied off
    it): a handler may put one where a tensor description has its stats or dump path; the
    writer thread calls :meth:`resolve` before it builds the row (stats: the tuple; dump
    path: (path, note))."""

    __slots__ = ()

    def resolve(self) -> Any:
        raise NotImplementedError


class Dumpable:
    """What a handler's ``dumpable()`` may return instead of a NumPy array: an object that
    saves itself (a dtype tag in the file name, a deferred device copy) and returns
    (path or :class:`Lazy`, note)."""

    __slots__ = ()

    def pprobe_dump(self, dumper: Any, op: str, which: str, prefix: str) -> tuple[Any, Any]:
        raise NotImplementedError


# ---------------------------------------------------------------------- small ints
# A buffered row holds no cached small int (-5..256): before Python 3.12 those are shared,
# refcounted objects, and NumPy's own tests count their references around a call
# (``c = sys.getrefcount(123); np.add(...); assert sys.getrefcount(123) == c``). Shapes are
# packed into bytes, small int arguments kept as their text (see recorder.rows).

#: ``SHAPE_PACK[n](*shape)``: an n-dimensional shape as native int64 bytes (n <= 64).
SHAPE_PACK = tuple(struct.Struct(f"{n}q").pack for n in range(65))


def pack_shape(shape: Any) -> bytes:
    """A shape as native int64 bytes (the writer reads them back as a list); a dimension that
    is not an int (a symbolic size) is -1."""
    try:
        n = len(shape)
        if n < 65:
            return SHAPE_PACK[n](*shape)
        return struct.pack(f"{n}q", *shape)
    except (struct.error, TypeError, OverflowError):
        dims = [d if type(d) is int and -(1 << 63) <= d < (1 << 63) else -1 for d in shape]
        return struct.pack(f"{len(dims)}q", *dims)


#: str(i) for the ints CPython caches, -5..256 (``SMALL_STR[i + 5]``).
SMALL_STR = tuple(str(i) for i in range(-5, 257))


def resolve(v: Any, where: str) -> Any:
    """``v.resolve()``, or None after reporting the failure (called by the writer)."""
    try:
        return v.resolve()
    except Exception as e:
        from . import _report

        _report.internal_error(where, e)
        return None


class Text(str):
    """A repr made at call time (of a mutable value); printed as it is."""

    __slots__ = ()


class _Kind:
    """How values of one Python type are kept in a row (arrays have their handler instead).

    ``text``: the value is turned into a string during the call, so that the row holds no
    reference to it (classes, dtypes: NumPy's own tests count their references)."""

    __slots__ = ("name", "text")

    def __init__(self, name: str, text: Any = None) -> None:
        self.name = name
        self.text = text

    def __repr__(self) -> str:
        return f"<kind {self.name}>"


_Py_TPFLAGS_HEAPTYPE = 1 << 9
#: id of a static class (never freed, so its id stays its own) -> the text of the class as an
#: argument; ~id -> the text of an instance pprobe does not repr.
_static_texts: dict[int, Text] = {}


def _type_text(tp: Any) -> Text:
    """``repr(cls)`` of a class passed as an argument (``dtype=np.float32``)."""
    t = _static_texts.get(id(tp))
    if t is not None:
        return t
    try:
        t = Text(repr(tp))
    except Exception:
        t = Text(f"<{type(tp).__name__}>")
    if not tp.__flags__ & _Py_TPFLAGS_HEAPTYPE:
        _static_texts[id(tp)] = t
    return t


def _opaque_text(tp: Any) -> Text:
    """The text of an argument pprobe does not repr: its class, as ``<module.qualname>``."""
    t = _static_texts.get(~id(tp))
    if t is not None:
        return t
    try:
        t = Text(f"<{tp.__module__}.{tp.__qualname__}>")
    except Exception:
        t = Text("<object>")
    if not tp.__flags__ & _Py_TPFLAGS_HEAPTYPE:
        _static_texts[~id(tp)] = t
    return t


_SCALAR, _SEQ, _OTHER = _Kind("scalar"), _Kind("sequence"), _Kind("other")
_TYPE = _Kind("class", _type_text)
_SCALAR_TYPES = (int, float, complex, bool, str, bytes, type(None), slice, type(Ellipsis))
_kinds: dict[type, Any] = {t: _SCALAR for t in _SCALAR_TYPES}
_kinds[list] = _SEQ
_kinds[tuple] = _SEQ
_kinds[type] = _TYPE
_handlers: list[tuple[type, ArrayHandler]] = []
#: Exact array types whose ``shape`` and ``dtype`` are C getters with no side effect (NumPy's
#: ndarray and scalar types; pprobe.interceptors.numpy_arrays fills it), and the dtype classes
#: whose instances are named by what they compare equal to: the Python engine's log mode
#: caches their descriptions by (shape, dtype) (pprobe.recorder.call). A subclass such as
#: np.ma.MaskedArray may run Python code there: it is described through its handler.
PLAIN_TYPES: set[type] = set()
PLAIN_DTYPE_CLASSES: set[type] = set()
_scalar_bases: list[type] = list(_SCALAR_TYPES)
_text_bases: list[tuple[type, _Kind]] = [(type, _TYPE)]
_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = 8


#: Called after a registration below (which may change how a type's values are shown): the
#: native core forgets the texts it learnt from :func:`other_pair` (``clear_arg_texts``).
kinds_changed: list[Callable[[], Any]] = []


def _changed() -> None:
    for f in kinds_changed:
        f()


def register(tp: type, handler: ArrayHandler) -> None:
    """Make instances of ``tp`` (and its subclasses) arrays described by ``handler``."""
    _handlers.append((tp, handler))
    for t in list(_kinds):
        if _kinds[t] is _OTHER:
            del _kinds[t]
    _changed()


def register_scalar(tp: type) -> None:
    """Immutable value types (and subclasses) kept as they are and repr'd off the hot path."""
    _scalar_bases.append(tp)
    _kinds[tp] = _SCALAR
    for t in list(_kinds):
        if _kinds[t] is _OTHER:
            del _kinds[t]
    _changed()


def register_text(tp: type, text: Any) -> None:
    """Values of ``tp`` (and subclasses) are recorded as ``text(value)``, made during the call
    (the row holds ``(None, "name=text")``): the row keeps no reference to them. ``text``
    must be cheap and must not raise."""
    k = _Kind(f"text:{tp.__qualname__}", text)
    _text_bases.insert(0, (tp, k))
    _kinds[tp] = k
    for t in list(_kinds):
        if _kinds[t] is _OTHER or (_kinds[t] is _TYPE and issubclass(t, tp)):
            del _kinds[t]
    _changed()


def kind_of(tp: type) -> Any:
    k = _kinds.get(tp)
    if k is None:
        k = _OTHER
        for base, h in _handlers:
            if issubclass(tp, base):
                k = h
                break
        else:
            if issubclass(tp, (list, tuple)):
                k = _SEQ
            else:
                for base, tk in _text_bases:
                    if issubclass(tp, base):
                        k = tk
                        break
                else:
                    if issubclass(tp, tuple(_scalar_bases)):
                        k = _SCALAR
        _kinds[tp] = k
    return k


_IDX = tuple(str(i) for i in range(64))
#: Elements of a list or tuple (argument or result) looked into for arrays; past these, a long
#: sequence's arrays are not described.
MAX_ELEMENTS = 1024


def collect(args: tuple, kwargs: dict) -> tuple[list, list]:
    """Split arguments into arrays [(idx, x, handler)] and other values [(idx, value)]."""
    arrays: list = []
    others: list = []
    get = _kinds.get
    i = 0
    for a in args:
        tp = type(a)
        k = get(tp) or kind_of(tp)
        if k is _SCALAR:
            if tp is int:
                if -6 < a < 257:  # a cached small int: its text (see SMALL_STR)
                    others.append((None, f"{_IDX[i] if i < 64 else i}={SMALL_STR[a + 5]}"))
                else:
                    others.append((_IDX[i] if i < 64 else str(i), a))
            elif tp is slice:
                others.append((None, f"{_IDX[i] if i < 64 else i}={scalar_text(a)}"))
            else:
                others.append((_IDX[i] if i < 64 else str(i), a))
        elif k.__class__ is _Kind:
            if k.text is not None:  # classes, dtypes: their text now
                others.append((None, f"{_IDX[i] if i < 64 else i}={k.text(a)}"))
            else:
                _one(_IDX[i] if i < 64 else str(i), a, arrays, others)
        else:
            arrays.append((_IDX[i] if i < 64 else str(i), a, k))
        i += 1
    if kwargs:
        for name, a in kwargs.items():
            _one(name, a, arrays, others)
    return arrays, others


def other_pair(idx: str, a: Any) -> tuple | None:
    """For the native core (``_native.set_other_pair``): the (name, value) pair
    :func:`collect` records for an argument the core does not describe itself (a class, a
    dtype, a short tuple, an object shown by its type), or None when ``a`` is or holds an
    array: the core then leaves the whole call to the Python path."""
    arrays: list = []
    others: list = []
    _one(idx, a, arrays, others)
    if arrays or len(others) != 1:
        return None
    return others[0]  # type: ignore[no-any-return]


def shown_by_type(tp: type) -> bool:
    """Whether values of ``tp`` are recorded as their type's text alone (``<module.name>``):
    the native core then keeps that text per type (``describe_arg``)."""
    return (_kinds.get(tp) or kind_of(tp)) is _OTHER


def _one(idx: str, a: Any, arrays: list, others: list) -> None:
    tp = type(a)
    k = _kinds.get(tp) or kind_of(tp)
    if k is _SCALAR:
        if tp is int:
            if -6 < a < 257:
                others.append((None, f"{idx}={SMALL_STR[a + 5]}"))
            else:
                others.append((idx, a))
        elif tp is slice:
            others.append((None, f"{idx}={scalar_text(a)}"))
        else:
            others.append((idx, a))
    elif k is _SEQ:
        if len(a) <= 8:
            _short_seq(idx, a, tp, arrays, others)
            return
        found = False
        # Only the first MAX_ELEMENTS are looked into: ``np.concatenate((a,) * 2**31)`` must
        # not make pprobe build 2**31 descriptions (NumPy itself refuses it, as it should).
        for j, e in enumerate(a if len(a) <= MAX_ELEMENTS else islice(a, MAX_ELEMENTS)):
            ke = _kinds.get(type(e)) or kind_of(type(e))
            if ke is _SCALAR or ke.__class__ is _Kind:
                continue
            arrays.append((f"{idx}.{j}", e, ke))
            found = True
        if not found:
            others.append((None, f"{idx}={_safe_repr(a)}"))
    elif k is _OTHER:
        others.append((None, f"{idx}={_opaque_text(tp)}"))
    elif k.__class__ is _Kind:
        others.append((None, f"{idx}={k.text(a)}"))
    else:
        arrays.append((idx, a, k))


def _short_seq(idx: str, a: Any, tp: type, arrays: list, others: list) -> None:
    """A list or tuple of at most 8 elements: its arrays, or, when it holds only scalars, the
    sequence kept as a tuple (an immutable snapshot, repr'd by the writer: reprlib on the hot
    path cost ~20 us). One that holds a cached small int (or a slice, which may) is kept as its
    text or, when it is all ints (shapes, axes), packed: see :func:`arg_text`."""
    found = False
    simple = True
    small = False
    ints = True
    j = 0
    for e in a:
        te = type(e)
        ke = _kinds.get(te) or kind_of(te)
        if ke is _SCALAR:
            if te is int:
                if -6 < e < 257:
                    small = True
            else:
                ints = False
                if te is slice:
                    small = True
        elif ke.__class__ is _Kind:
            simple = False
        else:
            arrays.append((f"{idx}.{j}", e, ke))
            found = True
        j += 1
    if found:
        return
    if not simple:
        others.append((None, f"{idx}={_safe_repr(a)}"))
        return
    t = a if tp is tuple else tuple(a)
    if not small:
        others.append((idx, t))
    elif ints:
        try:
            others.append((None, (idx, SHAPE_PACK[len(t)](*t))))  # repr(t) costs 5x more
        except struct.error:  # past int64
            others.append((None, f"{idx}={_short_seq_text(t)}"))
    else:
        others.append((None, f"{idx}={_short_seq_text(t)}"))


def outputs(result: Any) -> list:
    """Arrays among an op's results: [(idx, x, handler)] (tuples and lists looked into)."""
    tp = type(result)
    k = _kinds.get(tp) or kind_of(tp)
    if k is _SEQ:
        out = []
        n = len(result)
        for j, e in enumerate(result if n <= MAX_ELEMENTS else islice(result, MAX_ELEMENTS)):
            ke = _kinds.get(type(e)) or kind_of(type(e))
            if ke.__class__ is not _Kind:
                out.append((str(j), e, ke))
        return out
    if k.__class__ is _Kind:
        return []
    return [("0", result, k)]  # type: ignore[list-item]


def scalar_text(v: Any) -> str:
    """The args text of a scalar that is not a str or an int (a slice, a torch.Size), made
    now: what :func:`format_value` would write for it (reprlib shortens such reprs to 60)."""
    try:
        s = repr(v)
    except Exception:
        return f"<{type(v).__name__}>"
    if len(s) > 60:
        s = s[:28] + "..." + s[-29:]
    return s


def _short_seq_text(t: tuple) -> str:
    """What :func:`format_value` writes for a tuple of at most 8 scalars, made during the call:
    ``repr(t)`` equals reprlib's when no element's repr is longer than 40 (reprlib shortens
    longer ints, strs and reprs), and is ~10x cheaper."""
    try:
        s = repr(t)
        if len(s) > 40 and any(len(repr(e)) > 40 for e in t):
            s = _safe_repr(t)
    except Exception:
        s = _safe_repr(t)
    return s if len(s) <= 80 else s[:77] + "..."


def _safe_repr(v: Any) -> str:
    try:
        return _repr.repr(v)
    except Exception:
        return f"<{type(v).__name__}>"


def arg_text(idx: str | None, v: Any) -> str:
    """One argument of the args column, ``name=value``, from the pair :func:`collect` made
    (called at flush time). A pair is (name, value) for a value kept as it is; (None,
    "name=value") for a text made during the call (a cached small int, a slice, a class, a
    dtype, an object shown by its type: a plain ``str``, which the garbage collector does not
    track, unlike :class:`Text`); or (None, (name, packed)): a short tuple of ints packed as a
    shape (:data:`SHAPE_PACK`)."""
    if idx is not None:
        return f"{idx}={format_value(v)}"
    if v.__class__ is str:
        return v
    name, packed = v
    # at most 8 int64s: repr() is what reprlib writes (ints are shortened past 40 digits)
    s = repr(tuple(memoryview(packed).cast("q").tolist()))
    return f"{name}={s if len(s) <= 80 else s[:77] + '...'}"


def format_value(v: Any) -> str:
    """Called at flush time for the args column."""
    if isinstance(v, Text):
        return v
    c = v.__class__
    if c is float or c is bool or v is None:  # what reprlib writes (repr), ~10x cheaper
        return repr(v)
    if c is int or c is str:  # reprlib shortens an int's repr past 40, a str's past 60
        try:
            s = repr(v)
        except ValueError:  # an int past sys.get_int_max_str_digits(): _safe_repr's text
            s = ""
        if 0 < len(s) <= (40 if c is int else 60):
            return s
    s = _safe_repr(v)
    return s if len(s) <= 80 else s[:77] + "..."
