"""The writer's flush window (pprobe/_native.c "the writer's flush window", records.Buffer):
while the writer thread flushes, a thread that records a row waits for the flush to end
instead of contending with it for the GIL; the writer's wait takes no GIL while nothing is
buffered. In-process tests of both buffers, then a program through the bootstrap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import BOOTSTRAP, clean_env, meta, run_script, sql

from pprobe import records

try:
    from pprobe import _native

    NATIVE_BUILT = True
except ImportError:  # the Python engine's CI leg without a compiler
    NATIVE_BUILT = False


def _kinds() -> list[str]:
    return ["python", "native"] if NATIVE_BUILT else ["python"]


@pytest.fixture(params=_kinds())
def buf(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh buffer of either engine; the window (process-wide in the native core) is
    closed and every waiter woken at the end, whatever the test did."""
    b = records.Buffer() if request.param == "python" else _native.Buffer()
    yield b
    b.wake()
    b.end_flush()


def _row(seq: int, t0: int = 0) -> tuple[bytes, bytes, None]:
    """A row whose op started at ``t0`` (perf_counter_ns): the Python buffer dates a row by
    it (0: long ago)."""
    head, descs, objs = records.encode_row(
        seq, 0, t0, t0 + 1, 11, 0, 0, -1, -1, "ok", None, None, [], []
    )
    return head, descs, None


def _waiter(buf: Any, timeout: float) -> tuple[threading.Thread, list]:
    got: list = []

    def run() -> None:
        got.append(buf.wait(timeout))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


def _open(buf: Any) -> None:
    """Open the flush window as the writer does (a row buffered, the wait timed out). The
    native core also asks the main thread (this test's) to wait for the flush at its next
    safe point: let that happen (it is cut short at PARK_MAX_S) before counting."""
    buf.append(*_row(0))
    t, got = _waiter(buf, 0.01)
    t.join(5)
    assert got == [False]  # the timeout, not a wake
    for _ in range(1000):  # safe points: a pending call runs at one of them
        pass


def test_an_idle_writer_keeps_waiting_until_woken(buf: Any) -> None:
    """Nothing buffered: the timeout does not end the wait (the writer would take the GIL for
    nothing); wake() does, and says so."""
    t, got = _waiter(buf, 0.01)
    t.join(0.2)
    assert t.is_alive() and not got  # 20 timeouts passed, nothing to flush
    buf.wake()
    t.join(5)
    assert got == [True]
    buf.end_flush()


def test_the_timeout_ends_the_wait_when_rows_are_buffered(buf: Any) -> None:
    buf.append(*_row(0))
    t, got = _waiter(buf, 0.01)
    t.join(5)
    assert got == [False]  # the timeout, not a wake
    buf.end_flush()


def test_a_row_is_due_a_period_after_it_was_recorded(buf: Any) -> None:
    """The period runs from the oldest buffered row (README: the longest time a row waits),
    not from the wait's start: a row recorded late in an idle period is not written at the
    next tick but a whole period after it, so that a burst shorter than the period takes one
    flush, not two."""
    t, got = _waiter(buf, 0.4)
    time.sleep(0.3)  # an idle writer: the first look at 0.4 s finds the row
    t_row = time.perf_counter()
    buf.append(*_row(0, time.perf_counter_ns()))
    t.join(5)
    waited = time.perf_counter() - t_row
    assert got == [False]  # the period, not a wake
    assert waited >= 0.35, waited  # not at the tick 0.1 s after the row
    buf.end_flush()
    buf.take()


def test_a_row_older_than_the_period_is_due_at_once(buf: Any) -> None:
    buf.append(*_row(0, time.perf_counter_ns()))
    time.sleep(0.5)
    t0 = time.perf_counter()
    assert buf.wait(0.4) is False
    waited = time.perf_counter() - t0
    buf.end_flush()
    buf.take()
    assert waited < 0.3, waited  # (not a whole period from the wait's start)


def test_a_row_dated_ahead_of_the_clock_is_due_a_period_after_it_was_seen(buf: Any) -> None:
    """A t0 the clock has not reached (no such row is made; the Python buffer dates rows by
    it) does not hold the flush back: the rows a look finds are due a period after it."""
    buf.append(b"\x7f" * records.OP_SIZE, b"", None)
    t, got = _waiter(buf, 0.05)
    t.join(5)
    assert got == [False]
    buf.end_flush()
    buf.take()


def test_a_recording_thread_waits_for_the_flush(buf: Any) -> None:
    """In the window, a thread that appends a row waits (its row is in first); after
    end_flush() appends go on without waiting. The writer thread itself never waits."""
    _open(buf)
    w0, cut0, s0 = buf.parks()
    appended = threading.Event()

    def record() -> None:
        buf.append(*_row(1))
        appended.set()

    r = threading.Thread(target=record)
    r.start()
    deadline = time.monotonic() + 5
    while len(buf) < 2 and time.monotonic() < deadline:  # the row goes in, then it waits
        time.sleep(0.0005)
    buf.end_flush()
    r.join(5)
    assert appended.is_set() and len(buf) == 2
    w1, cut1, s1 = buf.parks()
    assert w1 == w0 + 1 and cut1 - cut0 in (0, 1) and s1 > s0

    buf.append(*_row(2))  # the window is closed
    assert buf.parks()[0] == w1

    _open(buf)  # again: the writer's own appends never wait
    w1 = buf.parks()[0]
    prev = buf.mark_writer(True)
    try:
        buf.append(*_row(3))
    finally:
        buf.mark_writer(prev)
        buf.end_flush()
    assert buf.parks()[0] == w1
    assert buf.take()[3] == 5


def test_a_window_left_open_holds_a_thread_back_for_a_bounded_time(buf: Any) -> None:
    """A writer that never closes its window (stuck, or dead mid-flush) delays a recording
    thread by at most PARK_MAX_S a row."""
    _open(buf)
    w0, cut0, _ = buf.parks()
    t0 = time.monotonic()
    for i in range(3):
        buf.append(*_row(i + 1))
    took = time.monotonic() - t0
    buf.end_flush()
    w1, cut1, _ = buf.parks()
    assert (w1 - w0, cut1 - cut0) == (3, 3)
    assert 3 * records.PARK_MAX_S * 0.9 <= took < 5


def test_a_wake_is_for_its_own_buffer(buf: Any) -> None:
    """wake() ends the wait on that buffer only (a session's wake left over, or another
    buffer's, never cuts an idle writer's wait short)."""
    other = records.Buffer() if isinstance(buf, records.Buffer) else _native.Buffer()
    other.wake()
    t, got = _waiter(buf, 0.01)
    t.join(0.1)
    assert t.is_alive() and not got
    buf.wake()
    t.join(5)
    assert got == [True]


def test_the_window_closes_for_a_barrier_and_opens_again(buf: Any) -> None:
    """end_flush() then begin_flush(): what the writer does around a dump barrier."""
    _open(buf)
    buf.end_flush()
    w0 = buf.parks()[0]
    buf.append(*_row(1))  # closed: no wait
    assert buf.parks()[0] == w0
    buf.begin_flush()
    for _ in range(1000):  # the native core's pending call to the main thread
        pass
    w1 = buf.parks()[0]
    r = threading.Thread(target=buf.append, args=_row(2))
    r.start()
    r.join(5)  # cut short at PARK_MAX_S at the latest
    assert buf.parks()[0] == w1 + 1


@pytest.mark.skipif(not NATIVE_BUILT or not hasattr(os, "fork"), reason="native core, fork")
def test_a_child_forked_during_a_flush_starts_with_the_window_closed() -> None:
    b = _native.Buffer()
    try:
        _open(b)
        pid = os.fork()
        if pid == 0:  # the child: its appends never wait, its counts start at zero
            code = 0
            try:
                t0 = time.monotonic()
                for i in range(5):
                    b.append(*_row(i))
                if b.parks() != (0, 0, 0.0) or time.monotonic() - t0 > 0.04:
                    code = 3
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        b.wake()
        b.end_flush()


BUSY = """
import threading
import numpy as np

def work(n):
    a = np.ones(8)
    for _ in range(n):
        a = np.add(a, 1.0)

ts = [threading.Thread(target=work, args=(20000,)) for _ in range(3)]
for t in ts:
    t.start()
work(40000)
for t in ts:
    t.join()
print("done")
"""


def test_rows_recorded_while_the_writer_flushes_are_all_in_the_log(tmp_path: Path) -> None:
    """Four threads record 100,000 rows while the writer flushes every 2,048: each flush holds
    them back (meta.json counts the waits), and every row reaches the log."""
    r = run_script(tmp_path, BUSY, env={"PPROBE_MODE": "log", "PPROBE_FLUSH_ROWS": "2048"})
    assert r.rc == 0 and r.out.strip() == "done", r.err
    (n,) = sql(r.run_dir, "SELECT count(*) AS n FROM ops WHERE op = 'numpy.add'")
    assert n["n"] == 100_000
    waits = meta(r.run_dir)["core"]["flush_waits"]
    assert waits["waits"] >= 1 and waits["seconds"] > 0
    assert 0 <= waits["cut_short"] <= waits["waits"]


QUIET_MAIN = """
import time
import numpy as np

np.add(np.ones(3), 1.0)  # one row buffered: the writer's timer has something to flush
t_end = time.monotonic() + 1.5
n = 0
while time.monotonic() < t_end:  # pure Python: the main thread appends no row from here on
    n += 1
print("done")
"""


def test_a_main_thread_that_records_nothing_still_makes_way_for_the_flush(
    tmp_path: Path,
) -> None:
    """The native core also asks the main thread to wait for a flush at its next safe point
    (a pending call), so that a main thread busy in Python with nothing to record (an import,
    a pure-Python loop) does not race the writer for the GIL. The Python engine has no such
    hook: there the count stays 0."""
    r = run_script(tmp_path, QUIET_MAIN, env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "0.05"})
    assert r.rc == 0 and r.out.strip() == "done", r.err
    m = meta(r.run_dir)
    waits = m["core"]["flush_waits"]
    if m["core"]["engine"] == "native":
        assert waits["waits"] >= 1
    else:
        assert waits["waits"] == 0
    (n,) = sql(r.run_dir, "SELECT count(*) AS n FROM ops WHERE op = 'numpy.add'")
    assert n["n"] == 1


SIGNALS = """
import faulthandler, os, signal, time
import numpy as np

faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test's view of a hang
# Python leaves SIGINT alone when it starts ignored (a CI job run in the background): the
# program installs Python's own Ctrl-C handler, as a terminal would have it.
signal.signal(signal.SIGINT, signal.default_int_handler)

got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
a = np.ones(4)
t_end = time.monotonic() + 1.0
i = 0
while time.monotonic() < t_end:  # flushes every 10 ms or 256 rows, Python in between
    i += 1
    if i % 50 == 0:
        a = np.add(a, 1.0)
    if i % 20000 == 0:
        os.kill(os.getpid(), signal.SIGUSR1)
print(len(got) > 0, flush=True)
while True:  # until the test's SIGINT
    a = np.add(a, 1.0)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_signals_act_as_before_while_the_writer_flushes(tmp_path: Path) -> None:
    """A handler runs and Ctrl-C ends the program the same way, while flush windows open
    every few milliseconds (and the main thread is asked to yield in them)."""
    script = tmp_path / "sig.py"
    script.write_text(SIGNALS)
    outcomes = []
    for probe in (False, True):
        env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PPROBE_MODE="log")
        if probe:
            env.update(PYTHONPATH=str(BOOTSTRAP), PPROBE_FLUSH_SECONDS="0.01",
                       PPROBE_FLUSH_ROWS="256")  # fmt: skip
        p = subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline().strip()
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # the stacks of every thread, then the failure
            p.send_signal(signal.SIGUSR2)
            time.sleep(1)
            p.kill()
            pytest.fail(f"probe={probe}: Ctrl-C did not end the program:\n{p.communicate()[1]}")
        err = p.stderr.read().strip().splitlines()
        outcomes.append((line, rc, err[-1] if err else ""))
    assert outcomes[0] == ("True", -signal.SIGINT, "KeyboardInterrupt")  # as Python does
    assert outcomes[1] == outcomes[0]


INTERRUPTS = """
import signal, sys, time
import numpy as np

a = np.ma.array(np.arange(10.0), mask=[0, 1] * 5)  # described by Python helpers each call
b = np.arange(6.0).reshape(2, 3)
in_ops = False
raised = caught = lost = 0


def handler(signum, frame):
    global in_ops, raised
    if in_ops:  # once per block of calls: the block's end tells whether it arrived
        in_ops = False
        raised += 1
        raise KeyboardInterrupt


signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        in_ops = True
        for _ in range(300):
            np.add(a, a)
            np.sum(b, axis=0)
            np.concatenate([b, b], axis=1)
        if not in_ops:  # the handler raised, and the program never saw it
            lost += 1
    except KeyboardInterrupt:
        caught += 1
signal.setitimer(signal.ITIMER_REAL, 0)
print(raised, caught, lost)
"""


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX interval timers")
@pytest.mark.parametrize("mode", ["log", "stats", "dump"])
def test_an_interrupt_raised_inside_the_probe_reaches_the_program(
    mode: str, tmp_path: Path
) -> None:
    """A signal handler that raises (KeyboardInterrupt, every ~0.3 ms) raises at whatever
    bytecode runs, pprobe's own helpers included (the Python code that describes a masked
    array, names a new string, classifies a frame). Each exception reaches the program:
    none is cleared as a failure of pprobe's. Before drop_error (pprobe/_native.c), 1-5 % of
    them were lost under the native engine."""
    env = clean_env(PYTHONPATH=str(BOOTSTRAP), PPROBE_MODE=mode,
                    PPROBE_OUTPUT=str(tmp_path / "out"))  # fmt: skip
    (tmp_path / "intr.py").write_text(INTERRUPTS)
    r = subprocess.run([sys.executable, str(tmp_path / "intr.py"), "2"], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    raised, caught, lost = map(int, r.stdout.split())
    assert raised > 500, r.stdout  # interrupts did land, many inside the probe's calls
    assert (caught, lost) == (raised, 0), r.stdout
