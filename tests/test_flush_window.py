"""The writer's flush window (pprobe/_native.c "the writer's flush window", records.Buffer):
while the writer thread flushes, a thread that records a row waits for the flush to end
instead of contending with it for the GIL; the writer's wait takes no GIL while nothing is
buffered. In-process tests of both buffers, then a program through the bootstrap."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers import meta, run_script, sql

from pprobe import records

try:
    from pprobe import _native

    NATIVE_BUILT = True
except ImportError:  # the Python engine's CI leg without a compiler
    NATIVE_BUILT = False


def _buffers() -> list[object]:
    out: list[object] = [records.Buffer()]
    if NATIVE_BUILT:
        out.append(_native.Buffer())
    return out


def _row(seq: int) -> tuple[bytes, bytes, None]:
    head, descs, objs = records.encode_row(seq, 0, 0, 1, 11, 0, 0, -1, -1, "ok", None, None, [], [])
    return head, descs, None


def _waiter(buf: object, timeout: float) -> tuple[threading.Thread, list]:
    got: list = []

    def run() -> None:
        got.append(buf.wait(timeout))  # type: ignore[attr-defined]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_an_idle_writer_keeps_waiting_until_woken(buf: object) -> None:
    """Nothing buffered: the timeout does not end the wait (the writer would take the GIL for
    nothing); wake() does, and says so."""
    t, got = _waiter(buf, 0.01)
    t.join(0.2)
    assert t.is_alive() and not got  # 20 timeouts passed, nothing to flush
    buf.wake()  # type: ignore[attr-defined]
    t.join(5)
    assert got == [True]
    buf.end_flush()  # type: ignore[attr-defined]


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_the_timeout_ends_the_wait_when_rows_are_buffered(buf: object) -> None:
    buf.append(*_row(0))  # type: ignore[attr-defined]
    t, got = _waiter(buf, 0.01)
    t.join(5)
    assert got == [False]  # the timeout, not a wake
    buf.end_flush()  # type: ignore[attr-defined]


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_a_recording_thread_waits_for_the_flush(buf: object) -> None:
    """In the window, a thread that appends a row waits (its row is in first); after
    end_flush() appends go on without waiting. The writer thread itself never waits."""
    w0, cut0, s0 = buf.parks()  # type: ignore[attr-defined]
    buf.append(*_row(0))  # type: ignore[attr-defined]
    t, got = _waiter(buf, 0.01)
    t.join(5)
    assert got == [False]  # the window is open now
    appended = threading.Event()

    def record() -> None:
        buf.append(*_row(1))  # type: ignore[attr-defined]
        appended.set()

    r = threading.Thread(target=record)
    r.start()
    time.sleep(0.002)
    n_during = len(buf)  # type: ignore[arg-type]
    buf.end_flush()  # type: ignore[attr-defined]
    r.join(5)
    assert appended.is_set() and n_during == 2  # the row went in before the thread waited
    w1, cut1, s1 = buf.parks()  # type: ignore[attr-defined]
    assert w1 == w0 + 1 and cut1 - cut0 in (0, 1) and s1 > s0

    buf.append(*_row(2))  # type: ignore[attr-defined]  (the window is closed)
    assert buf.parks()[0] == w1  # type: ignore[attr-defined]

    t, got = _waiter(buf, 0.01)  # open it again: the writer's own appends never wait
    t.join(5)
    prev = buf.mark_writer(True)  # type: ignore[attr-defined]
    try:
        buf.append(*_row(3))  # type: ignore[attr-defined]
    finally:
        buf.mark_writer(prev)  # type: ignore[attr-defined]
        buf.end_flush()  # type: ignore[attr-defined]
    assert buf.parks()[0] == w1  # type: ignore[attr-defined]
    assert buf.take()[3] == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_a_window_left_open_holds_a_thread_back_for_a_bounded_time(buf: object) -> None:
    """A writer that never closes its window (stuck, or dead mid-flush) delays a recording
    thread by at most PARK_MAX_S a row."""
    buf.append(*_row(0))  # type: ignore[attr-defined]
    t, _ = _waiter(buf, 0.01)
    t.join(5)
    w0, cut0, _ = buf.parks()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    for i in range(3):
        buf.append(*_row(i + 1))  # type: ignore[attr-defined]
    took = time.monotonic() - t0
    buf.end_flush()  # type: ignore[attr-defined]
    w1, cut1, _ = buf.parks()  # type: ignore[attr-defined]
    assert (w1 - w0, cut1 - cut0) == (3, 3)
    assert 3 * records.PARK_MAX_S * 0.9 <= took < 5


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
