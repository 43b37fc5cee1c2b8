"""Streaming the recorded rows to Arrow IPC stream files, one shard per process.

A daemon thread wakes every ``flush_seconds`` (or when the hot path has buffered
``flush_rows`` rows), drains :data:`pprobe.recorder.buffer`, builds one record batch per table
and appends it to ``log/tensors-{host}-{pid}.arrows`` then ``log/ops-{host}-{pid}.arrows``
(tensors first, so every visible op row has its tensor rows). Arrow's *stream* format is used
because a reader can read it up to the last complete batch after the writer was killed; the
*file* format is unreadable without its footer.

The columns are built with NumPy only (:mod:`pprobe.arrowipc` columns: buffers in Arrow's
layout) and encoded by pprobe's own IPC encoder: pyarrow is never imported into the program to
write its log (its import and first use cost more CPU than a short program's whole log). The
pyarrow writer stays where pyarrow is needed anyway (a collector's tap gets pyarrow batches)
and on request: ``PPROBE_LOG_WRITER`` (:meth:`Writer.log_writer`); it writes the same columns.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import threading
import time
from array import array
from time import perf_counter_ns
from typing import Any

from . import _report, core, logschema, recorder, records, safefs, state, values
from . import arrowipc as A  # light; never imported on the writer thread (see FORK_WAIT_S)
from .state import INTERNAL

#: The longest a fork waits for a flush in progress. A flush takes milliseconds, but the first
#: one imports modules (pyarrow with PPROBE_LOG_WRITER=pyarrow: 0.1-1 s on a loaded machine): a
#: child forked in the middle of an import would wait forever on importlib's lock on the
#: module, held by a thread it lacks.
FORK_WAIT_S = 5.0
SWITCH_S = 0.0002  # the GIL switch interval while the writer works


# ---------------------------------------------------------------------- fixed columns
#: record_columns' spec codes (pprobe/_native.c record_columns lists the specs).
(RC_COL, RC_REPEAT, RC_CONST, RC_NULLS, RC_ONE,
 RC_INT, RC_DIFF, RC_TAKE, RC_INDEX, RC_BOOL) = range(10)  # fmt: skip
#: name -> (name, byte offset, struct code) of the op and desc records' fields, as specs take them
_OPF = {k: (k, *v) for k, v in records.OP_AT.items()}
_DESCF = {k: (k, *v) for k, v in records.DESC_AT.items()}
#: (offset, struct code) of the fields the native core's field_ranges and missing_ids read
_OP_SIZE, _DESC_SIZE = records.OP_SIZE, records.DESC_SIZE
_THREAD_AT = (records.OP_AT["thread"],)
_OP_AT_OP = records.OP_AT["op"]
_UNNAMED = struct.pack("=q", -2)  # an op table's entry for an op not named yet
_NO_SITES = (array("q", [-1]), array("q", [-1]))  # the site table before any site
_ARGS_AT = records.OP_AT["args"][0]
_NDIM_AT, _D0_AT = records.DESC_AT["ndim"][0], records.DESC_AT["d0"][0]
#: the native core's desc_log_columns' fields, in its order
_DESC_LOG_AT = tuple(
    records.DESC_AT[f][0]
    for f in (
        "seq",
        "role",
        "idx",
        "ndim",
        "d0",
        "dtype",
        "device",
        "grad",
        "stats",
        "path",
        "note",
    )
)
_OBJECT_AT = tuple(records.DESC_AT[f] for f in ("stats", "path", "note"))
#: The tensors batch's columns past ``grad`` when no row has statistics, a dump or a note.
_NO_OBJECT_COLUMNS = (
    *((RC_NULLS, A.FLOAT64),) * 4,  # min, max, mean, std
    (RC_NULLS, A.INT64),  # nan
    (RC_NULLS, A.INT64),  # inf
    (RC_NULLS, A.UTF8),  # dump path
    (RC_NULLS, A.UTF8),  # note
    (RC_NULLS, A.UTF8),  # dump codec
    (RC_NULLS, A.FLOAT64),  # dump max abs error
    (RC_NULLS, A.INT64),  # dump bytes
)


def record_columns(np: Any, recs: Any, specs: list, itemsize: int = 0) -> list:
    """The columns ``specs`` describe (pprobe/_native.c record_columns), over ``recs``, a
    record buffer as a structured array: the native core's one call where it runs, else
    :func:`py_record_columns`, the same columns. With ``itemsize``, ``recs`` is the records'
    bytes, for the native core only (no structured array made)."""
    native = core.native
    if itemsize and native is not None:
        return native.record_columns(recs, itemsize, specs, A.Column, A.Const)  # type: ignore[no-any-return]
    if native is not None and len(recs):
        return native.record_columns(recs, recs.dtype.itemsize, specs, A.Column, A.Const)  # type: ignore[no-any-return]
    return py_record_columns(np, recs, specs)


def py_record_columns(np: Any, recs: Any, specs: list) -> list:
    """:func:`record_columns` with pprobe.arrowipc's functions, one spec at a time (the twin
    of the native core's record_columns)."""
    n = len(recs)
    out = []
    for spec in specs:
        code = spec[0]
        if code == RC_COL:
            c = spec[1]
        elif code == RC_REPEAT:
            c = A.repeat_bytes(np, spec[1], n)
        elif code == RC_CONST:
            c = A.const_ints(np, spec[2], A.INT32 if spec[1] == 4 else A.INT64, n)
        elif code == RC_NULLS:
            c = A.nulls(np, spec[1], n)
        elif code == RC_ONE:
            c = A.one_index(np, spec[1], n)
        elif code == RC_INT:
            v = recs[spec[1]]
            add, tp = spec[5], A.INT32 if spec[4] == 4 else A.INT64
            c = A.ints(np, v + add if add else v, tp, v >= 0 if spec[6] else None)
        elif code == RC_DIFF:
            c = A.ints(np, recs[spec[1]] - recs[spec[3]], A.INT64)
        elif code == RC_TAKE:
            c = A.dict_take(np, spec[4], recs[spec[1]], spec[5])
        elif code == RC_INDEX:
            c = A.dict_indices(np, recs[spec[1]])
        elif code == RC_BOOL:
            g = recs[spec[1]]
            c = A.bools(np, g == 1, g >= 0)
        else:
            raise ValueError(f"record_columns: an unknown spec code {code!r}")
        out.append(c)
    return out


class Writer:
    def __init__(
        self,
        run_dir: str,
        run_id: str,
        host: str,
        flush_rows: int,
        flush_seconds: float,
        folder: safefs.RunDir | None = None,
        buffer_rows: int = 0,
        drop: bool = False,
        log_writer: str = "auto",
    ) -> None:
        self.run_dir = run_dir
        self.folder = folder  # the run folder, held open (pprobe.safefs)
        self.log: safefs.RunDir | None = None
        self.log_dir = os.path.join(run_dir, "log")
        self.run_id = run_id
        self.host = re.sub(r"[^A-Za-z0-9._-]", "_", host)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.rows_written = 0
        self.rows_dropped = 0
        self.batches = 0
        self.failed = False
        self.buffer_rows = buffer_rows
        self.drop = drop
        self.log_writer_setting = log_writer  # PPROBE_LOG_WRITER: auto | pprobe | pyarrow
        #: pprobe.collect.client.Forwarder.submit when PPROBE_COLLECTOR is set: each batch is
        #: handed to it on this writer's thread; ``keep_local`` False writes no local shard.
        self.tap: Any = None
        self.keep_local = True
        self._init_process()

    def _init_process(self) -> None:
        self.pid = os.getpid()
        self.epoch0 = time.time_ns() - perf_counter_ns()
        self.lock = threading.Lock()
        self.stopping = False
        self.fork_pending = False
        self._window: Any = None  # the buffer whose flush window this thread holds open
        self._fork_locked = False
        self.sinks: dict[str, Any] = {}
        self.thread: threading.Thread | None = None
        #: the shards' schema custom_metadata
        self.meta = {
            "pprobe.schema_version": logschema.SCHEMA_VERSION,
            "run_id": self.run_id,
            "pid": str(self.pid),
            "host": self.host,
        }
        self._strings = _Strings()
        self._ops_sids: tuple | None = None
        self._sites_sids: tuple = (array("q"), array("q"))
        self._stacks_done = 0  # stacks (recorder.stack_inner) written to this process's shard
        self._args_cache: dict[Any, bytes] = {}
        self._args_ids: dict[int, tuple] = {}  # id(set) -> (set, text): native.arg_column
        self._failed_dumps: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._limit(alive=True)
        self.thread = threading.Thread(target=self._loop, name="pprobe-writer", daemon=True)
        self.thread.start()

    def _limit(self, alive: bool) -> None:
        """Back-pressure on the record buffer (PPROBE_BUFFER_ROWS / PPROBE_BUFFER_FULL): while
        this writer is alive a full buffer makes the recording thread wait for it; otherwise
        (failed, closed) rows are dropped and counted, so memory never grows without bound."""
        try:
            recorder.buffer.limit(self.buffer_rows, self.drop, alive and not self.failed)
        except Exception as e:
            _report.internal_error("bounding the record buffer", e)

    def wake(self) -> None:
        recorder.buffer.wake()

    def _loop(self) -> None:
        state.local.depth = INTERNAL  # this thread's own NumPy work is never recorded
        try:
            recorder.buffer.mark_writer(True)
        except Exception as e:
            _report.internal_error("bounding the record buffer", e)
        try:
            while not self.stopping:
                buf = recorder.buffer
                # The wait opens the flush window: until end_flush(), the threads that record a
                # row wait for this flush instead of contending with it for the GIL
                # (records.Buffer.wait, pprobe/_native.c "the writer's flush window").
                buf.wait(self.flush_seconds)
                self._window = buf
                try:
                    if not self.stopping:
                        self.flush()
                finally:
                    self._window = None
                    buf.end_flush()
        except BaseException as e:  # the writer thread must not die silently
            self.failed = True
            self._limit(alive=False)
            _report.internal_error("the writer thread", e)

    def close(self) -> None:
        self._limit(alive=False)  # recording threads must not wait for a writer that stops
        self.stopping = True
        self.wake()
        t = self.thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=10)
        self.flush()
        with self.lock:
            for sink in self.sinks.values():
                try:
                    sink.close()
                except Exception:
                    pass
            self.sinks.clear()
            if self.log is not None:
                self.log.close()

    def before_fork(self) -> None:
        """Wait for a flush in progress (the child must not inherit a shard mid-write), at most
        FORK_WAIT_S: no new flush starts while a fork is pending, so the forking thread is not
        starved by a writer that takes the lock back to back."""
        self.fork_pending = True
        self._fork_locked = self.lock.acquire(timeout=FORK_WAIT_S)

    def after_fork_parent(self) -> None:
        self.fork_pending = False
        if self._fork_locked:
            self._fork_locked = False
            self.lock.release()

    def after_fork_child(self) -> None:
        """A forked child writes its own shard with its own thread; the parent's are not ours."""
        for sink in self.sinks.values():
            try:
                sink.abandon()  # the child's copy of the descriptor (the parent's stays open)
            except Exception:
                pass
        self.rows_written = self.batches = 0
        self._init_process()
        self.start()

    # ------------------------------------------------------------------ writing
    def flush(self) -> None:
        """Write every buffered row. Never raises."""
        if self.fork_pending:
            return
        # While the writer works, other threads hand the GIL over sooner: each step of the
        # writer that releases it (a file write, an import) would otherwise wait a whole switch
        # interval (5 ms) for a program thread that runs pure Python to give it back.
        old = sys.getswitchinterval()
        fast = old > SWITCH_S
        if fast:
            sys.setswitchinterval(SWITCH_S)
        try:
            self._flush()
        finally:
            if fast and sys.getswitchinterval() == SWITCH_S:
                sys.setswitchinterval(old)

    def _flush(self) -> None:
        with state.internal(), self.lock:
            buf = recorder.buffer
            if self.failed:
                buf.clear()
                return
            dropped = buf.take_dropped()
            if dropped:
                self.rows_dropped += dropped
                prev = buf.mark_writer(True)  # the note is never refused
                try:
                    recorder.note_dropped(dropped)
                finally:
                    buf.mark_writer(prev)
                _report.warn_once(
                    "rows-dropped",
                    "the record buffer was full: rows were dropped (PPROBE_BUFFER_FULL=drop); "
                    "meta.json and pprobe.rows_dropped rows count them.",
                )
            if not len(buf):
                return
            heads, descs, objs, n = buf.take()
            if not n:
                return
            try:
                # The rows may point to dumps still queued: wait until they are on disk, so
                # that a row in the log never points to a file that is not (yet) there.
                dumper = recorder._dumper
                self._failed_dumps = self._barrier(dumper) if dumper is not None else {}
                ops, tensors = self._to_batches(heads, descs, objs, n)
                stacks = self._stacks_batch()
                if stacks is not None:  # before the ops rows that name them
                    self._write("stacks", stacks)
                self._write("tensors", tensors)
                self._write("ops", ops)
                self.rows_written += n
                self.batches += 1
            except Exception as e:
                self.failed = True
                self._limit(alive=False)
                _report.internal_error("writing the log", e)
            ops = tensors = None
            try:
                # the memory of the next batches (no page faults). Not the Python buffer's
                # while a tap is set: a batch it took may wait in the collector's queue, and a
                # one-row column is a view of these records (the native buffer reuses only a
                # block nothing else exports).
                if self.tap is None or not isinstance(buf, records.Buffer):
                    buf.recycle(heads, descs)
            except Exception as e:
                _report.internal_error("recycling the record buffer", e)

    def _barrier(self, dumper: Any) -> dict:
        """dumper.barrier() (wait until the queued dumps are on disk) with the flush window
        closed: the program's threads go on while the dump writer writes, which can take
        long (big arrays); the window opens again before the rest of the flush."""
        window = self._window
        if window is None:
            return dumper.barrier()  # type: ignore[no-any-return]
        window.end_flush()
        try:
            return dumper.barrier()  # type: ignore[no-any-return]
        finally:
            window.begin_flush()

    def log_writer(self) -> tuple[str, str]:
        """(who encodes this process's shards, why): ``pprobe`` (:mod:`pprobe.arrowipc`) or
        ``pyarrow``. auto means pprobe's encoder, unless a collector's tap is set: the tap
        takes pyarrow batches, so pyarrow is in the process anyway and its LZ4 shards are
        smaller."""
        setting = self.log_writer_setting
        if setting in ("pprobe", "pyarrow"):
            return setting, f"PPROBE_LOG_WRITER={setting}"
        if self.tap is not None:
            return "pyarrow", "auto: a collector's tap (PPROBE_COLLECTOR) takes pyarrow batches"
        return "pprobe", "auto"

    def facts(self) -> dict[str, Any]:
        """What meta.json's ``core`` says about the log's writer, and what its flushes cost
        the recording threads: ``flush_waits`` (how many times one waited for a flush, how
        many of those waits were cut short at records.PARK_MAX_S, the seconds waited)."""
        name, why = self.log_writer()
        out: dict[str, Any] = {"log_writer": name, "log_writer_reason": why}
        try:
            waits, cut, secs = recorder.buffer.parks()
            out["flush_waits"] = {"waits": waits, "cut_short": cut, "seconds": round(secs, 6)}
        except Exception as e:
            _report.internal_error("reading the flush window's count", e)
        return out

    def _write(self, table: str, batch: Any) -> None:
        """Hand ``batch`` (an arrowipc.Batch) to the tap and append it to the table's shard."""
        tap = self.tap
        if tap is not None:
            from .arrowipc import to_pyarrow

            tap(table, to_pyarrow(batch, self.meta))  # never raises (collect.client.Forwarder)
            if not self.keep_local:
                return
        if batch.num_rows == 0 and table in self.sinks:
            return
        sink = self.sinks.get(table)
        if sink is None:
            if self.log is None:
                folder = self.folder or safefs.RunDir.open(self.run_dir)
                self.log = folder.subdir("log")
            name = f"{table}-{self.host}-{self.pid}.arrows"
            if self.log_writer()[0] == "pyarrow":
                sink = _PyarrowSink(self.log, name, batch.fields, self.meta)
            else:
                from .arrowipc import StreamWriter

                sink = StreamWriter(self.log.create(name), batch.fields, self.meta)
            self.sinks[table] = sink
        sink.write_batch(batch)

    def _to_batches(self, heads: bytes, descs: bytes, objs: list, n: int) -> tuple[Any, Any]:
        """Records (pprobe.records) -> (ops, tensors) record batches (arrowipc.Batch), column
        by column, with NumPy and the native core's passes only.

        Fixed fields go from the record buffers to Arrow's layout in one call per batch
        (:func:`record_columns`, from a list of specs: the native core's record_columns, or
        arrowipc's functions over NumPy views); names are ids into records.strings, written
        as dictionary indices (arrowipc.dict_indices: the shard's dictionary is
        :class:`_Strings`' items). Only the rare
        per-call objects (args, dump paths, notes, deep shapes) are looked at one by one.
        Nothing here builds a list of Python ints per row (NumPy's tests count small-int
        references) or imports a module the program did not import (pyarrow among them)."""
        import numpy as np

        native = core.native
        # The native core's passes read the records as they are (bytes): no structured array
        # (its dtypes cost the first flush ~0.1-0.3 ms), no view of a field, on that path.
        ops: Any = None if native is not None else np.frombuffer(heads, records.numpy_dtypes()[0])
        strs = self._strings
        # Per op index and per call site: string ids, named as ops and sites appear.
        op_ids = self._op_table(np, heads, ops)
        site_ids = self._site_table(np)
        if native is None:  # NumPy's fancy indexing (arrowipc.dict_take) takes arrays
            op_ids = tuple(np.frombuffer(c, np.int64) for c in op_ids)
            site_ids = tuple(np.frombuffer(c, np.int64) for c in site_ids)
        # Thread names: per distinct thread serial (state.thread_names).
        thr_inv: Any = None  # (one thread: every row's is thread_sids[0])
        if native is not None and n:  # one pass in C, no NumPy call: one thread?
            lo, hi = native.field_ranges(heads, _OP_SIZE, _THREAD_AT)[0]
            thr_l = [lo] if lo == hi else None
        else:
            threads = ops["thread"]
            thr_l = threads[:1].tolist() if n and (threads == threads[0]).all() else None
        if thr_l is None:  # several threads: a sort
            if ops is None:
                ops = np.frombuffer(heads, records.numpy_dtypes()[0])
            thr_u, thr_inv = np.unique(ops["thread"], return_inverse=True)
            thr_l = thr_u.tolist()
        names = [state.thread_names.get(t) or str(t) for t in thr_l]
        thread_sids = [records.sid(s) for s in names]
        # a copy in one call: an exported buffer would stop the recording thread's appends
        first: Any = recorder.stack_site.tobytes() or bytes(8)
        if native is not None:  # the args field as a strided int32 view of the bytes
            first = memoryview(first).cast("q")
            refs: Any = memoryview(heads).cast("B").cast("i")[_ARGS_AT // 4 :: _OP_SIZE // 4]
        else:
            first = np.frombuffer(first, dtype=np.int64)
            refs = ops["args"]
        args = self._args(np, refs, objs)
        strs.refresh()
        one_thread = len(thread_sids) == 1
        # the op record's "site" field holds its call stack's id (recorder.stack_*): the
        # stack's first frame is the call site
        ops_specs = [
            (RC_REPEAT, self.run_id.encode("utf-8", "replace")),
            (RC_REPEAT, self.host.encode("utf-8", "replace")),
            (RC_CONST, 8, self.pid),
            (RC_CONST, 4, state.rank),
            (RC_CONST, 4, state.world_size),
            (RC_INT, *_OPF["seq"], 8, 0, False),
            (RC_ONE, thread_sids[0]) if one_thread
            else (RC_COL, A.dict_take(np, np.array(thread_sids, np.int64), thr_inv.reshape(-1))),
            (RC_INT, *_OPF["t0"], 8, self.epoch0, False),
            (RC_DIFF, *_OPF["t1"][:2], *_OPF["t0"][:2]),
            (RC_TAKE, *_OPF["op"], op_ids[0], None),
            (RC_TAKE, *_OPF["op"], op_ids[1], None),
            (RC_TAKE, *_OPF["op"], op_ids[2], None),
            (RC_TAKE, *_OPF["op"], op_ids[3], None),
            (RC_INDEX, *_OPF["status"]),
            (RC_TAKE, *_OPF["site"], site_ids[0], first),
            (RC_TAKE, *_OPF["site"], site_ids[1], first),
            (RC_INDEX, *_OPF["module"]),
            (RC_INDEX, *_OPF["phase"]),
            (RC_INT, *_OPF["step"], 8, 0, False),
            (RC_INT, *_OPF["depth"], 4, 0, False),
            (RC_INT, *_OPF["parent"], 8, 0, True),
            (RC_COL, args),
            (RC_INT, *_OPF["site"], 8, 0, True),  # the stack id (null: no site)
        ]  # fmt: skip
        if native is not None and ops is None and n:
            ops_cols = record_columns(np, heads, ops_specs, _OP_SIZE)
        else:
            if ops is None:
                ops = np.frombuffer(heads, records.numpy_dtypes()[0])
            ops_cols = record_columns(np, ops, ops_specs)
        ops_batch = A.Batch(logschema.OPS, n, ops_cols, strs.items)
        m = memoryview(descs).nbytes // _DESC_SIZE
        # the desc records as a structured array: where NumPy reads them (the Python engine,
        # no desc record, statistics, dumps, notes, deep shapes)
        ds: Any = (
            None if native is not None and m else np.frombuffer(descs, records.numpy_dtypes()[1])
        )
        obj_cols: Any = _NO_OBJECT_COLUMNS  # log mode: no statistics, dump or note
        fused: Any = None  # the record columns and the checks in one pass (None: a deep shape)
        if native is not None and ds is None:
            fused = _desc_columns(native, descs)
        if m:
            if fused is not None:
                stats_max, path_max, note_max = fused[7]
            elif native is not None:  # one pass in C each, no NumPy call
                stats_max, path_max, note_max = (
                    hi for _, hi in native.field_ranges(descs, _DESC_SIZE, _OBJECT_AT)
                )
            else:
                stats_max = ds["stats"].max()
                path_max, note_max = (ds["path"].max(), ds["note"].max()) if objs else (-1, -1)
            if (
                stats_max != records.STATS_NONE  # statistics (inline, or on a device)
                or (objs and max(path_max, note_max) >= 0)  # dumps, notes
            ):
                fused = None  # (the general path below)
                if ds is None:
                    ds = np.frombuffer(descs, records.numpy_dtypes()[1])
                obj_cols = self._object_columns(np, ds, objs, ds["stats"])
        head = [(RC_REPEAT, self.run_id.encode("utf-8", "replace")), (RC_CONST, 8, self.pid)]
        if native is not None and fused is not None:  # log mode's columns, made above
            cols = record_columns(np, descs, [*head, *obj_cols], _DESC_SIZE)
            offsets, values = fused[3]
            shape_col = A.Column(
                m, 0, [None, offsets], A.Column(len(values) // 8, 0, [None, values])
            )
            t_cols = [*cols[:2], *fused[:3], shape_col, *fused[4:7], *cols[2:]]
            return ops_batch, A.Batch(logschema.TENSORS, m, t_cols, strs.items)
        shapes, ds = _shapes(np, A, descs, m, objs, ds)
        t_specs = [
            *head,
            (RC_INT, *_DESCF["seq"], 8, 0, False),
            (RC_INDEX, *_DESCF["role"]),
            (RC_INDEX, *_DESCF["idx"]),
            (RC_COL, shapes),
            (RC_INDEX, *_DESCF["dtype"]),
            (RC_INDEX, *_DESCF["device"]),
            (RC_BOOL, *_DESCF["grad"]),
            *obj_cols,
        ]
        if native is not None and ds is None:
            t_cols = record_columns(np, descs, t_specs, _DESC_SIZE)
        else:
            t_cols = record_columns(np, ds, t_specs)
        return ops_batch, A.Batch(logschema.TENSORS, m, t_cols, strs.items)

    def _object_columns(self, np: Any, ds: Any, objs: list, stats_kind: Any) -> list:
        """The tensors batch's columns past ``grad`` (statistics, dump path, note, dump codec)
        as record_columns specs: from the desc records and the per-row objects they point to
        (statistics still on a device, dump paths, notes)."""
        m = len(ds)
        cols = {f: ds[f] for f in ("min", "max", "mean", "std", "nan", "inf")}
        paths: list = [None] * m
        notes: list = [None] * m
        lazy = np.flatnonzero(stats_kind >= 0).tolist()
        if lazy:
            cols = {f: c.copy() for f, c in cols.items()}
        for d in lazy:  # values.Lazy: device statistics
            st = values.resolve(objs[int(stats_kind[d])], "device statistics")
            if st is not None and st.__class__ is tuple:
                for f, v in zip(("min", "max", "mean", "std"), st[:4]):
                    cols[f][d] = np.nan if v is None else v
                cols["nan"][d] = -1 if st[4] is None else st[4]
                cols["inf"][d] = -1 if st[5] is None else st[5]
            elif isinstance(st, str):
                notes[d] = st
        path_ref, note_ref = ds["path"], ds["note"]
        with_note = np.flatnonzero(note_ref >= 0)
        got = list(map(objs.__getitem__, note_ref[with_note].tolist()))
        if not lazy and got:  # (device statistics' notes are already in notes)
            notes = _placed(np, m, with_note, got)
        else:
            for d, note in zip(with_note.tolist(), got):
                notes[d] = note
        with_path_a = np.flatnonzero(path_ref >= 0)
        with_path = with_path_a.tolist()
        has_path = path_ref >= 0
        got = list(map(objs.__getitem__, path_ref[with_path_a].tolist()))
        queued = False
        if got and set(map(type, got)) == {str}:  # dumps written on the program's thread
            paths = _placed(np, m, with_path_a, got)
        else:
            for d, p in zip(with_path, got):
                if p.__class__ is not str:  # values.Lazy: a dump still being copied off a device
                    p, note2 = values.resolve(p, "deferred dump") or (None, "not dumped")
                    notes[d] = note2 or notes[d]
                    queued = queued or p is not None
                    has_path[d] = p is not None
                paths[d] = p
        # Dumps resolved just now were queued after the flush's wait: wait once more for them.
        dumper = recorder._dumper
        failed = self._barrier(dumper) if queued and dumper is not None else self._failed_dumps
        if failed:
            for d in with_path:
                if paths[d] in failed:  # the dump writer could not write it
                    notes[d] = failed[paths[d]]
                    paths[d] = None
                    has_path[d] = False
        codec_cols = self._codec_columns(np, A, dumper, paths, with_path, has_path, m)
        has_stats = stats_kind != records.STATS_NONE
        if has_stats.any():
            stat_cols = [_stat_floats(np, A, cols[f], has_stats) for f in _STAT_FLOATS]
            stat_cols += [A.ints(np, cols[f], A.INT64, cols[f] >= 0) for f in ("nan", "inf")]
        else:  # log mode: no statistics in the batch
            stat_cols = [A.nulls(np, A.FLOAT64, m) for _ in _STAT_FLOATS]
            stat_cols += [A.nulls(np, A.INT64, m), A.nulls(np, A.INT64, m)]
        return [
            *((RC_COL, c) for c in stat_cols),
            (RC_COL, _str_column(np, paths)),
            (RC_COL, _str_column(np, notes)),
            *((RC_COL, c) for c in codec_cols),
        ]

    def _codec_columns(
        self, np: Any, A: Any, dumper: Any, paths: list, with_path: list, has_path: Any, m: int
    ) -> tuple:
        """dump_codec, dump_max_abs_error, dump_bytes of the rows that point to a dump (the
        dump writer has written them: barrier). ``has_path``: the rows whose path is set."""
        if not with_path or not has_path.any():  # no dump in the batch (log and stats modes)
            return A.nulls(np, A.UTF8, m), A.nulls(np, A.FLOAT64, m), A.nulls(np, A.INT64, m)
        if dumper is not None and dumper.codec == "npy":  # each dump: ("npy", 0.0, None)
            npy = records.sid("npy")
            self._strings.refresh()  # (a new id on the first call)
            return (
                self._strings.gather(np.where(has_path, npy, -1)),
                _stat_floats(np, A, np.zeros(m), has_path),
                A.nulls(np, A.INT64, m),
            )
        codec: list = [None] * m
        err = np.zeros(m)
        size = np.zeros(m, dtype=np.int64)
        has_err = np.zeros(m, dtype=bool)
        has_size = np.zeros(m, dtype=bool)
        if dumper is not None:
            for d in with_path:
                p = paths[d]
                info = dumper.codec_info(p) if p is not None else None
                if info is None:
                    continue
                codec[d] = info[0]
                if info[1] is not None:
                    err[d], has_err[d] = info[1], True
                if info[2] is not None:
                    size[d], has_size[d] = info[2], True
        return (
            A.texts(np, codec),
            _stat_floats(np, A, err, has_err),
            A.ints(np, size, A.INT64, has_size),
        )

    def _args(self, np: Any, refs: Any, objs: list) -> Any:
        """The args column: each call's (name, value) pairs as text (values.arg_text),
        encoded once per distinct set of pairs (a cache of up to 65,536 sets, emptied when
        full). The native core shares one tuple between the rows whose pairs are the same
        (its args_interned): its arg_column finds those by the tuple's identity and builds
        the column in one pass; only the sets it has not met are looked up by value."""
        n = len(refs)
        if not objs:
            return A.nulls(np, A.UTF8, n)
        native = core.native
        if native is not None:  # one pass in C from the records' field
            by_id = self._args_ids
            got = native.arg_column(refs, objs, by_id)
            if got.__class__ is list:  # sets met for the first time: each formatted once
                by_id.update(zip(map(id, got), zip(got, self._arg_texts(got))))
                got = native.arg_column(refs, objs, by_id)  # every set has its text now
                if len(by_id) > 65536:
                    by_id.clear()  # (it holds the sets: their ids are not reused meanwhile)
            if got.__class__ is tuple:
                k, bitmap, offsets, data = got
                return A.Column(n, k, [bitmap, offsets, data])
            # (still sets without a text: the cache was emptied in between) by value below
        refs = np.asarray(refs)  # (a strided view of the record bytes on the native path)
        rows = np.flatnonzero(refs >= 0)
        if not len(rows):
            return A.nulls(np, A.UTF8, n)
        pairs = list(map(objs.__getitem__, refs[rows].tolist()))
        texts = self._arg_texts(pairs)
        if len(rows) == n:
            return _utf8(np, texts)
        items = np.full(n, None, dtype=object)
        items[rows] = np.fromiter(texts, dtype=object, count=len(texts))
        return _utf8(np, items.tolist())

    def _arg_texts(self, pairs: list) -> list:
        """The UTF-8 text of each set of pairs, from the cache by value or made."""
        native = core.native
        # keyed by the pairs and their values' types (and a float's bits): 1.0 == True and
        # 0.0 == -0.0, but their texts differ
        keys = native.arg_keys(pairs) if native is not None else list(map(_arg_key, pairs))
        cache = self._args_cache
        try:  # C loops: no Python code per row
            texts = list(map(cache.get, keys))
            if None in texts:  # sets not seen before: each formatted once
                new = dict.fromkeys([k for k, t in zip(keys, texts) if t is None])
                if len(cache) + len(new) > 65536:
                    cache.clear()  # the program's args vary without end: start over
                # the common values' texts in C (no frame a value); None: the Python twin's
                made = (
                    native.arg_texts([k[0] for k in new], values.Text)
                    if native is not None
                    else [None] * len(new)
                )
                for k, text in zip(new, made):
                    cache[k] = _arg_bytes(k[0]) if text is None else text
                texts = list(map(cache.get, keys))
        except TypeError:  # an unhashable value: each row on its own
            texts = [None] * len(pairs)
            for j, k in enumerate(keys):
                try:
                    text = cache.get(k)
                except TypeError:
                    text = None
                if text is None:
                    text = _arg_bytes(k[0])
                    try:
                        if len(cache) >= 65536:
                            cache.clear()
                        cache[k] = text
                    except TypeError:
                        pass
                texts[j] = text
        return texts

    def _stacks_batch(self) -> Any:
        """The stacks interned since the last batch (recorder.stack_*), one row per frame,
        level 0 the call site: each stack's chain of ``stack_inner`` links walked for all new
        stacks at once (:func:`_stack_rows`; a few new stacks chain by chain), names from the
        call-site table."""
        inner, outer = recorder.stack_inner, recorder.stack_outer
        n = min(len(inner), len(outer))
        k = self._stacks_done
        if k >= n and "stacks" in self.sinks:
            return None  # (the first batch may be empty: every process has its stacks shard)
        import numpy as np

        native = core.native
        if native is not None and 0 < n - k <= _FEW_STACKS:  # no NumPy call
            callers, funcs = self._site_table(np)
            recs = _stack_records_few(inner, outer, k, n, callers, funcs, len(recorder.sites))
            self._stacks_done = n
            self._strings.refresh()
            specs = [
                (RC_REPEAT, self.run_id.encode("utf-8", "replace")),
                (RC_CONST, 8, self.pid),
                *_STACK_SPECS,
            ]
            m = len(recs) // 4
            cols = record_columns(np, recs, specs, 32)
            return A.Batch(logschema.STACKS, m, cols, self._strings.items)
        if n - k <= _FEW_STACKS:
            ids, levels, site = _stack_rows_few(np, inner, outer, k, n)
        else:
            ids, levels, site = _stack_rows(np, inner, outer, k, n)
        self._stacks_done = max(n, k)
        site_ids = [np.frombuffer(c, np.int64) for c in self._site_table(np)]
        ok = (site >= 0) & (site < len(recorder.sites)) & (site < len(site_ids[0]))
        safe = np.where(ok, site, 0)
        self._strings.refresh()
        m = len(ids)
        cols = [
            A.repeat(np, self.run_id, m),
            A.const_ints(np, self.pid, A.INT64, m),
            A.ints(np, ids, A.INT64),
            A.ints(np, levels, A.INT32),
            A.dict_indices(np, np.where(ok, site_ids[0][safe], -1)),
            A.dict_indices(np, np.where(ok, site_ids[1][safe], -1)),
        ]
        return A.Batch(logschema.STACKS, m, cols, self._strings.items)

    def _op_table(self, np: Any, heads: bytes, ops: Any) -> tuple:
        """(framework, op, kind, ufunc) string ids per op index, named for the ops that appear
        in a batch (``heads``, the op records; ``ops``, their structured array) only (-2: not
        named yet; the probe knows thousands of ops)."""
        known = len(recorder.ops_by_index)
        t = self._ops_sids
        if t is None or len(t[0]) < known:
            # four int64 arrays (array.array: made and grown by a C repeat, no NumPy call),
            # with room for twice the ops known (the probe registers ops as the program meets
            # them); -2 for an op not named yet
            cap = max(2 * known, 1024)
            grown = []
            for j in range(4):
                col = array("q") if t is None else array("q", t[j])
                col.frombytes(_UNNAMED * (cap - len(col)))
                grown.append(col)
            t = self._ops_sids = tuple(grown)
        native = core.native
        need: Any = ()
        if native is not None:  # one pass in C, no NumPy call
            need = native.missing_ids(heads, _OP_SIZE, *_OP_AT_OP, t[0], -2)
        elif len(ops):
            op_index = ops["op"]
            unnamed = op_index[np.frombuffer(t[0], np.int64)[op_index] == -2]
            if len(unnamed):  # (not np.unique: it imports numpy.ma; no negative index)
                unnamed = unnamed[unnamed >= 0]
                seen = np.zeros(known, dtype=bool)
                seen[unnamed] = True
                need = np.flatnonzero(seen).tolist()
        if need:  # each op once per process
            sid, opt = records.sid, records.sid_or_none
            fw, name, kind, uf = t
            for i in need:
                o = recorder.ops_by_index[i]
                fw[i], name[i], kind[i], uf[i] = (
                    sid(o.framework),
                    sid(o.name),
                    sid(o.kind),
                    opt(o.ufunc),
                )
        return t

    def _site_table(self, np: Any) -> tuple:
        """(caller, caller_function) string ids per call-site index (recorder.sites): two
        int64 arrays (array.array: extended in place as sites appear, no NumPy call; the
        native core's passes read them as buffers, NumPy through np.frombuffer)."""
        sites = recorder.sites
        t = self._sites_sids
        k = len(t[0])
        if k < len(sites):
            new = sites[k : len(sites)]
            t[0].extend([records.sid(f"{code.co_filename}:{line}") for code, line in new])
            t[1].extend(
                [records.sid(getattr(code, "co_qualname", code.co_name)) for code, _ in new]
            )
        if not len(t[0]):
            return _NO_SITES
        return t


#: Up to this many new stacks in a batch, their chains are walked in Python: a few links
#: each, cheaper than the ~20 NumPy calls of the walk over all chains at once.
_FEW_STACKS = 32


def _stack_rows(np: Any, inner: Any, outer: Any, k: int, n: int) -> tuple[Any, Any, Any]:
    """(stack id, level, site) per frame of stacks ``k`` to ``n``, ordered by stack then
    level (0: the chain's last link): the ``j``-th link of every chain at once."""
    # copies in one call each: an exported buffer would stop the recording thread's appends
    inner_a = np.frombuffer(inner.tobytes(), dtype=np.int64)[:n]
    outer_a = np.frombuffer(outer.tobytes(), dtype=np.int64)[:n]
    owners, frames, steps = [], [], []
    owner = np.arange(k, max(n, k), dtype=np.int64)
    cur = owner
    depth = np.zeros(len(owner), dtype=np.int64)
    j = 0
    while len(cur) and j <= n:  # j-th link of every chain still going (j <= n: no cycle)
        owners.append(owner)
        frames.append(outer_a[cur])
        steps.append(np.full(len(cur), j, dtype=np.int64))
        depth[owner - k] += 1
        nxt = inner_a[cur]
        keep = (nxt >= 0) & (nxt < n)
        cur, owner = nxt[keep], owner[keep]
        j += 1
    if owners:
        own = np.concatenate(owners)
        level = depth[own - k] - 1 - np.concatenate(steps)  # the chain's last link: 0
        order = np.lexsort((level, own))
        ids, levels, site = own[order], level[order], np.concatenate(frames)[order]
    else:
        ids = levels = site = np.zeros(0, dtype=np.int64)
    return ids, levels, site


def _chain_sites(inner: Any, outer: Any, s: int, n: int) -> list[int]:
    """Stack ``s``'s sites by level (0 first): its chain of ``inner`` links walked, each
    link's ``outer`` site, reversed (at most ``n`` links: no cycle)."""
    chain: list[int] = []
    cur = s
    while 0 <= cur < n and len(chain) <= n:
        chain.append(outer[cur])
        cur = inner[cur]
    chain.reverse()
    return chain


def _stack_rows_few(np: Any, inner: Any, outer: Any, k: int, n: int) -> tuple[Any, Any, Any]:
    """:func:`_stack_rows` chain by chain, for a few new stacks."""
    ids: list[int] = []
    levels: list[int] = []
    sites: list[int] = []
    for s in range(k, n):
        chain = _chain_sites(inner, outer, s, n)
        m = len(chain)
        ids += [s] * m
        levels += range(m)
        sites += chain
    i64 = np.int64
    return np.array(ids, dtype=i64), np.array(levels, dtype=i64), np.array(sites, dtype=i64)


#: record_columns' specs of the stacks batch past run_id and pid, over _stack_records_few's
#: records: (stack id, level, caller id, caller_function id), int64 each
_STACK_SPECS = (
    (RC_INT, "stack", 0, "q", 8, 0, False),
    (RC_INT, "level", 8, "q", 4, 0, False),
    (RC_INDEX, "caller", 16, "q"),
    (RC_INDEX, "caller_function", 24, "q"),
)


def _stack_records_few(
    inner: Any, outer: Any, k: int, n: int, callers: Any, funcs: Any, known: int
) -> array:
    """The rows of :func:`_stack_rows_few` as records of four int64s for the native core's
    record_columns: (stack id, level, caller, caller_function), the names' string ids from
    the call-site table (``callers``, ``funcs``), -1 for a site outside it (or past the
    ``known`` sites)."""
    out = array("q")
    lim = min(known, len(callers), len(funcs))
    for s in range(k, n):
        level = 0
        for site in _chain_sites(inner, outer, s, n):
            if 0 <= site < lim:
                out.extend((s, level, int(callers[site]), int(funcs[site])))
            else:
                out.extend((s, level, -1, -1))
            level += 1
    return out


class _Strings:
    """records.strings as UTF-8, for string columns made from string ids in bulk: a list of
    the encoded strings (index 0: b"", for null; id i at i + 1) and an int64 array of their
    lengths. A column's offsets are the cumulative lengths of its ids; its bytes are the
    strings taken by id and joined: the native core's utf8_column, or ``bytes.join`` (C
    loops over the rows either way, no Python code per row, no Python int made for any)."""

    def __init__(self) -> None:
        self.count = 0
        self.items: list[bytes] = [b""]  # b"", then each string's UTF-8 bytes
        self.lens: Any = None  # int64 array: their lengths (lengths(); lens_n of them set)
        self.lens_n = 0

    def refresh(self) -> None:
        n = len(records.strings)
        if n == self.count:
            return
        self.items.extend([t.encode("utf-8", "replace") for t in records.strings[self.count : n]])
        self.count = n

    def lengths(self, np: Any) -> Any:
        """The int64 array of the items' lengths (the Python twin of :meth:`gather` takes
        them; the native core's utf8_column needs none), brought up to date here."""
        have, n = self.lens_n, len(self.items)
        if have < n:
            if self.lens is None or len(self.lens) < n:
                lens = np.zeros(max(2 * n, 1024), dtype=np.int64)
                if self.lens is not None:
                    lens[:have] = self.lens[:have]
                self.lens = lens
            self.lens[have:n] = list(map(len, self.items[have:n]))  # in one assignment
            self.lens_n = n
        return self.lens

    def _one(self, np: Any, sid: int, n: int) -> Any:
        """The utf8 column of string id ``sid`` in each of ``n`` rows (-1: nulls)."""
        return A.nulls(np, A.UTF8, n) if sid < 0 else A.repeat_bytes(np, self.items[sid + 1], n)

    def gather(self, ids: Any) -> Any:
        """The utf8 column of string ids ``ids`` (-1: null)."""
        import numpy as np

        n = len(ids)
        if not n:
            return A.strings(np, np.zeros(1, dtype=np.int32), b"")
        native = core.native
        if native is not None:  # the same buffers, in C, from the ids as they are (strided)
            got = native.utf8_column(self.items, ids, True)
            if got.__class__ is int:  # one value (status "ok", device "cpu", no module)
                return self._one(np, got, n)  # type: ignore[arg-type]
            k, bitmap, offsets, data = got  # type: ignore[misc]
            return A.Column(n, k, [bitmap, offsets, data])
        lo, hi = int(ids.min()), int(ids.max())
        if lo == hi:
            return self._one(np, lo, n)
        offsets, data = A.taken(np, self.items, self.lengths(np), ids + 1)  # null (-1) -> b""
        return A.strings(np, offsets, data, ids >= 0 if lo < 0 else None)


def _arg_bytes(pairs: Any) -> bytes:
    """The args text of one call's (name, value) pairs, UTF-8 (values.arg_text)."""
    return ", ".join([values.arg_text(i, v) for i, v in pairs]).encode("utf-8", "replace")


def _arg_key(pairs: Any) -> tuple:
    """The args cache's key of a set of (name, value) pairs (the twin of the native core's
    arg_keys): the set, then each value's type, or its bits when it is a float."""
    if pairs.__class__ is not tuple:
        return (pairs,)
    return (pairs, *[
        _F64_BITS(v) if v.__class__ is float else type(v)
        for v in (p[1] if p.__class__ is tuple and len(p) == 2 else p for p in pairs)
    ])  # fmt: skip


_F64_BITS = struct.Struct("<d").pack


def _utf8(np: Any, items: list) -> Any:
    """A utf8 column of UTF-8 ``bytes`` or None per row: the native core's utf8_column, or
    its twin (bytes.join)."""
    n = len(items)
    native = core.native
    if native is not None:
        k, bitmap, offsets, data = native.utf8_column(items)
        return A.Column(n, k, [bitmap, offsets, data])
    nulls = items.count(None)
    enc = [b"" if v is None else v for v in items] if nulls else items
    data = b"".join(enc)
    if len(data) >= 1 << 31:
        raise ValueError("a string column of 2 GiB or more in one batch")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, enc), dtype=np.int64, count=n), out=offsets[1:])
    valid = np.fromiter((v is not None for v in items), dtype=bool, count=n) if nulls else None
    return A.strings(np, offsets, data, valid)


def _placed(np: Any, m: int, rows: Any, items: list) -> list:
    """A list of ``m`` values: ``items`` at ``rows``, None elsewhere (NumPy's loops)."""
    out = np.full(m, None, dtype=object)
    out[rows] = np.fromiter(items, dtype=object, count=len(items))
    return out.tolist()  # type: ignore[no-any-return]


def _str_column(np: Any, vals: list) -> Any:
    """A utf8 column of str or None per row (dump paths, notes): the native core's
    utf8_column, or arrowipc.texts (its twin, also where a str has no UTF-8)."""
    n = len(vals)
    if vals.count(None) == n:  # no dump path, no note in the batch
        return A.nulls(np, A.UTF8, n)
    native = core.native
    if native is not None:
        try:
            k, bitmap, offsets, data = native.utf8_column(vals)
        except (TypeError, UnicodeError):
            pass
        else:  # (not every row is None: checked above)
            return A.Column(n, k, [bitmap, offsets, data])
    return A.texts(np, vals)


_STAT_FLOATS = ("min", "max", "mean", "std")


def _stat_floats(np: Any, A: Any, v: Any, valid: Any) -> Any:
    """A float64 column of ``v``, null where ``valid`` is False or the value is NaN
    (statistics are over finite values: NaN in a record means null)."""
    if not valid.any():
        return A.nulls(np, A.FLOAT64, len(v))
    v = np.ascontiguousarray(v, dtype=np.float64)
    return A.floats(np, v, valid & (v == v))


def _desc_columns(native: Any, descs: bytes) -> Any:
    """The native core's desc_log_columns over ``descs``: the tensors batch's columns from
    the desc records and the greatest stats, path and note fields, in one pass (None: a
    deep shape)."""
    return native.desc_log_columns(descs, _DESC_SIZE, _DESC_LOG_AT, A.Column, A.Const)


def _shapes(np: Any, A: Any, descs: bytes, m: int, objs: list, ds: Any) -> tuple[Any, Any]:
    """(the ``m`` desc records' shapes -> list<int64>, ``ds``): inline dimensions, or packed
    bytes beyond records.MAX_INLINE_DIMS (values.pack_shape). All inline: the native core's
    shape_lists (one pass in C over the bytes, no NumPy call); otherwise (a deep shape in the
    batch, or the Python engine) :func:`_py_shapes` over ``ds``, the records' structured
    array (made here when None, and returned)."""
    native = core.native
    if native is not None and m:
        got = native.shape_lists(descs, _DESC_SIZE, _NDIM_AT, _D0_AT)
        if got is not None:  # (None: a deep shape in the batch)
            offsets, values = got
            child = A.Column(len(values) // 8, 0, [None, values])
            return A.Column(m, 0, [None, offsets], child), ds
    if ds is None:
        ds = np.frombuffer(descs, records.numpy_dtypes()[1])
    return _py_shapes(np, A, ds, objs), ds


def _py_shapes(np: Any, A: Any, ds: Any, objs: list) -> Any:
    """:func:`_shapes` with NumPy, any shape: views of the (records, MAX_INLINE_DIMS)
    dimensions (a slice for one rank in the batch, else a mask, ~0.04 us a record more)."""
    m = len(ds)
    ndim = ds["ndim"].astype(np.int64)
    k = records.MAX_INLINE_DIMS
    # the k inline dimensions of each record, as an (m, k) view of the record buffer
    if m:
        dims = np.ndarray((m, k), dtype=np.int64, buffer=ds, offset=ds.dtype.fields["d0"][1],
                          strides=(ds.dtype.itemsize, 8))  # fmt: skip
    else:
        dims = np.zeros((0, k), dtype=np.int64)
    deep = ndim > k
    if m and 0 <= ndim[0] <= k and (ndim == ndim[0]).all():  # one rank in the batch
        nd = int(ndim[0])
        offsets = np.arange(m + 1, dtype=np.int32) * np.int32(nd)
        return A.int64_lists(np, offsets, dims[:, :nd].reshape(-1))
    if deep.any():
        pieces = []
        refs = ds["shape_ref"]
        for r in range(m):
            if deep[r]:
                pieces.append(np.frombuffer(objs[int(refs[r])], dtype=np.int64))
            else:
                pieces.append(dims[r, : ndim[r]])
        flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    else:
        flat = dims[np.arange(k) < ndim[:, None]]
    offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(ndim, out=offsets[1:])
    return A.int64_lists(np, offsets, flat)


class _PyarrowSink:
    """A shard written by pyarrow's stream writer (PPROBE_LOG_WRITER=pyarrow, or auto with a
    collector's tap), LZ4-compressed, from the same columns."""

    def __init__(self, log: safefs.RunDir, name: str, fields: Any, meta: dict[str, str]):
        import pyarrow as pa

        from .arrowipc import pa_schema

        self.meta = meta
        self.file = log.create_for(name, lambda path: pa.OSFile(path, "ab"))
        opts = pa.ipc.IpcWriteOptions(compression="lz4")
        self.writer = pa.ipc.new_stream(self.file, pa_schema(pa, fields, meta), options=opts)

    def write_batch(self, batch: Any) -> None:
        from .arrowipc import to_pyarrow

        self.writer.write_batch(to_pyarrow(batch, self.meta))
        self.file.flush()

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            self.file.close()

    def abandon(self) -> None:
        """In a forked child: the parent's shard is not the child's to end."""


# ---------------------------------------------------------------------- pyarrow helpers
# Arrow arrays straight from buffers, for the parts of pprobe that build pyarrow batches in
# the program's process (pprobe.ext.tables, pprobe.ext.sqlviews, pprobe.collect.client): the
# op log's own columns are pprobe.arrowipc columns above.


def _ints(pa: Any, np: Any, v: Any, tp: Any, valid: Any = None) -> Any:
    """An int32/int64 Arrow array of ``v`` (NumPy), null where ``valid`` is False.

    Straight from the buffers: ``pa.array(ndarray)`` imports numpy.ma and ``mask=``/``cast``
    pyarrow.compute, modules the program did not ask for, from the writer thread."""
    if valid is not None and len(valid) and not valid.any():
        return _nulls(pa, len(valid), tp)
    v = np.ascontiguousarray(v, dtype=np.int32 if tp == pa.int32() else np.int64)
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(tp, len(v), [bitmap, pa.py_buffer(v)])


def _texts(pa: Any, np: Any, vals: list) -> Any:
    """A string Arrow array of ``vals`` (str or None), built from its buffers.

    Not ``pa.array(list)``: pyarrow checks any object it converts for pandas types, and that
    check imports pandas (360 modules) into the program's process where it is installed."""
    n = len(vals)
    nones = vals.count(None)
    if nones == n:
        return _nulls(pa, n, pa.string())
    v0 = vals[0]
    if type(v0) is str and vals.count(v0) == n:  # one value repeated (run_id, a metric's name)
        e0 = v0.encode("utf-8", "replace")
        if len(e0) * n < 1 << 31:
            offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(e0))
            bufs = [None, pa.py_buffer(offsets), pa.py_buffer(e0 * n)]
            return pa.Array.from_buffers(pa.string(), n, bufs)
    uniq = dict.fromkeys(vals)
    if 4 * len(uniq) <= n:  # a few values repeated (parameter names, op names): encoded once
        codes = {v: b"" if v is None else v.encode("utf-8", "replace") for v in uniq}
        enc = list(map(codes.__getitem__, vals))
    else:
        enc = [b"" if v is None else v.encode("utf-8", "replace") for v in vals]
    data = b"".join(enc)
    large = len(data) >= 1 << 31
    offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(np.fromiter(map(len, enc), dtype=np.int64, count=n), out=offsets[1:])
    bitmap = None
    if nones:
        valid = np.fromiter((v is not None for v in vals), dtype=bool, count=n)
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    tp = pa.large_string() if large else pa.string()
    arr = pa.Array.from_buffers(tp, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])
    return arr.cast(pa.string()) if large else arr


_null_arrays: dict[Any, Any] = {}


def _nulls(pa: Any, n: int, tp: Any) -> Any:
    """n nulls of type ``tp``: a slice of one array per type (no new zeroed memory per batch)."""
    c = _null_arrays.get(tp)
    if c is None or len(c) < n:
        c = _null_arrays[tp] = pa.nulls(max(n, 65536), tp)
    return c.slice(0, n)


def _bools(pa: Any, np: Any, v: Any, valid: Any) -> Any:
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    data = pa.py_buffer(np.packbits(np.asarray(v, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(pa.bool_(), len(v), [bitmap, data])
