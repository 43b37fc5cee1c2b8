"""The record format: the one place that defines what a recorded call looks like in memory.

Both engines (the native core, :mod:`pprobe._native`, and its pure-Python twin in
:mod:`pprobe.recorder`) append the same fixed-size records to a :class:`Buffer`; the writer
turns a whole buffer into Arrow columns at once (:mod:`pprobe.writer`), with no Python work per
row for the fixed fields.

A call is one **op record** (:data:`OP`) followed by its ``n_descs`` **desc records**
(:data:`DESC`), one per array input or output. Names and texts are not in the records:

* short, repeated texts (op status, module path, phase, role, idx, dtype, device) are small ints
  into the process-wide table :data:`strings` (:func:`sid` interns one);
* values that are rare or unique per call (the ``args`` pairs, a dump path, a note, a shape
  past :data:`MAX_INLINE_DIMS` dimensions, a :class:`pprobe.values.Lazy`) are Python objects
  kept beside the records, referred to by index (-1: none). Within an appended row the indices
  are relative to that row's objects; :meth:`Buffer.take` hands them out absolute.

Records hold no Python object and no cached small int (-5..256): before Python 3.12 those are
shared, refcounted objects, and NumPy's own tests count their references around a call.
"""

from __future__ import annotations

import math
import queue
import struct
import threading
import time
from collections import deque
from typing import Any

#: Dimensions kept inline in a desc record; a deeper shape goes to the objects (packed bytes).
MAX_INLINE_DIMS = 8

#: (name, struct code) of the op record's fields, in order.
OP_FIELDS = (
    ("seq", "q"), ("t0", "q"), ("t1", "q"), ("thread", "Q"), ("step", "q"), ("parent", "q"),
    ("op", "i"), ("site", "i"), ("depth", "i"), ("status", "i"), ("module", "i"),
    ("phase", "i"), ("n_descs", "i"), ("args", "i"),
)  # fmt: skip
#: (name, struct code) of the desc record's fields. ``stats``: -2 none, -1 inline (min, max,
#: mean, std: NaN where null; nan/inf counts: -1 where null), >= 0 an object (a Lazy giving
#: the 6-tuple). ``grad``: -1 null, 0, 1. ``ndim`` <= MAX_INLINE_DIMS: ``shape`` holds the
#: dimensions; otherwise ``shape_ref`` is an object (bytes of native int64s).
DESC_FIELDS = (
    ("seq", "q"), ("min", "d"), ("max", "d"), ("mean", "d"), ("std", "d"), ("nan", "q"),
    ("inf", "q"), *((f"d{i}", "q") for i in range(MAX_INLINE_DIMS)),
    ("role", "i"), ("idx", "i"), ("ndim", "i"), ("dtype", "i"), ("device", "i"),
    ("grad", "i"), ("stats", "i"), ("path", "i"), ("note", "i"), ("shape_ref", "i"),
)  # fmt: skip
OP_STRUCT = struct.Struct("=" + "".join(c for _, c in OP_FIELDS))
DESC_STRUCT = struct.Struct("=" + "".join(c for _, c in DESC_FIELDS))
OP_SIZE = OP_STRUCT.size  # 80
DESC_SIZE = DESC_STRUCT.size  # 160
#: Fields that hold an object index (rebased by Buffer.take).
OP_OBJ_FIELDS = ("args",)
DESC_OBJ_FIELDS = ("stats", "path", "note", "shape_ref")


def _layout(fields: tuple) -> dict[str, tuple[int, str]]:
    """name -> (byte offset in the record, struct code) of a record's fields."""
    out, off = {}, 0
    for name, code in fields:
        out[name] = (off, code)
        off += struct.calcsize("=" + code)
    return out


#: Where each field of an op / desc record is: (byte offset, struct code), for the native
#: core's column passes (pprobe.writer's record_columns specs).
OP_AT = _layout(OP_FIELDS)
DESC_AT = _layout(DESC_FIELDS)

STATS_NONE = -2
STATS_INLINE = -1


_dtypes: tuple[Any, Any] | None = None


def numpy_dtypes() -> tuple[Any, Any]:
    """The records as NumPy structured dtypes (the writer's view of a buffer), made once."""
    global _dtypes
    if _dtypes is None:
        import numpy as np

        op, desc = (np.dtype([(n, "=" + c) for n, c in f]) for f in (OP_FIELDS, DESC_FIELDS))
        assert op.itemsize == OP_SIZE and desc.itemsize == DESC_SIZE
        _dtypes = (op, desc)
    return _dtypes


# ---------------------------------------------------------------------- strings
#: Interned texts; ids are indices. The first ones are fixed (the native core relies on them).
strings: list[str] = []
_ids: dict[str, int] = {}
_lock = threading.Lock()


def sid(s: str) -> int:
    """The id of ``s`` in :data:`strings` (interned on first use)."""
    i = _ids.get(s)
    if i is None:
        with _lock:
            i = _ids.get(s)
            if i is None:
                i = len(strings)
                strings.append(s)
                _ids[s] = i
    return i


def sid_or_none(s: str | None) -> int:
    return -1 if s is None else sid(s)


S_OK, S_INPUT, S_OUTPUT, S_CPU = (sid(s) for s in ("ok", "input", "output", "cpu"))
#: ids of "0".."63" (argument and output positions) are S_IDX0 + i
S_IDX0 = len(strings)
for _i in range(64):
    sid(str(_i))
S_FORWARD, S_BACKWARD = sid("forward"), sid("backward")

# ---------------------------------------------------------------------- encoding (Python side)
_pack_op = OP_STRUCT.pack
_pack_desc = DESC_STRUCT.pack
_NAN = float("nan")
_NO_DIMS = (0,) * MAX_INLINE_DIMS
_PAD = tuple((0,) * k for k in range(MAX_INLINE_DIMS + 1))


_INT64 = struct.Struct("=q")
_pack_seq = _INT64.pack
_t0_of = _INT64.unpack_from  # (at _T0_AT: an op record's t0)
_T0_AT = OP_AT["t0"][0]
pack_seq = _pack_seq  # a desc record's seq field (its first 8 bytes)
_pack_rest = struct.Struct("=" + "".join(c for _, c in DESC_FIELDS[1:])).pack
_unpack_dims = tuple(struct.Struct(f"={k}q").unpack for k in range(MAX_INLINE_DIMS + 1))
#: (role, idx, shape, dtype, device, grad) -> the record past its seq, for descriptions with no
#: statistics, dump or note (log mode: the same few shapes over and over)
_light: dict[tuple, bytes] = {}


def encode_descs(seq: int, descs: list, objs: list) -> bytes:
    """Desc tuples (values.Desc: role, idx, packed shape, dtype, device, requires_grad, stats,
    dump path, note) as desc records; objects go to ``objs`` (indices relative to it)."""
    out = []
    s = _pack_seq(seq)
    for d in descs:
        role, idx, shape, dtype, device, grad, st, path, note = d
        if st is None and path is None and note is None and shape.__class__ is bytes:
            key = d[:6]
            rest = _light.get(key)
            if rest is None and len(shape) <= MAX_INLINE_DIMS * 8:
                if len(_light) > 65536:
                    _light.clear()
                rest = _light[key] = _encode_rest(d, [])
            if rest is not None:
                out.append(s + rest)
                continue
        out.append(s + _encode_rest(d, objs))
    return b"".join(out)


def _encode_rest(d: tuple, objs: list) -> bytes:
    role, idx, shape, dtype, device, grad, st, path, note = d
    if shape.__class__ is not bytes:
        from .values import pack_shape

        shape = pack_shape(shape)
    ndim = len(shape) >> 3
    if ndim <= MAX_INLINE_DIMS:
        dims = _unpack_dims[ndim](shape) + _PAD[MAX_INLINE_DIMS - ndim]
        shape_ref = -1
    else:
        dims = _NO_DIMS
        shape_ref = len(objs)
        objs.append(shape)
    if st is None:
        stats = STATS_NONE
        mn = mx = mean = std = _NAN
        nan = inf = -1
    elif st.__class__ is tuple:
        stats = STATS_INLINE
        mn, mx, mean, std, n, i = st
        mn = _NAN if mn is None else mn
        mx = _NAN if mx is None else mx
        mean = _NAN if mean is None else mean
        std = _NAN if std is None else std
        nan = -1 if n is None else int(n)
        inf = -1 if i is None else int(i)
    else:  # a Lazy
        stats = len(objs)
        objs.append(st)
        mn = mx = mean = std = _NAN
        nan = inf = -1
    if path is None:
        p = -1
    else:
        p = len(objs)
        objs.append(path)
    if note is None:
        nt = -1
    else:
        nt = len(objs)
        objs.append(note)
    return _pack_rest(
        mn, mx, mean, std, nan, inf, *dims,
        sid(role), sid(idx), ndim, -1 if dtype is None else sid(str(dtype)),
        -1 if device is None else sid(device), -1 if grad is None else int(grad),
        stats, p, nt, shape_ref,
    )  # fmt: skip


def encode_row(
    seq: int,
    op: int,
    t0: int,
    t1: int,
    thread: int,
    step: int,
    depth: int,
    parent: int,
    site: int,
    status: str,
    module: str | None,
    phase: str | None,
    descs: list,
    others: list,
) -> tuple[bytes, bytes, tuple | None]:
    """One call as (op record, desc records, objects or None): what Buffer.append takes."""
    objs: list = []
    if others:
        objs.append(tuple(others))
        args = 0
    else:
        args = -1
    d = encode_descs(seq, descs, objs) if descs else b""
    head = _pack_op(seq, t0, t1, thread, step, parent, op, site, depth, sid(status),
                    sid_or_none(module), sid_or_none(phase), len(descs), args)  # fmt: skip
    return head, d, (tuple(objs) if objs else None)


# ---------------------------------------------------------------------- the Python buffer
FULL_WAIT_MAX_S = 60.0  # a recording thread waits at most this long for room, then drops


#: Rows are cut in units of this many bytes: an op record is OP_SIZE // _UNIT of them, a desc
#: record DESC_SIZE // _UNIT.
_UNIT = math.gcd(OP_SIZE, DESC_SIZE)


class _Scratch:
    """The memory :func:`_split` cuts rows in, kept from one flush to the next (the native
    buffer's recycled bytearrays' twin). A flush's rows are megabytes; allocated anew each
    time they came from fresh mmap()ed pages (glibc maps blocks past its threshold, and a
    writer thread's arena gives its free pages back), and the writer paid their first touch:
    ~0.22 page faults a row on an ``np.add`` loop, ~0.002 with the memory kept."""

    __slots__ = ("joined", "spare")

    def __init__(self) -> None:
        import io

        self.joined = io.BytesIO()  # rows joined (seek(0) + writelines: its buffer stays)
        self.spare: Any = None  # (op units, desc units) of a written batch (Buffer.recycle)


def _unit_dtype() -> Any:
    import numpy as np

    return np.dtype((np.void, _UNIT))


#: A scratch bigger than this is not kept past its flush (a burst of huge rows).
_SCRATCH_KEEP = 64 << 20


def _split(rows: list, n: int, scratch: _Scratch) -> tuple[Any, Any]:
    """(op records, desc records) of ``n`` rows that are all ``bytes`` (an op record, then its
    desc records): one join, then NumPy gathers of the joined rows' ``_UNIT``-byte units (a
    row's first units are its op record). Slicing each row into two ``bytes`` and joining
    those cost ~4 times as much, most of it in the ~16,000 tails allocated and freed a flush.
    Arrays are returned: the writer reads them through the buffer protocol. The join and the
    two arrays reuse ``scratch``'s memory where it is large enough."""
    import numpy as np

    unit = _unit_dtype()
    sizes = np.fromiter(map(len, rows), np.intp, n)
    sizes //= _UNIT
    begins = np.cumsum(sizes) - sizes  # each row's first unit
    head_at = (begins[:, None] + np.arange(OP_SIZE // _UNIT)).ravel()  # its op record's units
    total = int(begins[-1] + sizes[-1]) if n else 0
    keep = np.ones(total, dtype=bool)
    keep[head_at] = False
    j = scratch.joined
    j.seek(0)
    j.writelines(rows)
    spare, scratch.spare = scratch.spare, None
    nh, nd = len(head_at), total - len(head_at)
    if spare is not None and len(spare[0]) >= nh and len(spare[1]) >= nd:
        h, d = spare[0][:nh], spare[1][:nd]
    else:  # room for a few more rows than this flush's, next time
        h, d = np.empty(nh + nh // 4, unit)[:nh], np.empty(nd + nd // 4, unit)[:nd]
    desc_at = np.flatnonzero(keep)
    mv = j.getbuffer()
    try:
        # mode="clip": the indices are in range by construction; "raise" with ``out`` copies
        # through a temporary (~2.5 times as long here)
        units = np.frombuffer(mv, dtype=unit, count=total)
        np.take(units, head_at, axis=0, out=h, mode="clip")
        np.take(units, desc_at, axis=0, out=d, mode="clip")
        del units
    finally:
        try:
            mv.release()  # the export ends: the next writelines may grow the buffer
        except BufferError:  # an exception left ``units`` in its traceback: start anew
            scratch.joined = type(j)()
    if j.tell() > _SCRATCH_KEEP:
        scratch.joined = type(j)()
    return h, d


#: The longest a recording thread waits for the writer's flush at a time (Buffer.park; the
#: native core's PARK_MAX_NS): a flush of PPROBE_FLUSH_ROWS rows takes a few milliseconds.
PARK_MAX_S = 0.01


class Buffer:
    """Rows waiting for the writer (the Python engine's; the native core has its own with the
    same methods). ``deque.append``/``popleft`` are atomic: threads never lose a row.

    A row without objects is one ``bytes``, its op record then its desc records; a row with
    objects is a tuple (op record, desc records, objects). Bytes are not tracked by Python's
    cyclic collector: a tuple held until the writer's flush raised the collector's count of
    young objects by one a row, so a loop that allocates nothing of its own ran young
    collections (and, its rows promoted, full ones) only because of the probe.

    The flush window's synchronisation is safe against an exception raised asynchronously on
    a recording thread (a signal handler's KeyboardInterrupt lands at any bytecode): those
    threads make single C calls only (``SimpleQueue.put``, ``Lock.acquire``/``release``),
    never a ``threading.Event`` or ``Condition`` method, whose Python code holds a lock
    between bytecodes (an exception there left it held, and the writer hung on it)."""

    def __init__(self) -> None:
        self._q: deque = deque()
        self.queue = self._q  # (the Python engine's fast path appends here while there is room)
        self.max_rows = 0  # back-pressure (limit()): 0, no limit
        self.drop = False
        self.writer_alive = False
        self.dropped = 0.0  # a float: no small int stays referenced (NumPy's tests count)
        self._local = threading.local()
        # The writer's flush window (the native buffer's twin, see pprobe/_native.c): while
        # ``flushing``, a thread that appends a row waits for the flush to end (at most
        # PARK_MAX_S a time) instead of contending for the GIL with the writer.
        self.flushing = False
        self._woken: queue.SimpleQueue = queue.SimpleQueue()  # wake()'s tokens
        self._gate = threading.Lock()  # held by the writer while its flush window is open
        self._parks: list[Any] = [0, 0, 0.0]  # waits, waits cut short, seconds waited
        self._scratch = _Scratch()  # take's memory, reused (recycle)

    def limit(self, max_rows: int, drop: bool, writer_alive: bool) -> None:
        """At most ``max_rows`` rows; when full, wait for the writer (``drop`` False, the
        writer alive) or drop the row and count it."""
        self.max_rows, self.drop, self.writer_alive = max_rows, drop, writer_alive

    def mark_writer(self, flag: bool) -> bool:
        """While set, a full buffer never makes the calling thread wait (the writer thread, or
        a thread while it flushes); returns the previous flag."""
        prev = getattr(self._local, "writer", False)
        self._local.writer = flag
        return prev

    def take_dropped(self) -> int:
        d, self.dropped = self.dropped, 0.0
        return int(d)

    def append(self, head: bytes, descs: bytes, objs: tuple | None) -> None:
        q = self._q
        if self.max_rows and len(q) >= self.max_rows and not self._full():
            return
        q.append(head + descs if objs is None else (head, descs, objs))
        if self.flushing:
            self.park()

    def park(self) -> None:
        """Wait for the writer's flush to end (the calling thread has just appended a row)."""
        if getattr(self._local, "writer", False):  # the writer thread itself never waits
            return
        t0 = time.monotonic()
        gate = self._gate
        cut = not gate.acquire(timeout=PARK_MAX_S)
        if not cut:
            try:
                gate.release()
            except RuntimeError:  # the writer took the gate back (_close_gate)
                pass
        p = self._parks
        p[0] += 1
        p[1] += cut
        p[2] += time.monotonic() - t0

    def wait(self, timeout: float) -> bool:
        """The writer thread's wait for its next flush: until :meth:`wake`, until the oldest
        buffered row is ``timeout`` seconds old (its op's start, ``t0``), or, with rows
        dropped, ``timeout`` seconds; an idle writer looks every ``timeout`` seconds. A burst
        of rows is written ``timeout`` after its first row, not at the next tick of a clock
        that started before it. Opens the flush window (``end_flush`` closes it). The native
        twin opens it before taking the GIL back; here the GIL is taken first."""
        ev = self._woken
        first = True
        seen = 0  # when a look first found rows: they are older, whatever their t0 says
        while True:
            left = timeout
            q = self._q
            if q:
                now = time.perf_counter_ns()
                seen = seen or now
                try:
                    r = q[0]
                    t0 = min(seen, _t0_of(r if type(r) is bytes else r[0], _T0_AT)[0])
                    left = (t0 - now) / 1e9 + timeout
                except Exception:  # (taken meanwhile, or no op record: due now)
                    left = 0
                if left <= 0:
                    woken = False
                    break
            elif self.dropped and not first:
                woken = False
                break
            first = False
            try:
                ev.get(timeout=left)
                woken = True
            except queue.Empty:
                woken = False
            while not ev.empty():  # the tokens of other wake() calls meanwhile
                try:
                    ev.get_nowait()
                except queue.Empty:
                    break
            if woken:
                break
        self._close_gate()
        self.flushing = True
        return woken

    def _close_gate(self) -> None:
        """The writer takes the gate (parked threads wait on it until end_flush). A thread
        holds it only between its acquire and release in park(); held longer, an exception
        cut that thread off in between: the gate is taken back from it (again, should another
        thread be cut off meanwhile)."""
        gate = self._gate
        while not gate.acquire(timeout=0.2):
            try:
                gate.release()
            except RuntimeError:
                pass

    def wake(self) -> None:
        self._woken.put(None)

    def end_flush(self) -> None:
        self.flushing = False
        try:
            self._gate.release()
        except RuntimeError:  # not taken (an end_flush without its wait, a forked child)
            pass

    def begin_flush(self) -> None:
        """The window opens again (closed for a wait of the writer's that needs no GIL)."""
        self._close_gate()
        self.flushing = True

    def parks(self) -> tuple[int, int, float]:
        """(waits, waits cut short by PARK_MAX_S, seconds waited) of the recording threads."""
        a, b, c = self._parks
        return a, b, c

    def after_fork(self) -> None:
        """In a forked child: no thread of the parent's is left to close the window."""
        self.flushing = False
        self._woken = queue.SimpleQueue()
        self._gate = threading.Lock()
        self._parks = [0, 0, 0.0]

    def _full(self) -> bool:
        """The buffer is full: True when there is room now, False: drop this row."""
        from . import recorder

        if getattr(self._local, "writer", False):  # the writer thread itself never waits
            return True
        if self.drop or not self.writer_alive:
            self.dropped += 1.0
            return False
        until = time.monotonic() + FULL_WAIT_MAX_S
        while len(self._q) >= self.max_rows:
            wake = recorder._wake
            if wake is not None:
                wake()
            time.sleep(0.0002)  # the GIL goes to the writer
            if self.drop or not self.writer_alive or time.monotonic() > until:
                self.dropped += 1.0
                return False
        return True

    def __len__(self) -> int:
        return len(self._q)

    def clear(self) -> None:
        self._q.clear()

    def recycle(self, heads: Any, descs: Any) -> None:
        """A written batch's memory given back: the next :meth:`take` cuts its rows into it
        (what :meth:`take` returned, the writer done with it)."""
        h, d = getattr(heads, "base", None), getattr(descs, "base", None)
        if h is None or d is None or h.nbytes + d.nbytes > _SCRATCH_KEEP:
            return
        self._scratch.spare = (h.view(_unit_dtype()), d.view(_unit_dtype()))

    def take(self) -> tuple[Any, Any, list, int]:
        """Every buffered row: (op records, desc records, objects, rows), indices absolute;
        the records as arrays, or bytes when there are no rows."""
        q = self._q
        n = len(q)
        if not n:
            return b"", b"", [], 0
        rows = [q.popleft() for _ in range(n)]
        if tuple not in set(map(type, rows)):  # no objects: C loops only
            heads, descs = _split(rows, n, self._scratch)
            return heads, descs, [], n
        # rows with objects: (op record, desc records, objects) tuples among the bytes
        heads, descs = _split(
            [r if r.__class__ is bytes else r[0] + r[1] for r in rows], n, self._scratch
        )
        objs: list = []
        counts = [0 if r.__class__ is bytes or r[2] is None else len(r[2]) for r in rows]
        if any(counts):
            import numpy as np

            op_dt, desc_dt = numpy_dtypes()
            ops = heads.view(op_dt)  # (arrays of _split's own: written in place)
            ds = descs.view(desc_dt)
            c = np.array(counts, dtype=np.int64)
            base = np.cumsum(c) - c
            for r in rows:
                if r.__class__ is not bytes and r[2] is not None:
                    objs.extend(r[2])
            rebase(ops, ds, base)
            heads, descs = ops, ds
        return heads, descs, objs, n


def rebase(ops: Any, ds: Any, base: Any) -> None:
    """Add each row's object base to its records' object indices (>= 0 only)."""
    import numpy as np

    for f in OP_OBJ_FIELDS:
        col = ops[f]
        np.add(col, base.astype(col.dtype), out=col, where=col >= 0)
    if len(ds):
        per = np.repeat(base, ops["n_descs"]).astype(np.int32)
        for f in DESC_OBJ_FIELDS:
            col = ds[f]
            np.add(col, per, out=col, where=col >= 0)
