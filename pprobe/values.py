"""Describing the values an op receives and returns.

The hot path calls :func:`collect` on an op's arguments: arrays of a registered type come back
with their handler, everything else as a short value for the ``args`` column. Handlers know
their framework's arrays (shape, dtype, statistics, how to dump); NumPy's is registered when
NumPy is imported, torch's when torch is. Classification is cached per Python type.
"""

from __future__ import annotations

import reprlib
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


class Opaque:
    """Stands for an argument pprobe does not repr (arbitrary objects may be slow or unsafe)."""

    __slots__ = ("tp",)

    def __init__(self, tp: type) -> None:
        self.tp = tp

    def __repr__(self) -> str:
        return f"<{self.tp.__module__}.{self.tp.__qualname__}>"


_SCALAR, _SEQ, _OTHER = object(), object(), object()
_SCALAR_TYPES = (int, float, complex, bool, str, bytes, type(None), slice, type(Ellipsis), type)
_kinds: dict[type, Any] = {t: _SCALAR for t in _SCALAR_TYPES}
_kinds[list] = _SEQ
_kinds[tuple] = _SEQ
_handlers: list[tuple[type, ArrayHandler]] = []
_scalar_bases: list[type] = list(_SCALAR_TYPES)
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
            elif issubclass(tp, tuple(_scalar_bases)):
                k = _SCALAR
        _kinds[tp] = k
    return k


_IDX = tuple(str(i) for i in range(64))


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
        elif k is _SEQ or k is _OTHER:
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
        for j, e in enumerate(a):
            ke = _kinds.get(type(e)) or kind_of(type(e))
            if ke is _SCALAR:
                continue
            if ke is _SEQ or ke is _OTHER:
                simple = False
            else:
                arrays.append((f"{idx}.{j}", e, ke))
                found = True
        if not found:
            # Tuples of scalars are immutable: keep them; anything else is repr'd now.
            others.append((idx, a if simple and tp is tuple else Text(_safe_repr(a))))
    elif k is _OTHER:
        others.append((idx, Opaque(tp)))
    else:
        arrays.append((idx, a, k))


def outputs(result: Any) -> list:
    """Arrays among an op's results: [(idx, x, handler)] (tuples and lists looked into)."""
    tp = type(result)
    k = _kinds.get(tp) or kind_of(tp)
    if k is _SCALAR or k is _OTHER:
        return []
    if k is _SEQ:
        out = []
        for j, e in enumerate(result):
            ke = _kinds.get(type(e)) or kind_of(type(e))
            if ke is not _SCALAR and ke is not _SEQ and ke is not _OTHER:
                out.append((str(j), e, ke))
        return out
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
