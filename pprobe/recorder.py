"""The per-call hot path shared by every interceptor.

An interceptor turns each call it sees into ``call(op, fn, args, kwargs)``. Whether an op is
captured at all is decided once per op (include/exclude) and kept on its :class:`Op`; the
per-call path only checks a few flags, describes the arrays, calls the function and appends
one raw tuple to :data:`rows`. Turning rows into Arrow batches happens in the writer thread.

Rules (docs/how-it-works.md):
- only the outermost call is recorded unless ``nested`` is on; then depth and parent are set;
- while pprobe does its own work the thread's depth is ``state.INTERNAL``: nothing records;
- a failure inside pprobe is reported once and the user's call goes on untouched; the user's
  exception propagates unchanged (the row records its type in ``status``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from . import _report, state, values
from .state import INTERNAL

#: Raw rows waiting for the writer. deque.append/popleft are atomic: no lock, no lost row.
#: (seq, op, t0, t1, thread ident, step, depth, parent, caller code, caller line, status,
#:  tensor descs, other args, module path, phase)
rows: deque = deque()

_local = state.local
_get_ident = threading.get_ident
_getframe = sys._getframe

# Settings read by the hot path; set by configure().
_active = False  # a session is on and the current step is inside the step window
_nested = False
_mode = 0  # 0 log, 1 stats, 2 dump
_dtypes: frozenset[str] = frozenset()
_flush_rows = 16384
_wake: Callable[[], None] | None = None  # asks the writer to flush early
_dumper: Any = None
_cfg: Any = None
_pid = os.getpid()

MODES = {"log": 0, "stats": 1, "dump": 2}


class Op:
    """One recordable callable: its name, kind and whether/when it is captured."""

    __slots__ = (
        "name",
        "kind",
        "framework",
        "ufunc",
        "selected",
        "calls",
        "every",
        "first",
        "sampled",
        "safe",
    )

    def __init__(self, name: str, kind: str, framework: str, ufunc: str | None = None) -> None:
        self.name = name
        self.kind = kind
        self.framework = framework
        self.ufunc = ufunc
        self.calls = 0
        self.safe = ""
        self._configure()

    def _configure(self) -> None:
        cfg = _cfg
        self.calls = 0
        if cfg is None:
            self.selected, self.every, self.first, self.sampled = True, 1, 0, False
            return
        self.selected = cfg.op_selected(self.name) and self.framework in cfg.frameworks
        self.every, self.first = cfg.every, cfg.first
        self.sampled = self.every > 1 or self.first > 0

    def take(self) -> bool:
        """every-N / first-N sampling (counts are per process; threads may race by one)."""
        n = self.calls
        self.calls = n + 1
        if self.first and n >= self.first:
            return False
        return n % self.every == 0


_ops: dict[tuple[str, str], Op] = {}


def op(name: str, kind: str, framework: str, ufunc: str | None = None) -> Op:
    """The shared :class:`Op` for a name and kind (created once, configured by the session)."""
    key = (name, kind)
    o = _ops.get(key)
    if o is None:
        o = _ops[key] = Op(name, kind, framework, ufunc)
    return o


def configure(cfg: Any, dumper: Any, wake: Callable[[], None] | None) -> None:
    global _cfg, _nested, _mode, _dtypes, _flush_rows, _dumper, _wake, _pid
    _cfg = cfg
    _nested = cfg.nested
    _mode = MODES[cfg.mode]
    _dtypes = frozenset(cfg.dtypes)
    _flush_rows = cfg.flush_rows
    _dumper = dumper
    _wake = wake
    _pid = os.getpid()
    for o in _ops.values():
        o._configure()
    refresh_active()


def refresh_active() -> None:
    """Recompute the master switch (session on, step inside the window)."""
    global _active
    _active = _cfg is not None and _cfg.enabled and _cfg.step_selected(state.step)


def deactivate() -> None:
    global _active, _cfg
    _active = False
    _cfg = None


def after_fork() -> None:
    global _pid
    _pid = os.getpid()
    rows.clear()  # the parent's unflushed rows belong to the parent's shard


def set_step(n: int) -> None:
    state.step = n
    if _cfg is not None and _cfg.steps:
        refresh_active()


# ---------------------------------------------------------------------- callers
_internal_code: dict[Any, bool] = {}
_internal_prefixes: list[str] = [os.path.dirname(os.path.abspath(__file__)) + os.sep]


def add_internal_path(path: str) -> None:
    """Frames from files under ``path`` are never reported as the caller (numpy, torch)."""
    p = os.path.dirname(os.path.abspath(path)) + os.sep
    if p not in _internal_prefixes:
        _internal_prefixes.append(p)
        _internal_code.clear()


def _is_internal(code: Any) -> bool:
    r = _internal_code.get(code)
    if r is None:
        fn = code.co_filename
        r = _internal_code[code] = fn.startswith(tuple(_internal_prefixes)) or (
            fn.startswith("<frozen") or fn.startswith("<__array_function__")
        )
    return r


def _caller() -> tuple[Any, int]:
    f: Any = _getframe(2)
    while f is not None:
        code = f.f_code
        r = _internal_code.get(code)
        if r is None:
            r = _is_internal(code)
        if not r:
            return code, f.f_lineno
        f = f.f_back
    return None, 0


# ---------------------------------------------------------------------- the hot path
def call(op: Op, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run ``fn(*args, **kwargs)``, recording it as a call of ``op`` when it is captured."""
    depth = _local.depth
    if (depth and (depth >= INTERNAL or not _nested)) or not _active or not op.selected:
        return fn(*args, **kwargs)
    if op.sampled and not op.take():
        return fn(*args, **kwargs)
    return _record(op, fn, args, kwargs, depth)


def _record(op: Op, fn: Callable, args: tuple, kwargs: dict, depth: int) -> Any:
    loc = _local
    try:
        loc.depth = INTERNAL
        seq = next(state.seq)
        arrays, others = values.collect(args, kwargs)
        if _dtypes and arrays and not _dtype_match(arrays):
            loc.depth = depth
            return fn(*args, **kwargs)
        prefix = f"{_pid}-{seq}" if _mode == 2 else ""
        ins = [_describe(op, "input", idx, x, h, prefix) for idx, x, h in arrays]
        code, line = _caller()
    except Exception as e:  # pprobe's own failure: never the user's problem
        loc.depth = depth
        _report.internal_error("recording inputs", e)
        return fn(*args, **kwargs)
    parent = loc.parent
    loc.depth = depth + 1
    loc.parent = seq
    t0 = perf_counter_ns()
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:
        t1 = perf_counter_ns()
        loc.depth = depth
        loc.parent = parent
        rows.append(
            (
                seq,
                op,
                t0,
                t1,
                _get_ident(),
                state.step,
                depth,
                parent,
                code,
                line,
                type(e).__name__,
                ins,
                others,
                loc.module,
                loc.phase,
            )
        )
        raise
    t1 = perf_counter_ns()
    loc.parent = parent
    try:
        loc.depth = INTERNAL
        outs = values.outputs(result)
        if _dtypes and not arrays and outs and not _dtype_match(outs):
            return result
        if outs:
            many = len(outs) > 1
            for idx, x, h in outs:
                ins.append(_describe(op, "output", idx, x, h, prefix, many))
        rows.append(
            (
                seq,
                op,
                t0,
                t1,
                _get_ident(),
                state.step,
                depth,
                parent,
                code,
                line,
                "ok",
                ins,
                others,
                loc.module,
                loc.phase,
            )
        )
        if not seq & 1023 and len(rows) >= _flush_rows and _wake is not None:
            _wake()
    except Exception as e:
        _report.internal_error("recording outputs", e)
    finally:
        loc.depth = depth
    return result


def _dtype_match(arrays: list) -> bool:
    for _idx, x, h in arrays:
        if h.dtype_name(x) in _dtypes:
            return True
    return False


def _describe(
    op: Op, role: str, idx: str, x: Any, h: Any, prefix: str, many: bool = False
) -> tuple:
    """One tensor description, with statistics and a dump as the mode asks."""
    shape, dtype, device, grad = h.meta(x)
    if _mode == 0:
        return (role, idx, shape, dtype, device, grad, None, None, None)
    if role == "input" and idx == "out":
        return (role, idx, shape, dtype, device, grad, None, None, "out= buffer")
    try:
        st = h.stats(x)
    except Exception as e:
        _report.internal_error(f"statistics ({type(x).__name__})", e)
        st = None
    path = note = None
    if _mode == 2:
        arr, note = h.dumpable(x)
        if arr is not None:
            which = f"input{idx}" if role == "input" else (f"output{idx}" if many else "output")
            path, note2 = _dumper.dump(arr, op.name, which, prefix)
            note = note2 or note
    return (role, idx, shape, dtype, device, grad, st, path, note)
