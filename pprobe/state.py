"""Process-wide and per-thread state shared by every interceptor (the hot path reads it)."""

from __future__ import annotations

import itertools
import operator
import os
import threading
from typing import Any

from . import core

#: ``local.depth`` at or above this means pprobe itself is working: nothing is recorded.
INTERNAL = 1 << 20


#: serial -> name of every thread that used pprobe's thread state. Rows carry the thread's
#: serial number (given on its first use of pprobe's state), not its ident: the OS reuses
#: idents, and a later thread must not lend its name to an ended thread's rows.
thread_names: dict[int, str] = {}
_serials = itertools.count(1)


class Thread:
    """The Python engine's per-thread fields, in one plain object: the hot path fetches it once
    (``local.t``, one threading.local lookup) and reads and writes its slots, each several
    times cheaper than an attribute of a threading.local."""

    __slots__ = ("depth", "parent", "module", "phase", "mstack", "serial")

    def __init__(self, serial: int) -> None:
        self.depth = 0  # number of recorded calls this thread is inside
        self.parent = -1  # seq of the innermost recorded call, -1 at top level
        self.module: Any = None  # innermost nn.Module path (set by the torch interceptor)
        self.phase: Any = None  # forward / backward / optimizer where a hook tells; None: default
        self.mstack: Any = None  # torch: running nn.Modules, linked (path, module, rest, ...)
        self.serial = serial  # this thread's number in rows (thread_names)


def _forward(name: str) -> property:
    """``local.<name>``, read and written on ``local.t`` (the Python engine's Thread)."""

    def put(self: Any, value: Any) -> None:
        setattr(self.t, name, value)

    return property(operator.attrgetter("t." + name), put)


class _Local(threading.local):
    """This thread's fields: ``depth``, ``parent``, ``module``, ``phase``, ``mstack`` and
    ``serial``. ``t`` is the object that holds them, for code that reads several (the
    recorder's hot path): with the Python engine a :class:`Thread`; with the native core
    this local itself, whose ``depth``, ``parent``, ``module`` and ``phase`` are the core's
    C thread-locals."""

    # Each engine replaces these below: the native core's ThreadFields (depth, parent, module,
    # phase), the Python engine's properties onto Thread (all six). What stays a plain
    # attribute (mstack, serial with the native core) defaults to the class's value on a new
    # thread (threading.local semantics).
    depth: int
    parent: int
    module: Any
    phase: Any
    mstack: Any = None
    serial: int = 0
    t: Any

    def __init__(self) -> None:
        # threading.local runs __init__ once per thread, on the thread's first use of it
        # (the hot path's first read): no per-call cost. The name is the one the thread has
        # when it first records.
        s = next(_serials)
        thread_names[s] = threading.current_thread().name
        if _native is None:
            self.t = Thread(s)
        else:
            self.t = self
            self.serial = s


_native = core.native
if _native is not None:
    # The native core keeps these per-thread fields in C thread-locals; Python code reads and
    # writes the same values through these data descriptors (they win over the instance dict).
    _Local.depth = _native.ThreadField(0)  # type: ignore[assignment]
    _Local.parent = _native.ThreadField(1)  # type: ignore[assignment]
    _Local.module = _native.ThreadField(2)  # type: ignore[assignment]
    _Local.phase = _native.ThreadField(3)  # type: ignore[assignment]
else:
    for _name in Thread.__slots__:
        setattr(_Local, _name, _forward(_name))

local = _Local()
#: next(seq) is atomic under the GIL: threads never share a seq
seq: Any = _native.Counter() if _native is not None else itertools.count()
step = 0  # training step: pprobe.step(), optimizer hooks
manual_step = False  # pprobe.step() was called: optimizer hooks leave the step alone
rank: int | None = None
world_size: int | None = None


def reset_after_fork() -> None:
    global seq
    if _native is not None:
        _native.set_seq(0)
    else:
        seq = itertools.count()


def note_thread() -> int:
    """The current thread's serial number, its name noted (the native core calls it on a
    thread's first row, so rows of a thread that ended before the flush keep their name)."""
    return local.serial  # type: ignore[no-any-return]


def cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class internal:
    """Context manager: mark the current thread as doing pprobe's own work."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        self.saved = local.depth
        local.depth = INTERNAL

    def __exit__(self, *exc: object) -> None:
        local.depth = self.saved
