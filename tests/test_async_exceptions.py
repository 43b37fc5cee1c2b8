"""The Python engine's synchronisation against exceptions raised asynchronously on the
program's thread.

A signal handler that raises (Ctrl-C's KeyboardInterrupt) raises at whatever bytecode the main
thread runs, pprobe's own included. The primitives the program's threads use (the dump queue's
``submit``, the record buffer's ``wake`` and ``park``) must not be left holding a lock by such
an exception, or the run hangs later (the writer waits on it, or the program does at exit).

These tests raise KeyboardInterrupt at each point of such a call in turn where the eval loop
checks for a pending signal (a trace function that raises there is what a raising handler
does: an exception between two bytecodes, in pprobe's frames or the standard library's), then
check that the queue or the buffer still works from other threads within a time limit.
Before the fix, ``threading.Condition``, ``threading.Event`` and ``threading.Thread.start``
(Python code that holds a lock between bytecodes) sat on these paths.
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pprobe import dumps, records

#: Opcodes after which the eval loop checks for a pending signal: after a call returns and
#: at a loop's backward jump (it checks at a function's start too: the trace's "call" event).
_AFTER = {op for name, op in dis.opmap.items() if name.startswith(("CALL", "JUMP_BACKWARD"))}


def _raise_at(k: int, fn: Callable[[], object]) -> bool:
    """Run ``fn()``, raising KeyboardInterrupt at the ``k``-th point where a signal handler
    could raise in the frames it runs (:func:`_checkpoints`: raising at any bytecode would
    be stricter than the interpreter, e.g. between a ``with`` block's last statement and its
    ``__exit__`` call); whether it was raised (False: ``fn`` ran fewer such points)."""
    seen = [0, False]
    last: dict[int, int] = {}  # id(frame) -> the opcode it ran last

    def point() -> None:
        seen[0] += 1  # type: ignore[operator]
        if seen[0] == k:
            seen[1] = True
            raise KeyboardInterrupt

    def tracer(frame: Any, event: str, arg: object) -> object:
        frame.f_trace_opcodes = True
        if event == "call":  # a function's start
            last[id(frame)] = -1
            point()
        elif event == "opcode":
            op = frame.f_code.co_code[frame.f_lasti]
            prev = last.get(id(frame))
            last[id(frame)] = op
            if prev in _AFTER:
                point()
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return bool(seen[1])


def _within(seconds: float, fn: Callable[[], object]) -> bool:
    """Whether ``fn()`` returns within ``seconds`` on another thread (a daemon: a hung one is
    left behind)."""
    done = threading.Event()

    def run() -> None:
        fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def test_a_dump_queue_interrupted_at_any_bytecode_of_submit_still_works(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for first in (True, False):  # the queue's first submit (it starts the writer), a later
            k = 0
            while True:
                k += 1
                q = dumps.PyQueue()
                q.open(fd, 1 << 20)
                if not first:
                    assert q.submit(f"c{k}.npy", b"h", None, None, True) and q.wait(1, 5)
                sub = functools.partial(q.submit, f"a{k}-{first}.npy", b"h", None, None, True)
                fired = _raise_at(k, sub)
                # what it queued is written (the last dump of a run: no later submit starts
                # the writer), and its counts agree with its jobs
                assert _within(10, functools.partial(q.wait, q.submitted, 5)), f"hung, {k}"
                assert q.completed == q.submitted, f"a job is stuck after point {k}"
                # the queue takes another dump and writes it, from another thread
                t = q.ticket() + 1
                sub = functools.partial(q.submit, f"b{k}-{first}.npy", b"h", None, None, True)
                assert _within(5, sub), f"a submit hung after an interrupt at point {k}"
                assert _within(10, functools.partial(q.wait, t, 5)), f"a wait hung, {k}"
                assert q.completed >= t, f"the writer stalled after an interrupt at point {k}"
                # its counts agree with its jobs: a barrier's ticket means what it says
                assert (q.submitted, q.queued) == (q.completed, 0), f"counts drift, {k}"
                assert _within(10, functools.partial(q.close, 5)), f"close hung, {k}"
                if not fired:
                    break
            assert k > 5  # the interrupts did land, at several points
            assert (tmp_path / f"b{k}-{first}.npy").exists()
    finally:
        os.close(fd)


def test_a_record_buffer_interrupted_at_any_bytecode_of_park_or_wake_still_works() -> None:
    row = b"x" * records.OP_SIZE
    for what in ("park, window open", "park, window closed", "wake"):
        buf = records.Buffer()
        k = 0
        while True:
            k += 1
            closed = what == "park, window closed"
            if closed:  # the writer's flush runs: park waits on it
                buf.wake()
                assert _within(5, functools.partial(buf.wait, 0.01)), f"{what}: wait hung"
            else:  # the gate is free: park takes it and gives it back at once
                buf.flushing = True
            fired = _raise_at(k, buf.wake if what == "wake" else buf.park)
            if closed:
                assert _within(5, buf.end_flush), f"{what}: end_flush hung after point {k}"
            else:  # (an interrupted park may hold the gate now: the writer takes it back)
                buf.flushing = False
            # the writer's cycle (wait for rows, open the window, close it) and a recording
            # thread's park still complete
            buf.append(row, b"", None)
            assert _within(5, functools.partial(buf.wait, 0.01)), f"{what}: wait, point {k}"
            assert _within(5, buf.end_flush), f"{what}: end_flush hung after point {k}"
            assert _within(5, buf.park), f"{what}: park hung after point {k}"
            buf.clear()
            if not fired:
                break
        assert k > 1, what  # raised at one point at least
