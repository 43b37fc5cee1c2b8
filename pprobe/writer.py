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
        self._callers: dict[int, tuple[str | None, str | None]] = {}

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
        import pyarrow as pa

        from . import schema

        meta = {
            "pprobe.schema_version": schema.SCHEMA_VERSION,
            "run_id": self.run_id,
            "pid": str(self.pid),
            "host": self.host,
        }
        names = {t.ident: t.name for t in threading.enumerate()}
        epoch0 = self.epoch0
        n = len(batch)
        opsx = recorder.ops_by_index
        ops_of = [opsx[r[1]] for r in batch]
        callers = [self._caller(r[8]) for r in batch]
        fmt = values.format_value
        head, width = recorder.ROW_HEAD, recorder.DESC_FIELDS

        def args_text(r: tuple) -> str | None:
            no = r[13]
            if not no:
                return None
            i = head + width * r[12]
            return ", ".join(f"{r[j]}={fmt(r[j + 1])}" for j in range(i, i + 2 * no, 2))

        ops_cols = [
            [self.run_id] * n,
            [self.host] * n,
            [self.pid] * n,
            [state.rank] * n,
            [state.world_size] * n,
            [r[0] for r in batch],
            [names.get(r[4]) or state.thread_names.get(r[4]) or str(r[4]) for r in batch],
            [r[2] + epoch0 for r in batch],
            [r[3] - r[2] for r in batch],
            [o.framework for o in ops_of],
            [o.name for o in ops_of],
            [o.kind for o in ops_of],
            [o.ufunc for o in ops_of],
            [r[9] for r in batch],
            [c[0] for c in callers],
            [c[1] for c in callers],
            [r[10] for r in batch],
            [r[11] for r in batch],
            [r[5] for r in batch],
            [r[6] for r in batch],
            [r[7] if r[7] >= 0 else None for r in batch],
            [args_text(r) for r in batch],
        ]
        ops = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(ops_cols, schema.OPS)],
            schema=schema.OPS.with_metadata(meta),
        )
        # Tensor rows: (seq, role, idx, shape, dtype, device, grad, stats, path, note)
        descs = [
            (r[0], *r[i : i + width])
            for r in batch
            if r[12]
            for i in range(head, head + width * r[12], width)
        ]
        m = len(descs)
        if m:
            seqs, roles, idxs, shapes, dts, devs, grads, sts, paths, notes = map(list, zip(*descs))
        else:
            seqs = roles = idxs = shapes = dts = devs = grads = sts = paths = notes = []
        dnames = self._dtype_names
        for k in range(m):
            st, path = sts[k], paths[k]
            if st is not None and st.__class__ is not tuple:  # values.Lazy (CUDA stats)
                sts[k] = values.resolve(st, "device statistics")
            if path is not None and path.__class__ is not str:  # values.Lazy (CUDA dump)
                path, note2 = values.resolve(path, "deferred dump") or (None, "not dumped")
                paths[k] = path
                notes[k] = note2 or notes[k]
        dtype_names = []
        for dt in dts:
            dn = dnames.get(dt)
            if dn is None:
                dn = dnames[dt] = str(dt)
            dtype_names.append(dn)
        none6 = (None, None, None, None, None, None)
        stat_cols: list[Any] = list(zip(*[st or none6 for st in sts])) if m else [[]] * 6
        t_cols = [
            [self.run_id] * m,
            [self.pid] * m,
            seqs,
            roles,
            idxs,
            [list(sh) for sh in shapes],
            dtype_names,
            devs,
            grads,
            *(list(c) for c in stat_cols),
            paths,
            notes,
        ]
        tensors = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(t_cols, schema.TENSORS)],
            schema=schema.TENSORS.with_metadata(meta),
        )
        return ops, tensors

    def _caller(self, site: int) -> tuple[str | None, str | None]:
        c = self._callers.get(site)
        if c is None:
            if site < 0:
                c = (None, None)
            else:
                code, line = recorder.sites[site]
                c = (f"{code.co_filename}:{line}", getattr(code, "co_qualname", code.co_name))
            self._callers[site] = c
        return c
