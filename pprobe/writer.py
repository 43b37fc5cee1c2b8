"""Streaming the recorded rows to Arrow IPC stream files, one shard per process.

A daemon thread wakes every ``flush_seconds`` (or when the hot path has buffered
``flush_rows`` rows), drains :data:`pprobe.recorder.rows`, builds one RecordBatch per table
and appends it to ``log/tensors-{host}-{pid}.arrows`` then ``log/ops-{host}-{pid}.arrows``
(tensors first, so every visible op row has its tensor rows). Arrow's *stream* format is used
because a reader can read it up to the last complete batch after the writer was killed; the
*file* format is unreadable without its footer.

pyarrow is imported in the writer thread on the first flush, never at start-up.
"""

from __future__ import annotations

import os
import re
import threading
import time
from time import perf_counter_ns
from typing import Any

from . import _report, recorder, state, values
from .state import INTERNAL


class Writer:
    def __init__(
        self, run_dir: str, run_id: str, host: str, flush_rows: int, flush_seconds: float
    ) -> None:
        self.run_dir = run_dir
        self.log_dir = os.path.join(run_dir, "log")
        self.run_id = run_id
        self.host = re.sub(r"[^A-Za-z0-9._-]", "_", host)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.rows_written = 0
        self.batches = 0
        self.failed = False
        self._init_process()

    def _init_process(self) -> None:
        self.pid = os.getpid()
        self.epoch0 = time.time_ns() - perf_counter_ns()
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.stopping = False
        self.sinks: dict[str, Any] = {}
        self.thread: threading.Thread | None = None
        self._dtype_names: dict[Any, str] = {}
        self._callers: list[tuple[str | None, str | None] | None] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="pprobe-writer", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        self.event.set()

    def _loop(self) -> None:
        state.local.depth = INTERNAL  # this thread's own NumPy work is never recorded
        while not self.stopping:
            self.event.wait(self.flush_seconds)
            self.event.clear()
            if not self.stopping:
                self.flush()

    def close(self) -> None:
        self.stopping = True
        self.event.set()
        t = self.thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=10)
        self.flush()
        with self.lock:
            for sink in self.sinks.values():
                try:
                    sink[0].close()
                    sink[1].close()
                except Exception:
                    pass
            self.sinks.clear()

    def before_fork(self) -> None:
        self.lock.acquire()

    def after_fork_parent(self) -> None:
        self.lock.release()

    def after_fork_child(self) -> None:
        """A forked child writes its own shard with its own thread; the parent's are not ours."""
        self.rows_written = self.batches = 0
        self._init_process()
        self.start()

    # ------------------------------------------------------------------ writing
    def flush(self) -> None:
        """Write every buffered row. Never raises."""
        with state.internal(), self.lock:
            q = recorder.rows
            n = len(q)
            if not n or self.failed:
                if self.failed:
                    q.clear()
                return
            batch = [q.popleft() for _ in range(n)]
            try:
                ops, tensors = self._to_batches(batch)
                self._write("tensors", tensors)
                self._write("ops", ops)
                self.rows_written += n
                self.batches += 1
            except Exception as e:
                self.failed = True
                _report.internal_error("writing the log", e)

    def _write(self, table: str, batch: Any) -> None:
        if batch.num_rows == 0 and table in self.sinks:
            return
        sink = self.sinks.get(table)
        if sink is None:
            import pyarrow as pa

            os.makedirs(self.log_dir, exist_ok=True)
            path = os.path.join(self.log_dir, f"{table}-{self.host}-{self.pid}.arrows")
            f = pa.OSFile(path, "wb")
            opts = pa.ipc.IpcWriteOptions(compression="lz4")
            w = pa.ipc.new_stream(f, batch.schema, options=opts)
            sink = self.sinks[table] = (w, f)
        sink[0].write_batch(batch)
        sink[1].flush()

    def _to_batches(self, batch: list) -> tuple[Any, Any]:
        """Raw rows (recorder.rows) -> (ops, tensors) RecordBatches.

        The numbers (packed heads, shapes) go from bytes to Arrow through NumPy, never as
        lists of Python ints: while the writer works, the program runs on (it gets the GIL
        every few ms), and NumPy's own tests count references to small ints around a call.
        """
        import numpy as np
        import pyarrow as pa

        from . import schema

        meta = {
            "pprobe.schema_version": schema.SCHEMA_VERSION,
            "run_id": self.run_id,
            "pid": str(self.pid),
            "host": self.host,
        }
        n = len(batch)
        # The packed heads, one row each: (seq, op index, t0, t1, thread, step, depth, parent,
        # site, n_descs, n_others) (recorder.HEAD).
        heads = np.frombuffer(b"".join([r[0] for r in batch]), dtype=np.int64)
        heads = heads.reshape(n, len(recorder.HEAD_FIELDS))
        seq = heads[:, 0]
        n_descs = heads[:, 9]
        n_others = heads[:, 10]
        # Per distinct op, site, thread, then spread over the rows.
        op_ids, ops_inv = np.unique(heads[:, 1], return_inverse=True)
        opsx = recorder.ops_by_index
        ops_u = [opsx[i] for i in op_ids.tolist()]
        sites_u, sites_inv = np.unique(heads[:, 8], return_inverse=True)
        callers = [self._caller(i) for i in sites_u.tolist()]
        thr_u, thr_inv = np.unique(heads[:, 4].view(np.uint64), return_inverse=True)
        live = {t.ident: t.name for t in threading.enumerate()}
        thread_names = [live.get(t) or state.thread_names.get(t) or str(t) for t in thr_u.tolist()]

        def spread(per_distinct: list, inv: Any) -> list:
            return np.array(per_distinct, dtype=object)[inv.reshape(-1)].tolist()

        arg = values.arg_text
        head, width = recorder.ROW_HEAD, recorder.DESC_FIELDS
        args: list = [None] * n
        for k in np.flatnonzero(n_others):
            r = batch[k]
            i = head + width * int(n_descs[k])
            args[k] = ", ".join(arg(r[j], r[j + 1]) for j in range(i, i + 2 * int(n_others[k]), 2))
        parent = heads[:, 7]
        ops_cols = [
            [self.run_id] * n,
            [self.host] * n,
            [self.pid] * n,
            pa.nulls(n, pa.int32()) if state.rank is None else np.full(n, state.rank),
            pa.nulls(n, pa.int32()) if state.world_size is None else np.full(n, state.world_size),
            seq,
            spread(thread_names, thr_inv),
            heads[:, 2] + self.epoch0,
            heads[:, 3] - heads[:, 2],
            spread([o.framework for o in ops_u], ops_inv),
            spread([o.name for o in ops_u], ops_inv),
            spread([o.kind for o in ops_u], ops_inv),
            spread([o.ufunc for o in ops_u], ops_inv),
            [r[1] for r in batch],
            spread([c[0] for c in callers], sites_inv),
            spread([c[1] for c in callers], sites_inv),
            [r[2] for r in batch],
            [r[3] for r in batch],
            heads[:, 5],
            heads[:, 6],
            _ints(pa, np, parent, pa.int64(), parent >= 0),
            args,
        ]
        ops = pa.RecordBatch.from_arrays(
            [_array(pa, np, c, f.type) for c, f in zip(ops_cols, schema.OPS)],
            schema=schema.OPS.with_metadata(meta),
        )
        # Tensor rows: (role, idx, shape, dtype, device, grad, stats, path, note), seq apart
        descs: list[tuple] = []
        for k in np.flatnonzero(n_descs):
            r = batch[k]
            end = head + width * int(n_descs[k])
            descs.extend(r[i : i + width] for i in range(head, end, width))
        m = len(descs)
        if m:
            roles, idxs, shapes, dts, devs, grads, sts, paths, notes = map(list, zip(*descs))
        else:
            roles = idxs = shapes = dts = devs = grads = sts = paths = notes = []
        dnames = self._dtype_names
        for d in range(m):
            st, path = sts[d], paths[d]
            if st is not None and st.__class__ is not tuple:  # values.Lazy (CUDA stats)
                sts[d] = values.resolve(st, "device statistics")
            if path is not None and path.__class__ is not str:  # values.Lazy (CUDA dump)
                path, note2 = values.resolve(path, "deferred dump") or (None, "not dumped")
                paths[d] = path
                notes[d] = note2 or notes[d]
        dtype_names = []
        for dt in dts:
            dn = dnames.get(dt)
            if dn is None:
                dn = dnames[dt] = str(dt)
            dtype_names.append(dn)
        none6 = (None, None, None, None, None, None)
        stat_cols: list[Any] = list(zip(*[st or none6 for st in sts])) if m else [()] * 6
        # nan/inf counts: floats in the row (recorder._describe), int64 in the table
        for c in (4, 5):
            counts = np.array(stat_cols[c], dtype=np.float64).reshape(-1)  # None: nan
            valid = counts == counts
            stat_cols[c] = _ints(pa, np, np.where(valid, counts, 0), pa.int64(), valid)
        t_cols = [
            [self.run_id] * m,
            [self.pid] * m,
            np.repeat(seq, n_descs),
            roles,
            idxs,
            _shapes(pa, np, shapes),
            dtype_names,
            devs,
            grads,
            *stat_cols,
            paths,
            notes,
        ]
        tensors = pa.RecordBatch.from_arrays(
            [_array(pa, np, c, f.type) for c, f in zip(t_cols, schema.TENSORS)],
            schema=schema.TENSORS.with_metadata(meta),
        )
        return ops, tensors

    def _caller(self, site: int) -> tuple[str | None, str | None]:
        """(caller, caller_function) of a call-site index (recorder.sites); -1: none."""
        if site < 0:
            return (None, None)
        cache = self._callers  # by site index: a list, so it keeps no int
        if site >= len(cache):
            cache.extend([None] * (site + 1 - len(cache)))
        c = cache[site]
        if c is None:
            code, line = recorder.sites[site]
            c = cache[site] = (
                f"{code.co_filename}:{line}",
                getattr(code, "co_qualname", code.co_name),
            )
        return c


def _array(pa: Any, np: Any, c: Any, tp: Any) -> Any:
    if isinstance(c, pa.Array):
        return c
    if isinstance(c, np.ndarray):
        return _ints(pa, np, c, tp)
    return pa.array(c, type=tp)


def _ints(pa: Any, np: Any, v: Any, tp: Any, valid: Any = None) -> Any:
    """An int32/int64 Arrow array of ``v`` (NumPy), null where ``valid`` is False.

    Straight from the buffers: ``pa.array(ndarray)`` imports numpy.ma and ``mask=``/``cast``
    pyarrow.compute, modules the program did not ask for, from the writer thread."""
    v = np.ascontiguousarray(v, dtype=np.int32 if tp == pa.int32() else np.int64)
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(tp, len(v), [bitmap, pa.py_buffer(v)])


def _shapes(pa: Any, np: Any, shapes: list) -> Any:
    """Packed shapes (values.pack_shape: native int64 bytes) -> list<int64>."""
    pack = values.pack_shape  # a handler of pprobe's own packs; another's may give a tuple
    shapes = [sh if sh.__class__ is bytes else pack(sh) for sh in shapes]
    m = len(shapes)
    offsets = np.zeros(m + 1, dtype=np.int32)
    if m:
        np.cumsum(np.fromiter(map(len, shapes), dtype=np.int32, count=m) >> 3, out=offsets[1:])
    flat = _ints(pa, np, np.frombuffer(b"".join(shapes), dtype=np.int64), pa.int64())
    tp = pa.list_(pa.int64())
    return pa.Array.from_buffers(tp, m, [None, pa.py_buffer(offsets)], children=[flat])
