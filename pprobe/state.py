"""Process-wide and per-thread state shared by every interceptor (the hot path reads it)."""

from __future__ import annotations

import itertools
import threading

#: ``local.depth`` at or above this means pprobe itself is working: nothing is recorded.
INTERNAL = 1 << 20


#: ident -> name of every thread that used pprobe's thread state. The writer names rows by the
#: live threads first; a thread that ended before its rows were flushed is only found here.
thread_names: dict[int | None, str] = {}


class _Local(threading.local):
    # Class attributes are the defaults every new thread sees (threading.local semantics).
    depth = 0  # number of recorded calls this thread is inside
    parent = -1  # seq of the innermost recorded call, -1 at top level
    module = None  # innermost nn.Module path (set by the torch interceptor)
    phase = None  # "forward" / "backward" where a framework tells (torch aten level)
    mstack = None  # torch: running nn.Modules, linked (path, module, rest, row-in-progress)

    def __init__(self) -> None:
        # threading.local runs __init__ once per thread, on the thread's first use of it
        # (the hot path's first read of ``depth``): no per-call cost.
        t = threading.current_thread()
        thread_names[t.ident] = t.name


local = _Local()
seq = itertools.count()  # next(seq) is atomic under the GIL: threads never share a seq
step = 0  # training step: pprobe.step(), optimizer hooks
manual_step = False  # pprobe.step() was called: optimizer hooks leave the step alone
rank: int | None = None
world_size: int | None = None


def reset_after_fork() -> None:
    global seq
    seq = itertools.count()


class internal:
    """Context manager: mark the current thread as doing pprobe's own work."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        self.saved = local.depth
        local.depth = INTERNAL

    def __exit__(self, *exc: object) -> None:
        local.depth = self.saved
