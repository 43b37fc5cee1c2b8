"""Writing .npy dumps of op inputs and outputs, off the program's threads, within the budget.

Names: ``op_{op}_input{i}_{prefix}.npy`` / ``op_{op}_output{j}_{prefix}.npy`` (``output`` alone
when the op has one output), ``prefix`` = ``{pid}-{seq}``: unique per call and process. Every
part of a name is sanitised (``[A-Za-z0-9._-]``), and a name longer than 200 bytes is cut with
a hash of the whole, so no name can leave the run folder or fail for its length.

The recording thread pays for the copy of the bytes (the values at call time) and a few
microseconds: :class:`Dumper` builds the .npy header, hashes the content, reserves the bytes in
the budget and hands the copy to a queue. A writer thread empties the queue: it creates each
file under a hidden temporary name relative to the run folder's descriptor
(``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600), writes it and renames it into place, so no
half-written .npy is ever visible under its name. The native writer (pprobe/_dumpio.c) runs
without the GIL, so a busy program cannot starve it; its Python twin (:class:`PyQueue`) is the
fallback. The log writer waits for the dumps a batch's rows point to before it writes the
batch: after kill -9, every dump a row points to is complete.

Small dumps (at most ``PPROBE_DUMP_PACK`` bytes, header + data) are not files: the same writer
thread appends each as one entry to this process's pack file (:mod:`pprobe.packs`,
``.packs/{host}-{pid}-{k}.npk``, created like the files), and a repeated content there is an
alias entry. Rows keep the seed names; the loader finds them in the packs. With a ring
(``PPROBE_DUMP_KEEP``, ``PPROBE_ON_NAN=dump``), which deletes old dumps, every dump is a file.

The queue's memory is bounded (``PPROBE_DUMP_QUEUE``). When it is full the recording thread
waits for room (``PPROBE_DUMP_FULL=wait``, the default) or skips that dump and says so in the
row (``skip``). An array larger than the whole queue is written once the queue is empty.

The same content dumped again (same dtype, shape and bytes: a 128-bit content hash, XXH3-128
from the ``xxhash`` package, else pprobe's own) becomes a hard link to the first file: no bytes
written, none taken from the budget.

The budget is shared by all processes of a run without a server: it is cut into chunks, and a
process takes a chunk by making the name ``.budget/{k}``: a hard link to ``.budget/token``
(link(2) fails on an existing name, atomically on POSIX file systems, NFS included).
Reservations are made under a lock before anything is queued, so the budget is a hard limit
across threads and processes. One array larger than what is left is skipped (its row says
why); dumping stops only when not even a small array fits, and ``.budget/exhausted`` tells the
other processes.

What is kept afterwards (a ring of the last K steps' dumps, dumps held for PPROBE_ON_NAN=dump)
is :mod:`pprobe.dumpkeep`'s business: the Dumper files each dump in its ring when there is one.
"""

from __future__ import annotations

import _thread
import errno
import hashlib
import itertools
import os
import queue
import re
import threading
import time
from array import array
from collections import deque
from typing import Any

from . import _report, packs, safefs, state

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
NAME_MAX = 200  # bytes; file systems allow 255
SMALL = 4096  # bytes: below this much budget left, dumping stops
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_dtype_name: Any = None  # numpy_arrays.dtype_name, once numpy is imported
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def safe_name(op: str) -> str:
    """An op name as one safe file-name part."""
    s = _UNSAFE.sub("_", op).strip(".")
    return s[:120] or "op"


_ops: dict[str, str] = {}  # op names -> their safe form
_args: dict[str, str] = {}  # argument names (input0, output, a keyword) -> their safe form


def _part(s: str, cache: dict[str, str], fn: Any) -> str:
    p = cache.get(s)
    if p is None:
        p = fn(s)
        if len(cache) < 65536:
            cache[s] = p
    return p


def _safe_arg(s: str) -> str:
    return _UNSAFE.sub("_", s)


#: (op, which) -> ``op_{op}_{which}_``, both parts sanitised (the per-dump name is this head,
#: the prefix and ``.npy``)
_heads: dict[tuple[str, str], str] = {}


def head_of(op: str, which: str) -> str:
    """``op_{op}_{which}_``, both parts sanitised: the start of every dump name of ``op``'s
    ``which`` (kept in ``_heads``; the native core keeps its own copy per op and argument)."""
    head = f"op_{_part(op, _ops, safe_name)}_{_part(which, _args, _safe_arg)}_"
    if len(_heads) < 65536:
        _heads[op, which] = head
    return head


def file_name(op: str, which: str, prefix: str, codec: str = "npy") -> str:
    """``op_{op}_{which}_{prefix}.npy`` with every part sanitised; cut with a hash if long.
    Another codec than npy appends its name: ``....npy.zstd`` (pprobe.codecs)."""
    if codec != "npy":
        return file_name(op, which, prefix) + "." + codec
    head = _heads.get((op, which)) or head_of(op, which)
    # a {pid}-{seq} prefix is safe as it is (ASCII digits and one dash): no regex for it
    if not (prefix.isascii() and prefix.replace("-", "", 1).isdigit()):
        prefix = _safe_arg(prefix)
    name = head + prefix + ".npy"
    if len(name) > NAME_MAX:
        h = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
        tail = f"_{_UNSAFE.sub('_', prefix)}.npy"
        name = name[: NAME_MAX - len(tail) - 18] + "_" + h + tail
        if len(name) > NAME_MAX:  # an absurd prefix
            name = f"op_{h}.npy"
    return name


# ---------------------------------------------------------------------- .npy headers
_MAGIC = b"\x93NUMPY"


def npy_header(dtype: Any, shape: tuple, fortran: bool = False) -> bytes:
    """The .npy header np.save writes for an array of ``dtype`` and ``shape``, C-ordered, or
    with ``fortran`` Fortran-ordered (its memory as it is: see :func:`fortran_order`)."""
    from numpy.lib import format as npformat

    d = {"descr": npformat.dtype_to_descr(dtype), "fortran_order": bool(fortran),
         "shape": shape}  # fmt: skip
    text = "{" + "".join(f"{k!r}: {d[k]!r}, " for k in sorted(d)) + "}"
    # The header is padded so that the data starts at a multiple of 64 bytes, plus a newline.
    for version, fmt_len in (((1, 0), 2), ((2, 0), 4)):
        try:
            raw = text.encode("latin1")
        except UnicodeEncodeError:
            raw = text.encode("utf8")
            version, fmt_len = (3, 0), 4
        total = len(_MAGIC) + 2 + fmt_len + len(raw) + 1
        raw += b" " * ((64 - total % 64) % 64) + b"\n"
        if fmt_len == 2 and len(raw) >= 1 << 16:
            continue
        head = _MAGIC + bytes(version)
        return head + len(raw).to_bytes(fmt_len, "little") + raw
    raise ValueError("header too large")  # pragma: no cover - 4 GiB headers


def fortran_order(a: Any) -> bool:
    """Whether ``a`` is dumped in Fortran order: its memory written as it is, with
    ``'fortran_order': True`` in the header, as np.save writes such an array (a transpose
    ``x.T``, a BLAS result), instead of gathered into C order element by element. An array
    that is both (1-D, a single row) is C-ordered."""
    f = a.flags
    return a.ndim > 1 and not f.c_contiguous and f.f_contiguous


# ---------------------------------------------------------------------- the writers
#: The most chunks the dump budget is cut into (see Dumper.__init__).
MAX_CHUNKS = 256


#: How long a started dump writer thread counts as alive before it has claimed the queue.
LAUNCH_S = 10.0


class _Count:
    """An int attribute kept in the instance's ``array('q')``: no Python int stays referenced
    between calls (NumPy's own tests count the references to small ints)."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __get__(self, obj: Any, tp: Any = None) -> int:
        return obj._n[self.i]  # type: ignore[no-any-return]

    def __set__(self, obj: Any, v: int) -> None:
        obj._n[self.i] = v


def _checks(digest: bytes, link: str | None, data: Any) -> bool:
    """Whether ``digest`` can check a dump's pack entry, as pprobe._dumpio.submit decides: 16
    bytes, of data written as it is (a C-contiguous buffer, not gathered), not an alias."""
    if link is not None or data is None or len(digest) != packs.DIGEST_SIZE:
        return False
    try:
        return memoryview(data).c_contiguous
    except (TypeError, ValueError):
        return False


def _poll_until(done: Any, timeout: float | None) -> bool:
    """Wait until ``done()`` is true (sleeps of 50 us growing to 2 ms), at most ``timeout``
    seconds (None: no limit); whether it is."""
    end = None if timeout is None else time.monotonic() + timeout
    pause = 5e-5
    while not done():
        if end is not None and time.monotonic() >= end:
            return bool(done())
        time.sleep(pause)
        pause = min(pause * 2, 2e-3)
    return True


class PyQueue:
    """The pure-Python twin of pprobe._dumpio's queue: the same calls, a Python thread.

    Safe against an exception raised asynchronously on the program's thread (a signal
    handler's KeyboardInterrupt lands at any bytecode): the program's threads take only
    ``lock``, a C lock whose ``with`` block cannot be left with it held, and wake the writer
    thread with one C call (``SimpleQueue.put``); they never wait on a ``Condition`` (its
    ``__enter__``, ``wait`` and ``notify`` are Python code: an exception between its lock's
    acquire and release left the lock held, and the run hung at exit). Waits for room or for
    completion poll (:func:`_poll_until`). The writer thread is started with
    ``_thread.start_new_thread`` (``threading.Thread.start`` waits on an Event: cut off there,
    the new thread hung, or a second writer started beside it) and claims the queue itself:
    at most one writer runs, and a start cut off before the thread runs is made again."""

    queued = _Count(0)
    submitted = _Count(1)
    completed = _Count(2)
    files = _Count(3)
    links = _Count(4)
    failed = _Count(5)
    written = _Count(6)
    max = _Count(7)

    def __init__(self, codec: str = "npy") -> None:
        #: The codec the writer thread encodes with (pprobe.codecs); npy writes the bytes as
        #: they were queued (the .npy header and the array's bytes).
        self.codec = codec
        if codec != "npy":
            # Imported here, on the program's thread: a module imported on the writer thread
            # can leave its import lock held by a thread a forked child does not have.
            from . import codecs  # noqa: F401
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self._kick: queue.SimpleQueue = queue.SimpleQueue()  # a token a submit (or close)
        self.jobs: deque = deque()
        old = getattr(self, "_n", None)
        self._n = array("q", [0] * 8)  # the _Count attributes
        self.max = old[7] if old is not None else 1  # a forked child keeps the queue's size
        self.fails: list = []
        self.infos: list = []  # (name, codec, max_abs_error, bytes) of each encoded dump
        self._first: dict[str, tuple] = {}  # encoded file name -> its info, for its links
        self._pack_failed: set[str] = set()  # pack entries not written: their aliases fail
        self._owner: int | None = None  # the running writer thread's ident (set by it)
        self._launched = 0.0  # when a writer thread was last started (0: it runs, or none)
        self.stopping = False
        self.dirfd = getattr(self, "dirfd", -1)
        # The pack this process appends small dumps to (pprobe.packs); a forked child starts
        # its own (its pid is in the name) and never appends to its parent's.
        old_fd = getattr(self, "_pack_fd", -1)
        if old_fd >= 0:
            try:
                os.close(old_fd)
            except OSError:
                pass
        self._pack_fd = -1
        self._pack_size = 0
        self._pack_k = 0
        self._pack_gen = -1
        self._gen = getattr(self, "_gen", 0)
        self.host = getattr(self, "host", "host")

    def open(self, dirfd: int, max_bytes: int) -> None:
        with self.lock:
            self.dirfd = dirfd
            self.max = max(1, max_bytes)
            self._gen += 1

    def set_host(self, host: str) -> None:
        """The host part of this process's pack names (``{host}-{pid}-{k}.npk``)."""
        self.host = host

    def _room(self, need: int) -> bool:
        return not self.jobs or self.queued + need <= self.max

    def submit(
        self,
        name: str,
        header: bytes,
        data: Any,
        link: str | None,
        wait: bool,
        pack: bool = False,
        digest: bytes | None = None,
    ) -> bool:
        """Queue one dump (see pprobe._dumpio.submit). ``digest``: the XXH3-128 digest of
        ``data``'s bytes, taken on the program's thread: its pack entry is then checked by it
        (a version 2 entry, pprobe.packs), not by a CRC of the array's bytes."""
        if not name or "/" in name or (link is not None and "/" in link):
            raise ValueError("a dump name is one non-empty path component")
        payload: Any
        if link is not None:
            payload, size = b"", 0
        elif self.codec != "npy" and data is not None:
            # a copy of the values: the writer thread encodes it (never the program's thread)
            payload = data.copy(order="C")
            size = len(header) + int(payload.nbytes)
            digest = None  # the file holds the codec's bytes, not the array's
        else:
            payload = header + (b"" if data is None else data.tobytes())
            size = len(payload)
        if digest is not None and not _checks(digest, link, data):
            digest = None
        while True:
            with self.lock:
                if self._room(size) or (wait and not self._alive()):
                    job = (name, link, payload, size, pack, digest, len(header))
                    n = self._n  # (no call between these and the append: no signal check)
                    n[0] += size  # queued
                    n[1] += 1  # submitted
                    self.jobs.append(job)
                    if not self._alive():
                        self._launch()
                    break
            if not wait:
                return False
            _poll_until(lambda: self._room(size) or not self._alive(), 0.1)
        self._kick.put(None)
        return True

    def _alive(self) -> bool:
        """A writer thread runs, or was started less than LAUNCH_S ago (it claims the queue
        when it runs: on a loaded machine, a while after its start)."""
        if self._owner is not None:
            return True
        t = self._launched
        return bool(t) and time.monotonic() - t < LAUNCH_S

    def _launch(self) -> None:
        """Start a writer thread (under ``lock``). One that cannot start is reported; the next
        submit tries again."""
        self.stopping = False
        self._launched = time.monotonic()
        try:
            _thread.start_new_thread(self._main, ())
        except Exception as e:  # RuntimeError: can't start new thread
            self._launched = 0.0
            _report.internal_error("starting the dump writer thread", e)

    def _main(self) -> None:
        """The writer thread: it claims the queue (none other runs), then writes."""
        me = _thread.get_ident()
        threading.current_thread().name = "pprobe-dumps"  # (a dummy Thread, for tracebacks)
        with self.lock:
            self._launched = 0.0
            if self._owner is not None:
                return
            self._owner = me
        try:
            self._run()
        finally:
            with self.lock:
                if self._owner == me:
                    self._owner = None

    def _run(self) -> None:
        state.local.depth = state.INTERNAL
        while True:
            while not self.jobs and not self.stopping:
                try:  # a token a submit; the timeout covers a token an exception cut off
                    self._kick.get(timeout=0.5)
                except queue.Empty:
                    pass
            with self.lock:
                if not self.jobs:
                    return
                name, link, payload, size, pack, digest, hlen = self.jobs[0]
                gen = self._gen
            err = None
            info = None
            try:
                if link is not None:
                    if pack:  # the first dump is in a pack: an alias entry names it
                        if link in self._pack_failed:  # as a hard link to no file fails
                            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
                        self._append(gen, 1, name, link.encode("utf-8"))
                    else:
                        os.link(link, name, src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)
                    info = self._first.get(link)
                else:
                    if not isinstance(payload, bytes):
                        payload, info = self._encode(payload)
                    if pack:
                        self._append(gen, 0, name, payload, digest, hlen)
                    else:
                        _write_file(self.dirfd, name, payload)
            except OSError as e:
                err = e
                if pack:
                    self._pack_failed.add(name)
            with self.lock:
                self.jobs.popleft()
                self.queued -= size
                if info is not None and err is None:
                    if link is None:
                        if len(self._first) >= 1 << 16:
                            self._first.clear()
                        self._first[name] = info
                    self.infos.append((name, *info))
                self.completed += 1
                if err is not None:
                    self.failed += 1
                    self.fails.append((name, err.errno or 0, err.strerror or str(err)))
                elif link is not None:
                    self.links += 1
                else:
                    self.files += 1
                    self.written += len(payload)

    def _append(
        self,
        gen: int,
        kind: int,
        name: str,
        payload: bytes,
        digest: bytes | None = None,
        hlen: int = 0,
    ) -> None:
        """Append one entry to this process's pack (the writer thread only); ``digest``: of
        ``payload[hlen:]``, a version 2 entry (pprobe.packs)."""
        if self._pack_fd >= 0 and (gen != self._pack_gen or self._pack_size >= packs.PACK_MAX):
            os.close(self._pack_fd)
            self._pack_fd = -1
        if self._pack_fd < 0:
            self._pack_fd = _open_pack(self.dirfd, self.host, self)
            self._pack_size = 0
            self._pack_gen = gen
        bname = name.encode("utf-8")
        head = packs.entry_head(kind, bname, payload, digest, hlen)
        parts = [head, bname, payload] if digest is None else [head, bname, digest, payload]
        total = sum(len(p) for p in parts)
        try:
            safefs.write_all_v(self._pack_fd, parts)
        except OSError:
            # Never leave a partial entry in front of later ones: cut it off, or start anew.
            try:
                os.ftruncate(self._pack_fd, self._pack_size)
            except OSError:
                os.close(self._pack_fd)
                self._pack_fd = -1
            raise
        self._pack_size += total

    def _encode(self, a: Any) -> tuple[bytes, tuple]:
        """The dump's file bytes and (codec, max_abs_error, bytes), on the writer thread."""
        from . import codecs  # imported by __init__: no import runs on this thread

        try:
            blob, info = codecs.encode(self.codec, a)
        except Exception as e:  # an unknown codec (not registered in this process), a bug
            _report.warn_once(
                "codec",
                f"dump codec {self.codec!r} failed ({type(e).__name__}: {e}); "
                "dumps are written as plain .npy",
            )
            blob, info = codecs.encode("npy", a)
        return blob, (info["codec"], info["max_abs_error"], info["bytes"])

    def codec_infos(self) -> list:
        with self.lock:
            out, self.infos = self.infos, []
        return out

    def ticket(self) -> int:
        return self.submitted

    def wait(self, ticket: int, timeout: float) -> bool:
        if self.completed < ticket:
            with self.lock:  # jobs with no writer: a submit cut off before its start
                if self.jobs and not self._alive():
                    self._launch()
            self._kick.put(None)
        _poll_until(lambda: self.completed >= ticket or not self._alive(), timeout)
        return self.completed >= ticket

    def failures(self) -> list:
        with self.lock:
            f, self.fails = self.fails, []
        return f

    def counters(self) -> tuple:
        return (self.queued, self.submitted, self.completed, self.files, self.links, self.failed,
                self.written)  # fmt: skip

    def close(self, timeout: float) -> bool:
        ok = self.wait(self.submitted, timeout)
        self.stopping = True
        self._kick.put(None)
        return ok

    @staticmethod
    def digest(a: Any) -> bytes | None:
        try:
            if not (a.flags.c_contiguous or a.flags.f_contiguous):
                return None
            return hashlib.blake2b(a.data.cast("B"), digest_size=16).digest()
        except (TypeError, ValueError, BufferError):
            return None


def _open_pack(dirfd: int, host: str, q: Any) -> int:
    """Create this process's next pack, ``.packs/{host}-{pid}-{k}.npk`` (0600, O_EXCL)."""
    try:
        os.mkdir(packs.PACK_DIR, 0o700, dir_fd=dirfd)
    except FileExistsError:
        pass
    flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
    pdfd = os.open(packs.PACK_DIR, flags, dir_fd=dirfd)
    try:
        while True:
            name = f"{host}-{os.getpid()}-{q._pack_k}{packs.SUFFIX}"
            q._pack_k += 1
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
                return os.open(name, flags | os.O_APPEND, 0o600, dir_fd=pdfd)
            except FileExistsError:
                if q._pack_k > 1 << 20:
                    raise
    finally:
        os.close(pdfd)


def _write_file(dirfd: int, name: str, data: bytes) -> None:
    tmp = "." + name + ".tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dirfd)
    try:
        try:
            safefs.write_all(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
        raise


#: PPROBE_DUMP_DIRECT -> pprobe._dumpio.direct's setting
DIRECT_CODES = {"off": 0, "auto": 1, "on": 2}


class NativeQueue:
    """pprobe._dumpio's queue (a native thread that never takes the GIL)."""

    def __init__(self, mod: Any) -> None:
        self.m = mod
        self.open = mod.open
        self.submit = mod.submit
        self.ticket = mod.ticket
        self.wait = mod.wait
        self.failures = mod.failures
        self.counters = mod.counters
        self.close = mod.close
        self.set_host = mod.set_host

    def digest(self, a: Any) -> bytes | None:
        try:
            return self.m.digest(a)  # type: ignore[no-any-return]
        except (TypeError, ValueError, BufferError):
            return None


def _io() -> tuple[Any, str]:
    """The dump writer this process runs, and which one (meta.json's ``core.dumps``)."""
    from . import core

    mod = core.dumpio()
    if mod is not None:
        return NativeQueue(mod), "native"
    return PyQueue(), "python"


def _content_hash(io: Any) -> tuple[Any, str, Any]:
    """(digest(array) -> bytes or None, its name for meta.json's ``dumps.content_hash``, the
    hash function it calls on a C-contiguous array's memory).

    XXH3-128 (the ``xxhash`` package: ~60 GB/s here, 8x pprobe's own 128-bit hash) where it is
    installed; else the dump writer's own (``pprobe``: _dumpio.c's, or ``blake2b`` for the
    Python twin). Digests are only compared within the process (never stored), so which one
    ran changes nothing on disk.

    The digest is of a C-contiguous array's memory: :meth:`Dumper._dump` hands a Fortran-
    ordered array over as its transpose, whose header (``'fortran_order': True``, part of the
    key with the digest) tells it from a C-ordered array of the same bytes. None: no
    C-contiguous buffer (a strided view, an odd dtype): that dump is not deduplicated."""
    try:
        from xxhash import xxh3_128_digest as raw
    except Exception:  # not installed (a checkout's bootstrap without pip install)
        raw, name = io.digest, "blake2b" if io.digest is PyQueue.digest else "pprobe"
    else:
        name = "xxh3_128"

    def digest(a: Any) -> bytes | None:
        try:
            if a.flags.c_contiguous:
                return raw(a)  # type: ignore[no-any-return]
        except (TypeError, ValueError, BufferError, AttributeError):
            pass
        return None

    return digest, name, raw


def _seq_of(prefix: str) -> int:
    """The seq in a dump prefix ``{pid}-{seq}`` (``.{tag}`` after it for torch dtypes)."""
    try:
        return int(prefix.split("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return -1


# ---------------------------------------------------------------------- the dumper
#: Dumper._n[VIEW]: the number of the state of the fields the native core's dumps read
#: (Dumper._view; pprobe/_native.c, dview_take)
VIEW = 6
#: Dumper._n[VIEW] while dumping has stopped for good: the core notes ``Dumper.stop_note``
STOPPED = -1
_views = itertools.count(1)
#: The note of a dump the budget had no room for
NOTE_EXHAUSTED = "not dumped: dump budget exhausted"


def _viewed(name: str) -> property:
    """An attribute of the Dumper that the native core's dumps read: setting it gives the
    dumper's fields a new view number (:meth:`Dumper._view`)."""
    slot = "_" + name

    def get(self: Any) -> Any:
        return getattr(self, slot)

    def put(self: Any, v: Any) -> None:
        setattr(self, slot, v)
        self._view()

    return property(get, put)


class Dumper:
    held = _Count(0)  # bytes this process has reserved
    used = _Count(1)  # bytes this process has queued (and, once written, on disk)
    linked = _Count(2)  # dumps stored as hard links to an earlier file
    skipped = _Count(3)  # dumps not written: too large for the budget left, queue full
    next_k = _Count(4)  # the next budget chunk to try
    errors = _Count(5)
    # What the native core's dumps (pprobe/_native.c, dview_take) read at every dump, taken
    # once per view number (``_n[VIEW]``): each of these set gives a new one.
    exhausted = _viewed("exhausted")  # the budget is used up: dumping stopped
    disk_full = _viewed("disk_full")  # why dumping stopped after a write failed ("" if not)
    dirfd = _viewed("dirfd")  # the run folder's descriptor once the first dump opened it
    c_digest = _viewed("c_digest")
    lock = _viewed("lock")

    def __init__(
        self,
        run_dir: str,
        budget: int,
        queue_bytes: int = 32 << 20,
        when_full: str = "wait",
        codec: str = "npy",
        keep: int = 0,
        hold: int = 0,
        host: str = "",
        pack: int = 0,
        direct: str = "auto",
    ) -> None:
        self.run_dir = run_dir
        self.budget = budget
        self.budget_dir = os.path.join(run_dir, ".budget")
        # chunks of at least 1 MiB, at most 256 of them (4 MiB each in the default 1 GiB):
        # taking a chunk costs the program's thread a link(2) (see _claim), and a process
        # holds at most one chunk it has not used
        n_chunks = max(1, min(MAX_CHUNKS, budget // (1 << 20))) if budget > 0 else 0
        self.n_chunks = n_chunks
        self.chunk = budget // n_chunks if n_chunks else 0
        self.queue_bytes = queue_bytes
        self.wait_when_full = when_full != "skip"
        # the fields that _view reads, before its first call
        self._lock = threading.Lock()
        self._exhausted = budget <= 0
        self._disk_full = ""  # why dumping stopped after a write failed for lack of space
        self._dirfd = -1
        self._c_digest: Any = None
        self.codec = codec
        if codec == "npy":
            self.io, self.engine = _io()
        else:  # the native writer writes .npy only; encoding runs on the Python writer thread
            self.io, self.engine = PyQueue(codec), "python"
            native, _ = _io()
            if isinstance(native, NativeQueue):  # its content hash, without the GIL
                self.io.digest = native.digest  # type: ignore[method-assign]
        # chosen at the first dump: xxhash is imported only by a process that dumps
        self.digest: Any = None
        #: the hash function behind ``digest`` for a C-contiguous array's memory (the native
        #: core's dumps call it directly): c_digest, above
        self.content_hash: str | None = None
        self.infos: dict[str, tuple] = {}  # file name -> (codec, max_abs_error, bytes)
        self.failed: dict[str, str] = {}  # file name -> why it was not written
        self._reset()
        self._token: str | None = None  # .budget/token once known ("": no hard links here)
        self.ring: Any = None  # pprobe.dumpkeep.Ring: PPROBE_DUMP_KEEP, PPROBE_ON_NAN=dump
        if keep or hold:
            from .dumpkeep import Ring

            self.ring = Ring(self, keep, hold, host or "host")
        #: Dumps of at most this many bytes (header + data) go to this process's pack
        #: (pprobe.packs); 0: every dump is its own file. The ring deletes old steps' files,
        #: which a pack cannot give back: with a ring, dumps stay files.
        self.pack = pack if self.ring is None else 0
        #: PPROBE_DUMP_DIRECT: large files written with O_DIRECT (the native writer only)
        self.direct = direct
        if isinstance(self.io, NativeQueue):
            self.io.m.direct(DIRECT_CODES[direct])
        self.io.set_host(_UNSAFE.sub("_", host or "host")[:64] or "host")
        self._view()

    def _reset(self) -> None:
        self._n = array("q", [0] * 7)  # the _Count attributes, then the view number (VIEW)
        self.seen: dict[Any, str] = {}  # content hash + header (bytes) -> the first file's name
        self._headers: dict[Any, bytes] = {}
        self._view()

    def _view(self) -> None:
        """Number the current state of what the native core's dumps read from this dumper
        (``lock``, ``seen``, ``_n``, ``pack``, ``c_digest``, ``content_hash``): 0 while every
        dump is Python's (the folder not opened yet, no digest yet, the budget used up, the
        disk full), else a number no earlier state had. The core takes those fields again
        when the number or the ``_n`` array changes (a forked child's: :meth:`_reset`), so a
        dump costs it no attribute lookup. Call it after changing any of them (the
        attributes it depends on call it when set)."""
        n = getattr(self, "_n", None)
        if n is None:
            return  # (__init__, before _reset)
        ok = (
            self._dirfd >= 0
            and self._c_digest is not None
            and not self._exhausted
            and not self._disk_full
        )
        # Dumping stopped for good (the budget used up with no ring to give bytes back, or
        # the disk full): STOPPED, and every dump's note is ``stop_note``, which the core
        # then writes itself, with no call to :meth:`dump` (a long run spends most of its
        # steps past its budget).
        stop = ""
        if not ok and getattr(self, "ring", 0) is None:
            stop = NOTE_EXHAUSTED if self._exhausted else self._disk_full
        self.stop_note = stop or None
        n[VIEW] = next(_views) if ok else STOPPED if stop else 0

    def after_fork(self) -> None:
        """A forked child starts with no reserved bytes and no written files of its own."""
        self.lock = threading.Lock()
        self._reset()
        self.failed = {}
        self.infos = {}
        self.disk_full = ""
        if self.ring is not None:
            self.ring.after_fork()

    def _open(self) -> bool:
        if self.dirfd >= 0:
            return True
        flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
        self.dirfd = os.open(self.run_dir, flags)
        self.io.open(self.dirfd, self.queue_bytes)
        return True

    # ------------------------------------------------------------------ budget
    def _reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` from the budget (lock held). False: not that much is left."""
        n = self._n
        if n[1] + nbytes <= n[0]:  # used + nbytes <= held: within the chunks already taken
            n[1] += nbytes
            return True
        while self.used + nbytes > self.held:
            if self.next_k >= self.n_chunks:
                return False
            if self.next_k == 0:
                os.makedirs(self.budget_dir, mode=0o700, exist_ok=True)
            if os.path.exists(os.path.join(self.budget_dir, "exhausted")):
                self.next_k = self.n_chunks
                return False
            path = os.path.join(self.budget_dir, str(self.next_k))
            self.next_k += 1
            if not self._claim(path):
                continue
            self.held += self.chunk
        self.used += nbytes
        return True

    def _claim(self, path: str) -> bool:
        """Take the budget chunk ``path`` (``.budget/{k}``): True when this process made that
        name, False when another process had it. The name is a hard link to ``.budget/token``,
        made by link(2), which fails on an existing name as O_CREAT|O_EXCL does, and is as
        atomic (the classic lock of NFS), without allocating an inode: on ext4, creating a file
        cost the program's thread 0.1-0.3 ms, a link ~20 us. Where the file system has no hard
        links, the chunk is a new empty file."""
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | _O_NOFOLLOW | _O_CLOEXEC
        if self._token is None:
            token = os.path.join(self.budget_dir, "token")
            try:
                os.close(os.open(token, flags, 0o600))
            except FileExistsError:
                pass  # another process's: linking to it (even were it a symlink) is harmless
            except OSError:
                token = ""
            self._token = token
        if self._token:
            try:
                os.link(self._token, path, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
            except (OSError, NotImplementedError):  # no hard links here (EPERM, EMLINK,
                self._token = ""  # ENOTSUP...; no linkat without following): files from now
        try:
            os.close(os.open(path, flags, 0o600))
        except FileExistsError:
            return False
        return True

    def _exhaust(self, nbytes: int) -> None:
        if self.ring is not None and self.ring.keep:
            # The ring gives bytes back as steps leave it: not exhausted for good.
            _report.warn_once(
                "budget",
                f"dump budget of {self.budget} bytes is used up by the last steps' dumps "
                "(PPROBE_BUDGET, PPROBE_DUMP_KEEP); dumping resumes as older steps are dropped.",
            )
            return
        self.exhausted = True
        if self.ring is not None and self.ring.holding:
            _report.warn_once(
                "budget",
                f"dump budget of {self.budget} bytes is used up (PPROBE_BUDGET); later dumps "
                "are held for PPROBE_ON_NAN=dump and released unless a NaN comes within "
                f"{self.ring.hold - 1} steps.",
            )
        try:
            flags = os.O_CREAT | os.O_WRONLY | _O_NOFOLLOW | _O_CLOEXEC
            fd = os.open(os.path.join(self.budget_dir, "exhausted"), flags, 0o600)
            try:
                os.write(fd, f"{os.getpid()} needed {nbytes} bytes\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass
        _report.warn_once(
            "budget",
            f"dump budget of {self.budget} bytes is used up (PPROBE_BUDGET); dumping stops, "
            "logging goes on.",
        )

    def _header(self, a: Any) -> bytes:
        # Keyed by texts: the cache must hold no dtype object and no small int (NumPy's own
        # tests count their references).
        global _dtype_name
        if _dtype_name is None:
            from .interceptors.numpy_arrays import dtype_name  # numpy is imported by now

            _dtype_name = dtype_name
        fortran = fortran_order(a)
        key = (_dtype_name(a.dtype), repr(a.shape), fortran)
        h = self._headers.get(key)
        if h is None:
            h = npy_header(a.dtype, a.shape, fortran)
            if len(self._headers) < 4096:
                self._headers[key] = h
        return h

    # ------------------------------------------------------------------ writing
    def dump(
        self,
        arr: Any,
        op: str,
        which: str,
        prefix: str,
        step: int | None = None,
        header: bytes | None = None,
    ) -> tuple[str | None, str | None]:
        """Queue ``arr`` (a NumPy array) for writing; return (file name, note). ``step``: the
        step of the call (default the current one; a deferred device dump passes its own).
        ``header``: ``npy_header(arr.dtype, arr.shape, fortran_order(arr))`` where the
        caller has it (the native core makes it for the builtin numeric dtypes)."""
        if self.exhausted and (self.ring is None or not self.ring.holding):
            return None, NOTE_EXHAUSTED
        if self.disk_full:
            return None, self.disk_full
        try:
            return self._dump(arr, op, which, prefix, state.step if step is None else step, header)
        except Exception as e:  # an unwritable folder, an odd dtype: this dump only
            self.errors += 1
            _report.internal_error("writing dumps", e)
            return None, f"not dumped: {type(e).__name__}: {e}"[:200]

    def _dump(
        self, a: Any, op: str, which: str, prefix: str, step: int, header: bytes | None = None
    ) -> tuple[str | None, str | None]:
        if self.dirfd < 0:
            self._open()
        name = file_name(op, which, prefix, self.codec)
        orig = a
        if header is None:  # (the core's headers are of numeric dtypes only)
            header = self._header(a)
            if a.dtype.kind in "mM":  # datetimes have no buffer format: their int64 bits
                a = a.view("i8")
        if fortran_order(a):  # its memory as it is: C-ordered bytes of its transpose
            a = a.T
        if self.digest is None:
            self.digest, self.content_hash, c_digest = _content_hash(self.io)
            self.c_digest = c_digest  # (last: it renumbers the view, content_hash included)
        nbytes = a.nbytes
        digest = self.digest(a) if nbytes >= 64 else None
        # bytes, not a tuple: a key lives in ``seen`` (up to 65,536 of them) and a tuple would
        # feed the collector's young count with every new content (bytes are not tracked)
        key = digest + header if digest is not None else None
        total = len(header) + nbytes
        ring = self.ring
        held = False
        with self.lock:
            group = None
            if ring is not None:
                group = ring.group(step)
                if group is None:
                    from .dumpkeep import LATE_NOTE

                    return None, LATE_NOTE
            first = self.seen.get(key) if key is not None else None
            if first is None and ring is not None and ring.holding and self.exhausted:
                held = True  # PPROBE_ON_NAN=dump: held outside the budget
            elif first is None and not self._reserve(total):
                if ring is not None and ring.holding:
                    held = True
                    if not self.exhausted:
                        self._exhaust(total)
                    first = None
                else:
                    left = self.held - self.used + (self.n_chunks - self.next_k) * self.chunk
                    if left < SMALL or total <= SMALL:
                        self._exhaust(total)
                        return None, NOTE_EXHAUSTED
                    self.skipped += 1
                    return None, (
                        f"not dumped: {total} bytes do not fit in the {left} bytes left of the "
                        "dump budget (PPROBE_BUDGET)"
                    )
            if first is not None:
                self.linked += 1
            elif key is not None:
                if len(self.seen) >= 1 << 16:
                    self.seen.clear()
                self.seen[key] = name
        # The same content has the same size: an alias goes where its first dump went.
        pack = total <= self.pack
        if first is not None:
            ok = self.io.submit(name, b"", None, first, self.wait_when_full, pack)
        else:
            # the digest of a's bytes checks its pack entry (pprobe.packs, version 2)
            check = digest if self.codec == "npy" and self.content_hash == "xxh3_128" else None
            ok = self.io.submit(name, header, a if self.codec == "npy" else orig, None,
                                self.wait_when_full, pack, check)  # fmt: skip
        if not ok:
            return self.unsubmit(key, name, first, total, held)
        if group is not None:
            with self.lock:
                seq = _seq_of(prefix)
                ring.add(group, name, seq, key, 0 if first is not None else total, held, first)
        return name, None

    def unsubmit(
        self, key: Any, name: str, first: str | None, total: int, held: bool = False
    ) -> tuple[None, str]:
        """The queue refused the dump ``name`` (PPROBE_DUMP_FULL=skip): give its bytes back
        (``held``: they were outside the budget), forget its content (or, for an alias of
        ``first``, the link); the row's (path, note)."""
        with self.lock:
            if first is None:
                if not held:
                    self.used -= total
                if key is not None and self.seen.get(key) == name:
                    del self.seen[key]
            else:
                self.linked -= 1
            self.skipped += 1
        return None, "not dumped: the dump queue is full (PPROBE_DUMP_FULL=skip)"

    def nan_origin(self) -> list[int]:
        """PPROBE_ON_NAN=dump: the first NaN origin came; the steps whose dumps are kept."""
        if self.ring is None:
            return []
        with self.lock:
            return self.ring.nan_origin()

    # ------------------------------------------------------------------ the log's side
    def codec_info(self, name: str) -> tuple | None:
        """(codec, max_abs_error, bytes on disk) of a written dump; None for a .npy dump (the
        default codec) or one not written yet (call :meth:`barrier` first)."""
        if self.codec == "npy":
            return ("npy", 0.0, None)
        return self.infos.pop(name, None)

    def barrier(self, timeout: float = 60.0) -> dict[str, str]:
        """Wait until every dump queued so far is written (the log writer calls this before it
        writes a batch whose rows may point to them); return the names that failed, with why."""
        if self.dirfd < 0:
            return self.failed
        ok = self.io.wait(self.io.ticket(), timeout)
        if not ok:
            _report.warn_once("dump-wait", f"dumps are still being written after {timeout} s")
        self._collect()
        return self.failed

    def _collect(self) -> None:
        if self.codec != "npy":
            if len(self.infos) >= 1 << 16:  # rows that never came (dropped): bounded memory
                self.infos.clear()
            for name, *info in self.io.codec_infos():
                self.infos[name] = tuple(info)
        gone = set()
        for name, code, msg in self.io.failures():
            self.failed[name] = f"not dumped: {msg}"
            gone.add(name)
            if code in _DISK_FULL and not self.disk_full:
                # Every later dump would fail the same way: dumping stops, logging goes on.
                self.disk_full = f"not dumped: {msg}; dumping stopped"
            if not self.errors:  # once: later failures are counted in meta.json
                _report.internal_error("writing dumps", OSError(code, msg, name))
            self.errors += 1
        if gone:  # a content whose file failed is not seen: its next dump is written anew
            with self.lock:
                for key in [k for k, v in self.seen.items() if v in gone]:
                    del self.seen[key]

    def close(self, timeout: float = 60.0) -> None:
        if self.ring is not None:
            with self.lock:
                self.ring.close()
        if self.dirfd < 0:
            return
        self.io.close(timeout)
        self._collect()

    def _writer_summary(self) -> dict[str, Any]:
        """meta.json's PPROBE_DUMP_DIRECT, the files written with O_DIRECT (None: the Python
        writer, which writes through the page cache), whether the folder's file system
        refused O_DIRECT (files written through the page cache from then on), and the dumps
        of 32 KiB and more whose copy went into a block the native writer kept (reused) or
        into a fresh one (None: the Python writer)."""
        if not isinstance(self.io, NativeQueue):
            return {
                "direct": self.direct,
                "direct_files": None,
                "direct_refused": False,
                "blocks_reused": None,
                "blocks_fresh": None,
            }
        _, ok, files = self.io.m.direct()
        _, _, reused, fresh = self.io.m.pool()
        return {
            "direct": self.direct,
            "direct_files": files,
            "direct_refused": not ok,
            "blocks_reused": reused,
            "blocks_fresh": fresh,
        }

    def summary(self) -> dict[str, Any]:
        # The budget is the run's: another process of the run may have used it up.
        exhausted = self.exhausted or os.path.exists(os.path.join(self.budget_dir, "exhausted"))
        queued, submitted, completed, files, links, failed, written = self.io.counters()
        return {
            "budget": self.budget,
            "bytes_written": written,
            "bytes_reserved": self.used,
            "files": files,
            "links": links,
            "skipped": self.skipped,
            "pending": submitted - completed,
            "failed_files": failed,
            "exhausted": exhausted,
            "failed": bool(self.errors),
            "writer": self.engine,
            "codec": self.codec,
            "content_hash": self.content_hash,
            **self._writer_summary(),
            **({} if self.ring is None else self.ring.summary()),
        }
