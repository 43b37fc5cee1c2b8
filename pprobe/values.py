"""Describing the values an op receives and returns.

The hot path calls :func:`collect` on an op's arguments: arrays of a registered type come back
with their handler, everything else as a short value for the ``args`` column. Handlers know
their framework's arrays (shape, dtype, statistics, how to dump); NumPy's is registered when
NumPy is imported, torch's when torch is. Classification is cached per Python type.
"""

from __future__ import annotations

import reprlib
from itertools import islice
from typing import Any, Protocol

#: One tensor description: the in-memory form of a row of the ``tensors`` table.
#: (role, idx, shape, dtype, device, requires_grad, stats, dump_path, note)
Desc = tuple


class ArrayHandler(Protocol):
    framework: str

    def meta(self, x: Any) -> tuple[tuple[int, ...], Any, str | None, bool | None]:
        """Shape, dtype (any object whose str() is the name), device, requires_grad."""

    def light(self, role: str, idx: str, x: Any) -> tuple:
        """The log-mode description: (role, idx, shape, dtype, device, requires_grad,
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
_scalar_bases: list[type] = list(_SCALAR_TYPES)
_text_bases: list[tuple[type, _Kind]] = [(type, _TYPE)]
_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = 8


def register(tp: type, handler: ArrayHandler) -> None:
    """Make instances of ``tp`` (and its subclasses) arrays described by ``handler``."""
    _handlers.append((tp, handler))
    for t in list(_kinds):
        if _kinds[t] is _OTHER:
            del _kinds[t]


def register_scalar(tp: type) -> None:
    """Immutable value types (and subclasses) kept as they are and repr'd off the hot path."""
    _scalar_bases.append(tp)
    _kinds[tp] = _SCALAR
    for t in list(_kinds):
        if _kinds[t] is _OTHER:
            del _kinds[t]


def register_text(tp: type, text: Any) -> None:
    """Values of ``tp`` (and subclasses) are recorded as ``text(value)``, a :class:`Text` made
    during the call: the row keeps no reference to them. ``text`` must be cheap and must not
    raise."""
    k = _Kind(f"text:{tp.__qualname__}", text)
    _text_bases.insert(0, (tp, k))
    _kinds[tp] = k
    for t in list(_kinds):
        if _kinds[t] is _OTHER or (_kinds[t] is _TYPE and issubclass(t, tp)):
            del _kinds[t]


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
            others.append((_IDX[i] if i < 64 else str(i), a))
        elif k.__class__ is _Kind:
            if k.text is not None:  # classes, dtypes: their text now
                others.append((_IDX[i] if i < 64 else str(i), k.text(a)))
            else:
                _one(_IDX[i] if i < 64 else str(i), a, arrays, others)
        else:
            arrays.append((_IDX[i] if i < 64 else str(i), a, k))
        i += 1
    if kwargs:
        for name, a in kwargs.items():
            _one(name, a, arrays, others)
    return arrays, others


def _one(idx: str, a: Any, arrays: list, others: list) -> None:
    tp = type(a)
    k = _kinds.get(tp) or kind_of(tp)
    if k is _SCALAR:
        others.append((idx, a))
    elif k is _SEQ:
        found = False
        simple = len(a) <= 8
        # Only the first MAX_ELEMENTS are looked into: ``np.concatenate((a,) * 2**31)`` must
        # not make pprobe build 2**31 descriptions (NumPy itself refuses it, as it should).
        for j, e in enumerate(a if len(a) <= MAX_ELEMENTS else islice(a, MAX_ELEMENTS)):
            ke = _kinds.get(type(e)) or kind_of(type(e))
            if ke is _SCALAR:
                continue
            if ke.__class__ is _Kind:
                simple = False
            else:
                arrays.append((f"{idx}.{j}", e, ke))
                found = True
        if not found:
            # A short sequence of scalars is kept as a tuple (an immutable snapshot, repr'd by
            # the writer: reprlib on the hot path cost ~20 us); anything else is repr'd now.
            if simple:
                others.append((idx, a if tp is tuple else tuple(a)))
            else:
                others.append((idx, Text(_safe_repr(a))))
    elif k is _OTHER:
        others.append((idx, _opaque_text(tp)))
    elif k.__class__ is _Kind:
        others.append((idx, k.text(a)))
    else:
        arrays.append((idx, a, k))


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


def _safe_repr(v: Any) -> str:
    try:
        return _repr.repr(v)
    except Exception:
        return f"<{type(v).__name__}>"


def format_value(v: Any) -> str:
    """Called at flush time for the args column."""
    if isinstance(v, Text):
        return v
    s = _safe_repr(v)
    return s if len(s) <= 80 else s[:77] + "..."
