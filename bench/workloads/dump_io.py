"""Workload 6: how fast arrays reach the disk, and what that costs a computing main thread.

``kind`` picks what this child does with ``count`` arrays of ``nbytes`` bytes (float32):
- ``op``: ``np.negative(x)`` per array: under pprobe's dump mode each call saves its input
  and its output (2 files); without the probe it is the unprobed op;
- ``duty``: the same op after ``busy`` iterations of pure-Python work (the main thread keeps
  computing between ops: a background writer would have to win the GIL from it);
- ``np_save``: ``np.save`` of the same two arrays per iteration to new files, no probe;
- ``disk``: the same total bytes as one large write to one new file (``fsync`` optional;
  ``direct``: with O_DIRECT from a page-aligned buffer, the device's own bandwidth whatever
  the page cache's state, the bytes rounded down to whole 4 KiB blocks; ``unavailable``
  where the file system refuses O_DIRECT).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import numpy as np
from _child import ARGS, Span, emit, session

kind = ARGS["kind"]
nbytes, count = int(ARGS["nbytes"]), int(ARGS["count"])
busy_iters = int(ARGS.get("busy", 0))
where = ARGS.get("dir")  # np_save / disk write here (the harness passes a folder it empties)
x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)


def busy(k: int) -> int:
    s = 0
    for i in range(k):
        s += i
    return s


def dumped() -> tuple[int, int]:
    """(files, bytes) pprobe has written so far in this process."""
    s = session()
    if s is None or s.dumper is None:
        return 0, 0
    d = s.dumper.summary()
    return d["files"], d["bytes_written"]


def drain() -> None:
    """Wait until pprobe's dump writer has written every file queued so far."""
    s = session()
    if s is not None and s.dumper is not None:
        s.dumper.barrier()


def main() -> None:
    out: dict = {"kind": kind, "nbytes": nbytes, "count": count}
    neg = np.negative
    neg(x)  # warm-up (and its dump) before the timing
    global where
    made = None
    if where is None and kind in ("np_save", "disk"):
        where = made = tempfile.mkdtemp(prefix="pprobe-bench-io-")
    f0, b0 = dumped()
    total = 2 * count * (x.nbytes + 128)
    direct = kind == "disk" and bool(ARGS.get("direct"))
    if kind == "disk":
        import mmap

        if direct:
            total -= total % 4096  # O_DIRECT writes whole blocks
        buf = mmap.mmap(-1, total)  # page-aligned, as O_DIRECT needs
        ones = b"\x01" * (1 << 20)
        for at in range(0, total, len(ones)):  # touched before the timing: no page faults
            buf[at : at + len(ones)] = ones[: total - at]
    # Every variant starts with no dirty pages in the page cache (untimed): the ~300 MB the
    # previous child left unwritten would otherwise throttle whichever variant runs next (a
    # single write of the same bytes read 438 to 4,786 MB/s from one run to the next).
    os.sync()
    th0 = time.thread_time()  # the main thread's own CPU: what the program pays
    with Span() as sp:
        # x[0] changes every iteration: each dump is new content (a repeated content is a
        # hard link, which would measure nothing of the disk).
        if kind == "op":
            for i in range(count):
                x[0] = i
                neg(x)
        elif kind == "duty":
            for i in range(count):
                x[0] = i
                busy(busy_iters)
                neg(x)
        elif kind == "np_save":
            for i in range(count):
                y = neg(x)
                np.save(os.path.join(where, f"in{i}.npy"), x, allow_pickle=False)
                np.save(os.path.join(where, f"out{i}.npy"), y, allow_pickle=False)
            out["files"], out["bytes"] = 2 * count, total
        elif kind == "disk":
            try:
                o_direct = getattr(os, "O_DIRECT", None) if direct else 0
                if o_direct is None:
                    raise OSError(errno.EINVAL, "no O_DIRECT on this platform")
                fd = os.open(os.path.join(where, "big.bin"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | o_direct, 0o600)  # fmt: skip
                try:
                    view, done = memoryview(buf), 0
                    while done < total:
                        n = os.write(fd, view[done:])
                        if n <= 0:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        done += n
                    if ARGS.get("fsync"):
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                if not direct:
                    raise
                if made:  # EINVAL: this file system has no O_DIRECT
                    shutil.rmtree(made, ignore_errors=True)
                emit({"unavailable": f"O_DIRECT refused here: {e}"})
                return
            out["files"], out["bytes"] = 1, total
    sp.put(out, "loop_s")
    out["loop_thread_s"] = time.thread_time() - th0
    # The files are written by pprobe's writer thread while the loop runs: the throughput is
    # what reached the disk by the time the last file was written (wall clock).
    with Span() as dr:
        drain()
    out["drain_s"] = dr.wall
    if kind == "disk" and (ARGS.get("fsync") or direct):
        out["loop_s"] = sp.wall  # waiting for the device is not CPU time
    if made:
        shutil.rmtree(made, ignore_errors=True)
    f1, b1 = dumped()
    if f1 > f0:
        out["files"], out["bytes"] = f1 - f0, b1 - b0
        # how many went with O_DIRECT (PPROBE_DUMP_DIRECT), the warm-up's dump included
        out["direct_files"] = session().dumper.summary().get("direct_files")
    emit(out)


main()
