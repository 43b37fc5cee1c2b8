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
import types
from array import array
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from . import _report, core, opsets, records, state, values
from .state import INTERNAL

#: Rows waiting for the writer, in the layout of :mod:`pprobe.records` (fixed-size records,
#: texts as string ids, rare values as objects beside them). The native core swaps in its own
#: buffer with the same methods (:mod:`pprobe.core`).
buffer: Any = records.Buffer()
_encode = records.encode_row

_local = state.local
_getframe = sys._getframe

# Settings read by the hot path; set by configure().
_active = False  # a session is on and the current step is inside the step window
_nested = False
_parents = False  # keep loc.parent current: nested calls, or torch's nesting levels
_want_parents = False  # asked for by an interceptor (torch aten/module levels)
_mode = 0  # 0 log, 1 stats, 2 dump
_dtypes: frozenset[str] = frozenset()
_flush_rows = 16384
_wake: Callable[[], None] | None = None  # asks the writer to flush early
_dumper: Any = None
_cfg: Any = None
_on_nan = 0  # PPROBE_ON_NAN: 0 off, 1 warn, 2 raise, 3 dump; reset to 0 once it fired
_flush: Callable[[], None] | None = None  # writes the buffered rows now (writer.flush)
_nan_allow: tuple[str, ...] = ()  # pprobe nan's allowlist (opsets.DEFAULT_ALLOW + nan_allow)
_inf_allowed: dict[str, int] = {}  # op name -> 0 no, 1 its infs are expected, 2 on a 0/1 mask
_pid = os.getpid()

MODES = {"log": 0, "stats": 1, "dump": 2}

#: The native core (pprobe/_native.c) when it is the engine (pprobe.core), else None.
_native = core.native
_FRAMEWORK_CODES = {"numpy": 1, "torch": 2}


ops_by_index: list[Op] = []

#: Outputs of :data:`pprobe.opsets.UNINITIALISED` ops are uninitialised memory: their
#: statistics are noise (±1e38 "largest values", NaNs that mean nothing), so they get none,
#: and no dump: the row's note says why.
UNINITIALISED_NOTE = "uninitialised memory: no statistics, not dumped"
OUT_NOTE = "out= buffer"  # an out= input: no statistics (pprobe/statscore.py says the same)


class Op:
    """One recordable callable: its name, kind and whether/when it is captured."""

    __slots__ = (
        "index",
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
        "hidden",
        "uninit",
    )

    def __init__(
        self, name: str, kind: str, framework: str, ufunc: str | None = None, hidden: bool = False
    ) -> None:
        self.index = len(ops_by_index)
        ops_by_index.append(self)
        self.name = name
        self.kind = kind
        self.framework = framework
        self.ufunc = ufunc
        self.calls = 0
        self.safe = ""
        self.hidden = hidden  # never a row, and what it calls is hidden (np.seterr, ...)
        self.uninit = opsets.UNINITIALISED_RE.match(name) is not None
        self._configure()

    def _configure(self) -> None:
        cfg = _cfg
        self.calls = 0
        if cfg is None:
            self.selected, self.every, self.first, self.sampled = not self.hidden, 1, 0, False
        else:
            self.selected = (
                not self.hidden and cfg.op_selected(self.name) and self.framework in cfg.frameworks
            )
            self.every, self.first = cfg.every, cfg.first
            self.sampled = self.every > 1 or self.first > 0
        if _native is not None:
            _native.set_op(self.index, self.selected, self.every, self.first,
                           _FRAMEWORK_CODES.get(self.framework, 0))  # fmt: skip

    def take(self) -> bool:
        """every-N / first-N sampling (counts are per process; threads may race by one)."""
        n = self.calls
        self.calls = n + 1
        if self.first and n >= self.first:
            return False
        return n % self.every == 0


_ops: dict[tuple[str, str], Op] = {}


def op(name: str, kind: str, framework: str, ufunc: str | None = None, hidden: bool = False) -> Op:
    """The shared :class:`Op` for a name and kind (created once, configured by the session)."""
    key = (name, kind)
    o = _ops.get(key)
    if o is None:
        o = _ops[key] = Op(name, kind, framework, ufunc, hidden)
    return o


#: The phase of rows no hook gave one (``state.local.phase`` None): "init" until training
#: starts (:func:`training_started`), "other" after. docs/schema.md says the whole rule.
_phase_default: str | None = None
_training = False


def training_started() -> None:
    """Training began (the first module forward, optimizer step or step boundary): rows
    outside forward/backward/optimizer are ``other`` from now on instead of ``init``."""
    global _training
    if not _training:
        _training = True
        _set_default_phase("other")


#: The native core's ``where()`` while rows read their module from the frames
#: (interceptors.torch_modules), else None: the thread's fields say.
_where: Callable[[], tuple[Any, Any]] | None = None


def set_where(fn: Callable[[], tuple[Any, Any]] | None) -> None:
    global _where
    _where = fn


def _set_default_phase(p: str | None) -> None:
    global _phase_default
    _phase_default = p
    if _native is not None:
        _native.set_default_phase(p)


def configure(
    cfg: Any,
    dumper: Any,
    wake: Callable[[], None] | None,
    flush: Callable[[], None] | None = None,
) -> None:
    global _cfg, _nested, _parents, _mode, _dtypes, _flush_rows, _dumper, _wake, _pid
    global _on_nan, _flush, _nan_allow, _stack_depth
    _stack_depth = getattr(cfg, "stack_depth", 3)
    if _native is not None:
        _native.set_stacks(_stack_id, _stack_depth)
    _cfg = cfg
    _on_nan = {"off": 0, "warn": 1, "raise": 2, "dump": 3}[getattr(cfg, "on_nan", "off")]
    _flush = flush
    _nan_allow = (*opsets.DEFAULT_ALLOW, *getattr(cfg, "nan_allow", ()))
    _inf_allowed.clear()
    _nested = cfg.nested
    _parents = _nested or _want_parents
    _mode = MODES[cfg.mode]
    _dtypes = frozenset(cfg.dtypes)
    _flush_rows = cfg.flush_rows
    _dumper = dumper
    if _native is not None:
        _native.set_dumper(*_dumper_in_core(dumper))
    _wake = wake
    _pid = os.getpid()
    _set_default_phase("other" if _training else "init")
    for o in _ops.values():
        o._configure()
    refresh_active()


def _push() -> None:
    """Hand the hot path's settings to the native core (and the Python engine's fast path)."""
    global _fast
    _fast = FAST_PATH and _active and not _mode and not _dtypes
    if _native is not None:
        # stats and dump modes stay in the core when it has the C statistics
        # (pprobe/statscore.py); dumps are taken through _native_dump
        slow = bool(_dtypes) or (_mode >= 1 and (bool(_on_nan) or not _stats_in_core()))
        _native.configure(_active, _nested, _parents, _mode, slow, _flush_rows, _wake)


_core_stats: bool | None = None


def _stats_in_core() -> bool:
    global _core_stats
    if _core_stats is None:
        from . import statscore

        _core_stats = statscore.attach(_native, UNINITIALISED_NOTE)
    return _core_stats


def want_parents(on: bool) -> None:
    """Keep ``parent`` up to date even without ``nested``: the torch interceptor's aten and
    module levels nest rows inside api and module rows."""
    global _want_parents, _parents
    _want_parents = on
    _parents = on or _nested
    _push()


def refresh_active() -> None:
    """Recompute the master switch (session on, step inside the window)."""
    global _active
    _active = _cfg is not None and _cfg.enabled and _cfg.step_selected(state.step)
    _push()


def current_config() -> Any:
    """The running session's config (None when off)."""
    return _cfg


def deactivate() -> None:
    global _active, _cfg
    _active = False
    _cfg = None
    _push()


def after_fork() -> None:
    global _pid, _intern_lock
    _pid = os.getpid()
    _intern_lock = threading.RLock()  # another thread of the parent may have held it
    buffer.clear()  # the parent's unflushed rows belong to the parent's shard
    if _native is not None:
        _native.after_fork_child()
    else:
        buffer.after_fork()


#: Called as ``f(old, new)`` after each step change (pprobe.ext.tables samples there).
step_listeners: list[Callable[[int, int], None]] = []
#: Called as ``f(old, new)`` just before a step change, while ``state.step`` is still ``old``
#: (lifecycle hooks' ``after_step``: what they record belongs to the step that ends).
step_ending_listeners: list[Callable[[int, int], None]] = []


def set_step(n: int) -> None:
    if not _training:
        training_started()
    old = state.step
    for f in step_ending_listeners:
        try:
            f(old, n)
        except Exception as e:
            _report.internal_error("a step listener", e)
    state.step = n
    if _native is not None:
        _native.set_step(n)
    if _cfg is not None and _cfg.steps:
        refresh_active()
    for f in step_listeners:
        try:
            f(old, n)
        except Exception as e:
            _report.internal_error("a step listener", e)


# ---------------------------------------------------------------------- callers
_internal_code: dict[Any, Any] = {}
#: (folder prefix, owner): frames from these files are never the caller. ``owner`` is the
#: framework whose own code it is ("numpy", "torch"), or True for pprobe and its helpers.
_internal_prefixes: list[tuple[str, Any]] = [
    (os.path.dirname(os.path.abspath(__file__)) + os.sep, True)
]


def add_internal_path(path: str, owner: Any = True) -> None:
    """Frames from the folder of ``path`` are never reported as the caller.

    With ``owner`` a framework name, a call of that framework's op made directly by that
    framework's own code (NumPy's array printing calling ``np.max``, say) is the framework's
    business, not the program's op: it is not a row and what it calls is hidden. The
    framework's own test suites (files under a ``tests`` folder, such as
    ``numpy/_core/tests/``) are programs using the framework: their frames are callers.
    """
    p = os.path.dirname(os.path.abspath(path)) + os.sep
    if all(p != q for q, _ in _internal_prefixes):
        _internal_prefixes.append((p, owner))
        _internal_code.clear()
        _clear_site_caches()
        if _native is not None:
            _native.clear_code_cache()


_IMPORT_FRAME: Any = object()  # truthy: an internal frame of the import machinery
_TESTS = os.sep + "tests" + os.sep


#: Code objects pprobe generates (trampolines swapped into framework functions): never the
#: caller, whatever file they claim to come from.
_own_code: set[Any] = set()


def add_internal_code(code: Any) -> None:
    """Frames running ``code`` are pprobe's own (see :func:`add_internal_path`)."""
    _own_code.add(code)
    _internal_code[code] = True
    _clear_site_caches()
    if _native is not None:
        _native.clear_code_cache()


def _is_internal(code: Any) -> Any:
    r = _internal_code.get(code)
    if r is None:
        fn = code.co_filename
        if code in _own_code:
            r = True
        elif fn.startswith("<frozen importlib"):
            r = _IMPORT_FRAME
        else:
            r = False
            for p, owner in _internal_prefixes:
                if fn.startswith(p):
                    r = owner
                    if owner is not True and _TESTS in os.sep + fn[len(p) :]:
                        r = False  # the framework's test suite: a program, not the framework
                    break
            if r is False and fn.startswith("<"):
                r = True
        _internal_code[code] = r
    return r


# ------------------------------------------------------------ the call, as the caller made it
# Under the Python engine the user's function is called from a pprobe frame. Python attributes a
# warning to the frame that is running (C code: PyErr_WarnEx) or ``stacklevel`` frames up: it
# would name pprobe/recorder.py, keep its once-per-location registry in pprobe's globals, and
# merge warnings from different lines of the program. So the function is called from a
# one-line trampoline made for the call site: its code claims the caller's file, line and name,
# and it runs in the caller's globals (``__name__``, ``__warningregistry__``). A warning then
# has the location, module and registry it has unprobed. (The native engine calls from C.)
_PPROBE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Line 2 is the call: the code claims to start one line above the caller's line. On the way
# out, an exception drops the trampoline's own traceback entry (Python 3.11+; on 3.10 the
# entry stays and shows the caller's line twice).
_TRAMP = next(
    c
    for c in compile(
        "def _t(fn, a, k):\n"
        "    try: return fn(*a, **k)\n"
        "    except BaseException as e: e.__traceback__ = e.__traceback__.tb_next; raise\n",
        "<pprobe>",
        "exec",
    ).co_consts
    if hasattr(c, "co_code")
)
#: Keyed by ids (hashing a code object hashes its bytecode); the code objects are kept alive
#: in _kept, so an id is never reused for another code.
_tramps: dict[tuple[int, int], Callable] = {}  # (id(code), f_lasti) -> trampoline
_mine: dict[int, int] = {}  # id(code) -> 1 pprobe's frame, 2 dispatch machinery, 0 other
_kept: list[Any] = []
#: Files of a framework's dispatch machinery between the program's call and pprobe's handler
#: (torch/overrides.py's handle_torch_function): never the caller a warning names.
_dispatch_files: tuple[str, ...] = ()


def add_dispatch_file(path: str) -> None:
    """Frames of ``path`` are skipped, like pprobe's own, when :func:`as_caller` looks for the
    frame a call came from."""
    global _dispatch_files
    if path not in _dispatch_files:
        _dispatch_files = (*_dispatch_files, path)
        _mine.clear()
        _clear_site_caches()
        if _native is not None:
            _native.clear_code_cache()


def _classify(code: Any) -> int:
    if code in _own_code or code.co_filename.startswith(_PPROBE_DIR):
        m = 1
    else:
        m = 2 if code.co_filename.startswith(_dispatch_files) else 0
    _kept.append(code)
    _mine[id(code)] = m
    return m


def as_caller(fn: Any = None) -> Callable:
    """``t(fn, args, kwargs)`` calling ``fn`` from a frame that looks like the innermost frame
    outside pprobe (file, line, function name, globals).

    Where the way up passes a framework's dispatch machinery, and the frame above it runs
    ``fn``'s own code, that frame is skipped too: ``fn`` dispatched to pprobe (torch's
    ``__torch_function__`` protocol) and runs again, and the program's call of it is the one
    to look like."""
    f: Any = _getframe(1)
    dispatched = False
    while f is not None:
        code = f.f_code
        m = _mine.get(id(code))
        if m is None:
            m = _classify(code)
        if not m:
            if not dispatched or code is not getattr(fn, "__code__", None):
                break
            dispatched = False
        elif m == 2:
            dispatched = True
        f = f.f_back
    if f is None:
        return _plain
    key = (id(code), f.f_lasti)
    t = _tramps.get(key)
    if t is None:
        t = _tramps[key] = _make_tramp(code, f.f_lineno or code.co_firstlineno, f.f_globals)
    return t


def _make_tramp(code: Any, line: int, globals_: dict) -> Callable:
    changes: dict[str, Any] = {
        "co_filename": code.co_filename,
        "co_firstlineno": max(line - 1, 0),
        "co_name": code.co_name,
    }
    if sys.version_info >= (3, 11):
        changes["co_qualname"] = code.co_qualname
    tramp = _TRAMP.replace(**changes)
    # pprobe's own frame for the caller column (a new code object: no cached class is stale)
    _own_code.add(tramp)
    _kept.append(tramp)
    _mine[id(tramp)] = 1
    return types.FunctionType(tramp, globals_)


def _plain(fn: Callable, a: tuple, k: dict) -> Any:
    __tracebackhide__ = True
    return fn(*a, **k)


if _native is not None:
    _native.set_as_caller(_classify, _make_tramp, _plain)
    as_caller = _native.as_caller  # noqa: F811  # the same walk, in C


_NOT_A_ROW = object()
_NOT_SELECTED = object()  # a call PPROBE_DTYPES leaves out (its own calls may be rows)
#: Call sites (code, line) by small int: rows keep ints, so the garbage collector can untrack
#: them (a deque of rows holding code objects made every collection walk them all).
sites: list[tuple[Any, int]] = []
_site_ids: dict[tuple[Any, int], int] = {}
#: Call stacks by id: the stack of its inner frames (-1: none) and the site of its outermost
#: frame. A row's ``site`` field holds a stack id: its PPROBE_STACK_DEPTH innermost program
#: frames, the first of them the call site (``stack_site``). Kept in arrays, and the interning
#: dict keyed and valued by large ints: a stack met for the first time during a call must
#: not keep a reference to a cached small int (see values.SMALL_STR).
stack_inner = array("q")
stack_outer = array("q")  # stack id -> the site of its outermost frame
stack_site = array("q")  # stack id -> the site of its innermost frame (the call site)
_stack_ids: dict[int, int] = {}  # ((inner + 2) << 32 | site) -> stack id + _STACK_OFF
_STACK_OFF = 1 << 40
_stack_depth = 3


def _caller(framework: str = "") -> Any:
    """The call stack: the id in :data:`stacks` of the PPROBE_STACK_DEPTH innermost frames
    outside pprobe and the frameworks (the first is the call site). The native core's
    ``caller_site`` computes the same.

    Returns -1 when there is none, or _NOT_A_ROW when the call is not the program's op: it
    comes from a framework's module body while it is being imported (the import machinery is
    met before any user frame), or ``framework``'s own code called it directly.
    """
    f: Any = _getframe(2)
    first = True
    while f is not None:
        code = f.f_code
        r = _internal_code.get(code)
        if r is None:
            r = _is_internal(code)
        if not r:
            line = f.f_lineno
            k = _site_ids.get((code, line))
            if k is None:
                k = _site_id(code, line)
            s = _stack_ids.get((1 << 32) | k)
            s = _stack_id(-1, k) if s is None else s - _STACK_OFF
            n = _stack_depth - 1
            f = f.f_back
            while n > 0 and f is not None:  # the next program frames out
                code = f.f_code
                r = _internal_code.get(code)
                if r is None:
                    r = _is_internal(code)
                if not r:
                    line = f.f_lineno
                    k = _site_ids.get((code, line))
                    if k is None:
                        k = _site_id(code, line)
                    t = _stack_ids.get(((s + 2) << 32) | k)
                    s = _stack_id(s, k) if t is None else t - _STACK_OFF
                    n -= 1
                f = f.f_back
            return s
        if r is not True:
            if r is _IMPORT_FRAME or (first and r == framework):
                return _NOT_A_ROW
            first = False
        f = f.f_back
    return -1


def _stack_id(inner: int, site: int) -> int:
    """The id in :data:`stacks` of (``inner`` stack or -1, ``site``) (the native core asks
    on a cache miss). Under :data:`_intern_lock`: two threads meeting new stacks at once must
    not take the same id, nor see an id before its arrays hold it."""
    key = ((inner + 2) << 32) | site
    with _intern_lock:
        v = _stack_ids.get(key)
        if v is not None:
            return v - _STACK_OFF
        k = len(stack_inner)
        stack_inner.append(inner)
        stack_outer.append(site)
        stack_site.append(site if inner < 0 else stack_site[inner])
        _stack_ids[key] = k + _STACK_OFF  # published once the arrays hold it
        return k


def _site_id(code: Any, line: int) -> int:
    """The index of (code, line) in :data:`sites` (the native core asks on a cache miss)."""
    key = (code, line)
    with _intern_lock:
        k = _site_ids.get(key)
        if k is None:
            k = len(sites)
            sites.append(key)
            _site_ids[key] = k  # published once ``sites`` holds it
        return k


#: New sites and stacks are interned one thread at a time (a miss is rare: once per site).
#: Re-entrant: a signal handler's op on the same thread may intern while the thread does.
_intern_lock = threading.RLock()


# ---------------------------------------------------------------------- the hot path
# ------------------------------------------------------------- the hot path: log mode, fast
# Log mode's fast path (the Python engine): what the general path (_call_general, _record,
# _begin, _end) does for an outermost call of a selected op, in one frame, with what can be
# decided once cached:
# - the caller, the first frame that is not pprobe's: its trampoline and call site, by
#   (id(code), f_lasti) (a line's site is the site of every instruction on it);
# - the outer frames of the stack: (id(code), f_lasti) -> site, or -1 for a frame that is not
#   the program's. The code objects are kept alive in _kept: an id is never reused;
# - a NumPy array's desc record past its seq, by (role, idx, shape, dtype).
# The rows are the general path's, byte for byte (tests/test_pyengine.py compares them).
#: -> (trampoline, the stack of the call site alone + _STACK_OFF, or _NOT_A_FRAME)
_at_first: dict[tuple[int, int], tuple[Callable, int]] = {}
_at_outer: dict[tuple[int, int], int] = {}  # -> site, or -1: not a program frame
#: (stack so far, id(code), f_lasti) of an outer frame -> the stack with that frame's site
#: added, or _NOT_A_FRAME: not a program frame (the stack stays): one lookup a frame. Stack
#: ids here and in _at_first are + _STACK_OFF: the caches never hold a small int (-5..256)
#: that a stack id would be (NumPy's tests count their references around a call).
_at_next: dict[tuple[int, int, int], int] = {}
_NOT_A_FRAME = -_STACK_OFF
_fast_tramps: dict[int, Callable] = {}  # id(code) -> the fast path's trampoline running it
#: (role 0 input / 1 output, idx, shape, dtype) -> desc record past its seq, for NumPy arrays
#: of a plain dtype (:func:`_rest_miss`)
_rests: dict[tuple, bytes] = {}
_rests_get = _rests.get
_fast = False  # log mode, no PPROBE_DTYPES, a session on and the step in the window
#: False: every call takes the general path (tests compare the two paths' rows).
FAST_PATH = True
plain_types: Any = values.PLAIN_TYPES
_plain_dtype_classes = values.PLAIN_DTYPE_CLASSES
_ROLES = ("input", "output")


def _clear_site_caches() -> None:
    _at_first.clear()
    _at_outer.clear()
    _at_next.clear()


def _first_at(code: Any, f: Any, key: tuple[int, int]) -> tuple[Callable, int]:
    """The trampoline of the caller frame ``f`` and the stack of its call site alone (+
    _STACK_OFF; a cache miss of :func:`call`): _NOT_A_FRAME when ``f`` is not a program
    frame (the general path decides what the call is)."""
    # The fast path's own trampoline (not shared with as_caller's): only the fast path calls
    # it, after a walk that met pprobe's frames only, so a call inside the one it makes, which
    # meets pprobe's frames only up to it, may use it too (_mine: 3).
    tramp = _make_tramp(code, f.f_lineno or code.co_firstlineno, f.f_globals)
    _mine[id(tramp.__code__)] = 3
    _fast_tramps[id(tramp.__code__)] = tramp
    k = -1 if _is_internal(code) else _site_id(code, f.f_lineno)
    _kept.append(code)
    e = _at_first[key] = (tramp, _NOT_A_FRAME if k < 0 else _stack_id(-1, k) + _STACK_OFF)
    return e


def _outer_at(f: Any, key: tuple[int, int]) -> int:
    code = f.f_code
    k = -1 if _is_internal(code) else _site_id(code, f.f_lineno)
    _kept.append(code)
    _at_outer[key] = k
    return k


def _next_at(f: Any, key3: tuple[int, int, int]) -> int:
    """:data:`_at_next`'s entry for the outer frame ``f`` (a cache miss of :func:`call`)."""
    key = (key3[1], key3[2])
    k = _at_outer.get(key)
    if k is None:
        k = _outer_at(f, key)
    t = _NOT_A_FRAME if k < 0 else _stack_id(key3[0] - _STACK_OFF, k) + _STACK_OFF
    if len(_at_next) > 65536:
        _at_next.clear()
    _at_next[key3] = t
    return t


def _rest_miss(key: tuple, x: Any, h: Any) -> bytes | tuple:
    """The desc record past its seq of array ``x`` (``key`` as in :data:`_rests`), cached when
    its dtype is a plain one; or its description, for records.encode_descs."""
    if h is None:
        h = values.kind_of(x.__class__)
    d = h.light(_ROLES[key[0]], key[1], x)
    dt = key[3]
    if (
        d[6] is None
        and d[7] is None
        and d[8] is None
        and d[2].__class__ is bytes
        and len(d[2]) <= records.MAX_INLINE_DIMS * 8
        and getattr(dt, "fields", 0) is None
        and getattr(dt, "subdtype", 0) is None
        and type(dt) in _plain_dtype_classes
    ):
        rest = records.encode_descs(0, [d], [])[8:]
        if len(_rests) > 65536:
            _rests.clear()
        # The key keeps pprobe's own copy of the dtype (equal, same hash: the program's dtype
        # finds it), not the program's object: NumPy's tests count the references to a
        # builtin dtype around a call, and a new cache entry would be one more.
        _rests[(key[0], key[1], key[2], _own_dtype(dt))] = rest
        return rest
    return d


#: dtype -> pprobe's copy of it (an equal dtype object of its own; the key is the copy too)
_own_dtypes: dict[Any, Any] = {}


def _own_dtype(dt: Any) -> Any:
    own = _own_dtypes.get(dt)
    if own is None:
        import numpy  # imported: the program's array has this dtype

        own = numpy.dtype(dt, copy=True)
        if len(_own_dtypes) < 4096:
            _own_dtypes[own] = own
    return own


_kinds_get = values._kinds.get
_collect = values.collect
_pack_seq = records.pack_seq
_pack_op = records.OP_STRUCT.pack
_sid = records.sid
_sid_get = records._ids.get
_S_OK = records.S_OK
_IDX = values._IDX
_I0, _I1 = _IDX[0], _IDX[1]


def call(op: Op, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run ``fn(*args, **kwargs)``, recording it as a call of ``op`` when it is captured."""
    __tracebackhide__ = True  # pytest and IPython leave pprobe's frames out of tracebacks
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    depth = loc.depth
    f: Any
    if depth:
        if depth >= INTERNAL or not _nested:
            # inside a recorded call: as_caller's walk, which ends at the fast path's own
            # trampoline when only pprobe's frames are in between (a + b calling np.add)
            f = _getframe(1)
            while True:
                m = _mine.get(id(f.f_code))
                if m != 1:
                    break
                f = f.f_back
                if f is None:
                    break
            if m == 3:
                return _fast_tramps[id(f.f_code)](fn, args, kwargs)
            return as_caller(fn)(fn, args, kwargs)
        return _call_general(op, fn, args, kwargs, depth)
    if not _fast or not op.selected or op.sampled:
        return _call_general(op, fn, args, kwargs, 0)
    rest: Any
    x: Any
    # the caller: as_caller's walk (pprobe's frames skipped); its trampoline and site cached
    f = _getframe(1)
    while True:
        code = f.f_code
        m = _mine.get(id(code))
        if m is None:
            m = _classify(code)
        if not m:
            break
        f = f.f_back
        if m == 2 or f is None:  # a framework's dispatch machinery: the general path
            return _call_general(op, fn, args, kwargs, 0)
    key = (id(code), f.f_lasti)
    ent = _at_first.get(key)
    if ent is None:
        ent = _first_at(code, f, key)
    tramp, so = ent
    if so < 0:  # not the program's frame (a framework's own code, an import): the general path
        return _call_general(op, fn, args, kwargs, 0)
    loc.depth = INTERNAL
    try:
        # the stack (as _caller): its innermost frame (so: its stack + _STACK_OFF), then the
        # next program frames out
        n = _stack_depth - 1
        f = f.f_back
        while n > 0 and f is not None:
            key3 = (so, id(f.f_code), f.f_lasti)
            t = _at_next.get(key3)
            if t is None:
                t = _next_at(f, key3)
            if t >= 0:
                so = t
                n -= 1
            f = f.f_back
        s = so - _STACK_OFF
        seq = next(state.seq)
        pre = _pack_seq(seq)
        descs: Any = None  # desc records, or descriptions for records.encode_descs
        plain = True
        if not kwargs:  # one or two NumPy arrays whose records are cached (unary, binary ops)
            na = len(args)
            if na == 2:
                x, y = args
                if x.__class__ in plain_types and y.__class__ in plain_types:
                    rest = _rests_get((0, _I0, x.shape, x.dtype))
                    r1 = _rests_get((0, _I1, y.shape, y.dtype))
                    if rest is not None and r1 is not None:
                        descs = [pre + rest, pre + r1]
            elif na == 1:
                x = args[0]
                if x.__class__ in plain_types:
                    rest = _rests_get((0, _I0, x.shape, x.dtype))
                    if rest is not None:
                        descs = [pre + rest]
        if descs is None:
            descs, others, plain = _inputs(pre, args, kwargs)
        else:
            others = ()
    except Exception as e:  # pprobe's own failure: never the user's problem
        loc.depth = 0
        _report.internal_error("recording inputs", e)
        return tramp(fn, args, kwargs)
    if _parents:  # parents matter only when nested calls (or torch's levels) are recorded
        parent = loc.parent
        loc.parent = seq
    else:
        parent = -1
    loc.depth = 1
    t0 = perf_counter_ns()
    try:
        result = tramp(fn, args, kwargs)
    except BaseException as e:
        t1 = perf_counter_ns()
        if _parents:
            loc.parent = parent
        _fast_row(op, seq, t0, t1, s, parent, type(e).__name__, descs, others, None)
        raise
    t1 = perf_counter_ns()
    if _parents:
        loc.parent = parent
    if result is NotImplemented:  # an operator deferring: not an op
        loc.depth = 0
        return result
    loc.depth = INTERNAL
    try:
        if plain and result.__class__ in plain_types:
            key2 = (1, "0", result.shape, result.dtype)
            rest = _rests_get(key2)
            if rest is None:
                rest = _rest_miss(key2, result, _kinds_get(result.__class__))
            if rest.__class__ is bytes:
                descs.append(pre + rest)
                mo = loc.module
                ph = loc.phase or _phase_default
                head = _pack_op(seq, t0, t1, loc.serial, state.step, parent, op.index, s, 0,
                                _S_OK, -1 if mo is None else _sid_get(mo) or _sid(mo),
                                -1 if ph is None else _sid_get(ph) or _sid(ph), len(descs),
                                -1)  # fmt: skip
                b = buffer  # Buffer.append, inlined while the buffer has room
                q = b.queue
                if b.max_rows and len(q) >= b.max_rows or b.flushing:
                    b.append(head, b"".join(descs), None)
                else:  # one bytes, the op record first (records.Buffer)
                    descs.insert(0, head)
                    q.append(b"".join(descs))
                if not seq & 1023 and len(q) >= _flush_rows and _wake is not None:
                    _wake()
                loc.depth = 0
                return result
        _fast_row(op, seq, t0, t1, s, parent, None, descs, others, result)
    except Exception as e:  # pprobe's (a step past int64, ...): the call's outcome goes on
        loc.depth = 0
        _report.internal_error("recording outputs", e)
    return result


def _inputs(pre: bytes, args: tuple, kwargs: dict) -> tuple[list, Any, bool]:
    """:func:`call`'s inputs in general: (desc records, or descriptions for
    records.encode_descs; the arguments that are not arrays; whether every input is a record)."""
    descs: list = []
    rest: Any
    if not kwargs and len(args) < 64:  # NumPy arrays only (values.collect's rows)
        for i, x in enumerate(args):
            if x.__class__ not in plain_types:
                break
            key = (0, _IDX[i], x.shape, x.dtype)
            rest = _rests_get(key)
            if rest is None:
                rest = _rest_miss(key, x, None)
                if rest.__class__ is not bytes:
                    break
            descs.append(pre + rest)
        else:
            return descs, (), True
        descs = []
    arrays, others = _collect(args, kwargs)
    plain = not others
    for idx, x, h in arrays:  # (inline, as _fast_row's outputs: a call an array is dear here)
        if x.__class__ in plain_types:
            key = (0, idx, x.shape, x.dtype)
            rest = _rests_get(key)
            if rest is None:
                rest = _rest_miss(key, x, h)
        else:
            rest = h.light("input", idx, x)
        if rest.__class__ is bytes:
            descs.append(pre + rest)
        else:
            descs.append(rest)
            plain = False
    return descs, others, plain


def _fast_row(
    op: Op,
    seq: int,
    t0: int,
    t1: int,
    site: int,
    parent: int,
    error: str | None,
    descs: list,
    others: Any,
    result: Any,
) -> None:
    """The row of :func:`call`'s fast path, in general: the outputs of ``result`` (unless
    ``error``, the name of the exception the call raised), arguments that are not arrays,
    descriptions still to encode. Never raises; leaves the thread's depth at 0."""
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    loc.depth = INTERNAL
    try:
        rest: Any
        x: Any
        if error is None:
            for idx, x, h in values.outputs(result):
                if x.__class__ in plain_types:
                    key = (1, idx, x.shape, x.dtype)
                    rest = _rests_get(key)
                    if rest is None:
                        rest = _rest_miss(key, x, h)
                else:
                    rest = h.light("output", idx, x)
                descs.append(_pack_seq(seq) + rest if rest.__class__ is bytes else rest)
        objs: list = []
        if others:
            objs.append(tuple(others))
            args = 0
        else:
            args = -1
        out = []
        for d in descs:
            out.append(d if d.__class__ is bytes else records.encode_descs(seq, [d], objs))
        mo = loc.module
        ph = loc.phase or _phase_default
        buffer.append(
            _pack_op(seq, t0, t1, loc.serial, state.step, parent, op.index, site, 0,
                     _sid(error or "ok"), records.sid_or_none(mo), records.sid_or_none(ph),
                     len(descs), args),
            b"".join(out),
            tuple(objs) if objs else None,
        )  # fmt: skip
        if not seq & 1023 and len(buffer) >= _flush_rows and _wake is not None:
            _wake()
    except Exception as e:
        _report.internal_error("recording outputs", e)
    finally:
        loc.depth = 0


def _call_general(op: Op, fn: Callable, args: tuple, kwargs: dict, depth: int) -> Any:
    """:func:`call` for what its fast path leaves out (stats and dump modes, PPROBE_DTYPES,
    nested calls, sampling, a caller that is not plainly the program's frame)."""
    __tracebackhide__ = True
    if (depth and (depth >= INTERNAL or not _nested)) or not _active:
        return as_caller(fn)(fn, args, kwargs)
    if not op.selected or (op.sampled and not op.take()):
        return hidden(fn, args, kwargs)
    return _record(op, fn, args, kwargs, depth)


def hidden(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a call that is not recorded, and hide the calls it makes (they are its insides)."""
    __tracebackhide__ = True
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    depth = loc.depth
    loc.depth = depth + 1
    try:
        return as_caller(fn)(fn, args, kwargs)
    finally:
        loc.depth = depth


def _record(op: Op, fn: Callable, args: tuple, kwargs: dict, depth: int) -> Any:
    """Record one call of ``op``: :func:`_begin`, the call, :func:`_end`. (The native core
    calls _begin and _end itself around a call it makes from C.)"""
    __tracebackhide__ = True
    st = _begin(op, args, kwargs, depth)
    if st.__class__ is not tuple:
        if st is _NOT_A_ROW:
            return hidden(fn, args, kwargs)
        return as_caller(fn)(fn, args, kwargs)
    # The user's function runs outside pprobe's try blocks: its exceptions are its own, and
    # it runs exactly once (a failing call used to be reported as pprobe's and run again).
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    loc.depth = depth + 1
    calling = as_caller(fn)
    t0 = perf_counter_ns()
    try:
        result = calling(fn, args, kwargs)
    except BaseException as e:
        t1 = perf_counter_ns()
        loc.depth = depth
        _end(op, st, t0, t1, None, type(e).__name__, depth)
        raise
    t1 = perf_counter_ns()
    loc.depth = depth
    stop = _end(op, st, t0, t1, result, None, depth)
    if stop is not None:
        raise stop
    return result


def _begin(op: Op, args: tuple, kwargs: dict, depth: int) -> Any:
    """Before a call: the call site, the inputs' descriptions (statistics, dumps of the values
    at call time). Returns the call's state (a tuple), or _NOT_A_ROW (run it hidden),
    _NOT_SELECTED or None (run it plainly). Never raises."""
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    loc.depth = INTERNAL
    try:
        # The caller is found before the seq and the inputs' dumps: a call that is not a row
        # takes no seq and leaves no .npy behind. Nested calls (PPROBE_NESTED) are the
        # framework's own calls by nature: keep them.
        if _dtypes:
            arrays, others = values.collect(args, kwargs)
            if arrays and not _dtype_match(arrays):
                return _NOT_SELECTED
            code = _caller("" if depth else op.framework)
        else:
            # Under full coverage every ufunc call NumPy's own Python code makes reaches here;
            # most are not rows: their arguments are not looked at.
            code = _caller("" if depth else op.framework)
            if code is _NOT_A_ROW:
                return code
            arrays, others = values.collect(args, kwargs)
        if code is _NOT_A_ROW:
            return code
        seq = next(state.seq)
        if _mode:
            prefix = f"{_pid}-{seq}" if _mode == 2 else ""
            ins = [_describe(op, "input", idx, x, h, prefix) for idx, x, h in arrays]
        else:
            prefix = ""
            ins = [h.light("input", idx, x) for idx, x, h in arrays]
    except Exception as e:  # pprobe's own failure: never the user's problem
        _report.internal_error("recording inputs", e)
        return None
    finally:
        loc.depth = depth
    if _parents:  # parents matter only when nested calls (or torch's levels) are recorded
        parent = loc.parent
        loc.parent = seq
    else:
        parent = -1
    return (seq, code, ins, others, bool(arrays), prefix, parent)


def _end(
    op: Op, st: tuple, t0: int, t1: int, result: Any, error: str | None, depth: int
) -> BaseException | None:
    """After a call: the outputs' descriptions, and the row. ``error``: the name of the
    exception the call raised. Never raises; returns the exception the call must raise
    instead of returning (``PPROBE_ON_NAN=raise``), else None."""
    seq, code, ins, others, had_arrays, prefix, parent = st
    loc = _local.t  # this thread's fields (state.Thread, or the core's)
    if _parents:
        loc.parent = parent
    if error is None and result is NotImplemented:  # an operator deferring: not an op
        return None
    loc.depth = INTERNAL
    try:
        if error is None:
            outs = values.outputs(result)
            if outs:
                if _dtypes and not had_arrays and not _dtype_match(outs):
                    return None
                if _mode:
                    many = len(outs) > 1
                    for idx, x, h in outs:
                        ins.append(_describe(op, "output", idx, x, h, prefix, many))
                else:
                    for idx, x, h in outs:
                        ins.append(h.light("output", idx, x))
        if _where is None:
            mo, ph = loc.module, loc.phase or _phase_default
        else:
            mo, ph = _where()
        buffer.append(*_encode(seq, op.index, t0, t1, state.local.serial, state.step, depth, parent,
                               code, error or "ok", mo, ph, ins, others))  # fmt: skip
        if not seq & 1023 and len(buffer) >= _flush_rows and _wake is not None:
            _wake()
        if _on_nan and _mode and error is None and _born_here(op, ins, others):
            return _nan_origin(op, code, ins)
    except Exception as e:  # pprobe's (a step past int64, ...): the call's outcome goes on
        _report.internal_error("recording outputs", e)
    finally:
        loc.depth = depth
    return None


def _born_here(op: Op, descs: list, others: list) -> bool:
    """Whether an output holds NaN or inf while every input with statistics is finite.
    An infinite scalar argument (``masked_fill(m, -inf)``, ``np.full(n, -inf)``), or an op
    of ``pprobe nan``'s allowlist (PPROBE_NAN_ALLOW), makes infinities on purpose: then only
    NaN counts."""
    bad = False
    for d in descs:
        st = d[6]
        if st.__class__ is not tuple:  # none, or a device's, resolved later by the writer
            continue
        if d[0] == "output":
            if st[4] or st[5]:
                bad = True
        elif st[4] or st[5]:
            return False  # carried on, not born here
    if not bad:
        return False
    inf_arg = False
    for _, v in others:
        if isinstance(v, float) and v - v != 0.0:  # inf or NaN
            if v != v:
                return False  # np.full(n, nan): NaN on purpose
            inf_arg = True
        elif v.__class__ is str and ("inf" in v or "nan" in v):
            if "nan" in v:
                return False
            inf_arg = True
    if inf_arg or _expects_inf(op, descs):
        return any(d[0] == "output" and d[6].__class__ is tuple and d[6][4] for d in descs)
    return True


def _expects_inf(op: Op, descs: list) -> bool:
    """Whether ``pprobe nan``'s allowlist expects infs from this call (``:mask`` entries: on
    inputs of a bool or integer dtype only; a float 0/1 mask cannot be told from statistics)."""
    k = _inf_allowed.get(op.name)
    if k is None:
        k = 0
        for p in _nan_allow:
            if opsets.matches(op.name, p):
                if not p.endswith(":mask"):
                    k = 1
                    break
                k = 2
        _inf_allowed[op.name] = k
    if k == 2:
        return all(d[3] == "bool" or "int" in d[3] for d in descs if d[0] == "input" and d[3])
    return k == 1


def _nan_origin(op: Op, site: int, descs: list) -> BaseException | None:
    """The first op that made NaN/inf from finite values: flush, then warn or raise."""
    global _on_nan
    how, _on_nan = _on_nan, 0  # once per process
    try:
        if _flush is not None:
            _flush()
    except Exception as e:
        _report.internal_error("flushing before PPROBE_ON_NAN", e)
    outs = ", ".join(
        f"output {d[1]}: {int(d[6][4] or 0)} NaN, {int(d[6][5] or 0)} inf"
        for d in descs
        if d[0] == "output" and d[6].__class__ is tuple and (d[6][4] or d[6][5])
    )
    code: Any = None
    line = 0
    if 0 <= site < len(stack_site):
        code, line = sites[stack_site[site]]
    where = "?"
    if code is not None:
        where = f"{code.co_filename}:{line} in {getattr(code, 'co_qualname', code.co_name)}"
    msg = (
        f"pprobe: first NaN/inf from finite inputs: {op.name} ({outs}) at step {state.step}, "
        f"module {_local.module or '-'}, called from {where} (PPROBE_ON_NAN={_NAN_HOW[how]})"
    )
    if how == 2:
        return FloatingPointError(msg)
    if how == 3:  # keep the dumps of this step and the ones before it (pprobe.dumpkeep)
        steps = _dumper.nan_origin() if _dumper is not None else []
        kept = f"; the dumps of steps {', '.join(map(str, steps))} are kept" if steps else ""
        _report.warn_once("on-nan-dump", msg[len("pprobe: ") :] + kept)
        return None
    # a RuntimeWarning at the program's line, in its module's registry and filters
    import warnings

    f: Any = _getframe(1)
    while f is not None and f.f_code is not code:
        f = f.f_back
    if f is None or code is None:
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return None
    g = f.f_globals
    warnings.warn_explicit(
        msg,
        RuntimeWarning,
        code.co_filename,
        line,
        module=g.get("__name__"),
        registry=g.setdefault("__warningregistry__", {}),
        module_globals=g,
    )
    return None


_NAN_HOW = {1: "warn", 2: "raise", 3: "dump"}


def append_row(
    seq: int,
    op: Op,
    t0: int,
    t1: int,
    depth: int,
    parent: int,
    site: Any,
    status: str,
    descs: list,
    others: list,
    module: str | None,
    phase: str | None,
) -> None:
    """Append a row recorded without :func:`call` (torch module and gradient rows), in the
    layout of :data:`rows`. ``site`` comes from :func:`_caller`."""
    if site is _NOT_A_ROW:
        site = -1
    buffer.append(*_encode(seq, op.index, t0, t1, state.local.serial, state.step, depth, parent,
                           site, status, module, phase, descs, others))  # fmt: skip
    if not seq & 1023 and len(buffer) >= _flush_rows and _wake is not None:
        _wake()


def note_dropped(n: int) -> None:
    """A ``pprobe.rows_dropped`` row: ``n`` rows were dropped because the buffer was full
    (PPROBE_BUFFER_FULL=drop). Appended by the writer thread (never refused)."""
    o = op("pprobe.rows_dropped", "pprobe", "pprobe")
    t = perf_counter_ns()
    seq = next(state.seq)
    rows = values.Text(str(n))
    me = state.local.serial
    buffer.append(*_encode(seq, o.index, t, t, me, state.step, 0, -1, -1, "ok", None, None, [],
                           [("rows", rows)]))  # fmt: skip


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
        return (role, idx, shape, dtype, device, grad, None, None, OUT_NOTE)
    if op.uninit and role == "output":
        return (role, idx, shape, dtype, device, grad, None, None, UNINITIALISED_NOTE)
    path = note = None
    try:
        st = h.stats(x)
    except Exception as e:
        _report.internal_error(f"statistics ({type(x).__name__})", e)
        st = None
    if st.__class__ is str:  # the reason there are no statistics
        note, st = st, None
    elif st.__class__ is tuple:  # nan/inf counts as floats: a row holds no small int
        n, i = st[4], st[5]
        st = (st[0], st[1], st[2], st[3], None if n is None else float(n),
              None if i is None else float(i))  # fmt: skip
    if _mode == 2:
        if role == "input":
            which = f"input{idx}"
        elif role == "output":
            which = f"output{idx}" if many else "output"
        else:  # torch module rows: "param" / "grad", idx = the parameter's name
            which = f"{role}_{idx}"
        path, note2 = _dump_one(op.name, which, x, h, prefix)
        note = note2 or note
    return (role, idx, shape, dtype, device, grad, st, path, note)


def _dump_one(name: str, which: str, x: Any, h: Any, prefix: str) -> tuple[Any, Any]:
    """Dump mode: ``x``'s dump as ``op_{name}_{which}_{prefix}.npy``; (path or None, note or
    None). Both engines' dumps come through here (the native core's plain numeric arrays go
    to the dumper directly: :func:`_native_dump`). Once dumping has stopped for good (the
    dumper's ``stop_note``: the budget used up with no ring of steps, a full disk), every
    array gets that note at once, before ``dumpable`` converts it or starts a copy off its
    device."""
    stop = _dumper.stop_note
    if stop is not None:
        return None, stop
    arr, note = h.dumpable(x)
    if arr is None:
        return None, note
    if isinstance(arr, values.Dumpable):  # dtype-tagged name, deferred device copy
        path, note2 = arr.pprobe_dump(_dumper, name, which, prefix)
    else:
        path, note2 = _dumper.dump(arr, name, which, prefix)
    return path, note2 or note


def _dumper_in_core(dumper: Any) -> tuple:
    """``_native.set_dumper``'s arguments: the dumper whose common dumps (plain C-contiguous
    numeric arrays) the native core makes itself, beside its Python twin ``Dumper._dump`` (the
    same objects: the lock, the seen contents, the budget counters, the queue); ``(None,)``
    where a dump needs what only Python does (a ring of steps, another codec, the Python
    queue, skipping when the queue is full)."""
    from . import dumps

    if (
        dumper is None
        or dumper.ring is not None
        or dumper.codec != "npy"
        or not isinstance(dumper.io, dumps.NativeQueue)
        or not dumper.wait_when_full
    ):
        return (None,)
    # plain CPU tensors' memory, read in C as torch_values.dumpable reads it (from the first
    # tensor's statistics on: torch_values.native_cpu_stats sets the reader up)
    m = dumper.io.m
    return dumper, dumper.io.submit, dumps.head_of, m._C_TENSOR_MEM, m._C_TENSOR_MEMO


def _native_dump(
    x: Any, op: int, seq: int, kind: int, idx: int, header: bytes | None
) -> tuple[Any, Any]:
    """Dump mode in the native core (``_native.set_dump``): the dump of one array the core
    described. ``kind`` 0: an input, ``idx`` the string id of its name; 1: the call's one
    output; 2: one of its outputs, ``idx`` its position in the result. ``header``: the .npy
    header the core made for a plain ndarray (not a subclass) of a builtin numeric dtype,
    else None."""
    if kind == 0:
        which = "input" + records.strings[idx]
    elif kind == 1:
        which = "output"
    else:
        which = f"output{idx}"
    if header is not None:  # a plain ndarray of a numeric dtype: nothing for dumpable to do
        return _dumper.dump(x, ops_by_index[op].name, which, f"{_pid}-{seq}", header=header)
    tp = type(x)
    h = values._kinds.get(tp) or values.kind_of(tp)
    return _dump_one(ops_by_index[op].name, which, x, h, f"{_pid}-{seq}")


def _native_outputs(seq: int, result: Any, op: int = -1) -> tuple[bytes, tuple]:
    """The output records of a result the native core does not know (its arrays found by
    :func:`values.outputs`): (desc records, objects). ``op``: the op's index when the core
    records statistics (stats mode), -1 in log mode."""
    outs = values.outputs(result)
    if op >= 0:
        o = ops_by_index[op]
        prefix = f"{_pid}-{seq}" if _mode == 2 else ""
        descs = [_describe(o, "output", idx, x, h, prefix, len(outs) > 1) for idx, x, h in outs]
    else:
        descs = [h.light("output", idx, x) for idx, x, h in outs]
    objs: list = []
    return (records.encode_descs(seq, descs, objs) if descs else b""), tuple(objs)


# ---------------------------------------------------------------------- the engine
if _native is not None:
    try:
        buffer = _native.init(
            begin=_begin,
            end=_end,
            not_a_row=_NOT_A_ROW,
            is_internal=_is_internal,
            site_id=_site_id,
            sid=records.sid,
            ids=records._ids,
            outputs=_native_outputs,
            error=_report.internal_error,
            note_thread=state.note_thread,
            import_frame=_IMPORT_FRAME,
            idx_strs=tuple(str(i) for i in range(64)),
            ops=ops_by_index,
            fixed=(records.S_OK, records.S_INPUT, records.S_OUTPUT, records.S_CPU, records.S_IDX0),
        )
        _native.set_other_pair(values.other_pair, values.shown_by_type)
        _native.set_dump(_native_dump)
        values.kinds_changed.append(_native.clear_arg_texts)
    except Exception as e:  # a core that does not fit this Python side: the Python engine
        core.fall_back(f"the native core could not start ({type(e).__name__}: {e})")
        _native = None
if _native is not None:
    call = _native.call  # noqa: F811  (the same contract as the Python call above)
