"""The sender of a probed process: its log batches go to a ``pprobe collect`` server.

The log writer thread hands each batch it built to :meth:`Forwarder.submit`, which only
appends it to a queue (or, when the queue is over :data:`QUEUE_BYTES`, writes it to the local
spool): the writer never waits for the network, and the program's threads never touch it.
A thread of its own (``pprobe-collect``) sends the queue with Flight ``DoPut`` calls:

- a failed send is tried again ``retries`` times, with exponential backoff and jitter;
- consecutive failures open a circuit breaker (:mod:`.breaker`): no more tries until it
  turns half-open, and batches go to the spool (:mod:`.spool`) meanwhile;
- spooled batches are sent, oldest first, once a send succeeds again;
- at exit it waits at most ``drain_seconds`` for the queue and spool to drain; what is left
  stays in the spool (``pprobe collect --resend SPOOL --to URL`` sends it later).

Batches carry (client instance, batch id): the collector keeps each one once, so a batch sent
twice (a retry after a lost answer, a resend) is never a duplicate row.
pyarrow.flight is imported on the sender thread, and only when ``PPROBE_COLLECTOR`` is set.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from .. import _report, safefs, state
from . import breaker as _breaker
from . import spool as _spool
from . import wire

#: Bytes of batches the queue holds before new ones go straight to the spool.
QUEUE_BYTES = 64 << 20
#: Longest single call (seconds); shorter when the exit's drain deadline is nearer.
CALL_TIMEOUT_S = 5.0
#: The stream name of a spooled end record (a forked child's final figures).
END = "end"
#: Flight clients a forked child inherited from its parent (see Forwarder.after_fork_child).
_INHERITED: list[Any] = []
#: Dump bytes per DoPut batch.
DUMP_BATCH_BYTES = 8 << 20


def read_token(path: str) -> str | None:
    """The token in ``path`` (first line, stripped); None with one warning when unreadable.
    The token itself is never printed."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tok = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        _report.warn_once(
            "collector-token",
            f"PPROBE_COLLECTOR_TOKEN_FILE={path!r} cannot be read ({e.__class__.__name__}); "
            "the collector will refuse this process's batches, which stay in the spool.",
        )
        return None
    return tok or None


def encode_dump(path: str) -> tuple[str, bytes]:
    """(codec name, bytes) of one local dump, as sent to the collector.

    The one place where dumps are encoded for the wire. A local dump is already stored by its
    codec (:mod:`pprobe.codecs`: a plain .npy, or a self-describing encoded file), so its
    bytes are sent as they are and the collected file is the same file, which
    ``pprobe.load`` decodes alike; the name is ``codecs.codec_of(path)``, ``npy`` where
    pprobe.codecs is absent."""
    try:
        from .. import codecs  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        with open(path, "rb") as f:
            return "npy", f.read()
    data = codecs.read_bytes(path)  # a file, or an entry of the run's packs
    try:
        return str(codecs.codec_of(path)), data
    except Exception:
        return "npy", data


class Forwarder:
    """One process's sender: a queue, a thread, a breaker and a spool."""

    def __init__(
        self,
        config: Any,
        run_id: str,
        run_dir: str,
        host: str,
        run_folder: safefs.RunDir | None = None,
    ) -> None:
        self.url = config.collector
        self.token = read_token(config.collector_token_file)
        self.tls_root = config.collector_tls_root
        self.keep_local = config.collector_local == "keep"
        self.dumps = bool(config.collector_dumps)
        self.retries = config.collector_retries
        self.drain_s = config.collector_drain_seconds
        self.spool_path = config.collector_spool
        self.spool_limit = config.collector_spool_bytes
        self.permissions = config.permissions
        self.run_id, self.run_dir, self.host = run_id, run_dir, host
        self.run_folder = run_folder
        self.breaker = _breaker.Breaker(
            config.collector_breaker_failures, config.collector_breaker_seconds
        )
        self._init_process()

    def _init_process(self) -> None:
        self.pid = os.getpid()
        self.client_id = uuid.uuid4().hex[:16]
        self.next_id = 0
        self.cv = threading.Condition()
        self.queue: collections.deque[tuple[dict[str, Any], Any]] = collections.deque()
        self.queued_bytes = 0
        self.inflight: list[tuple[dict[str, Any], Any]] = []
        self.stopping = False
        self.deadline: float | None = None
        self.thread: threading.Thread | None = None
        self.spool: _spool.Spool | None = None
        self._spool_lock = threading.Lock()
        self.flight: Any = None
        self.client: Any = None
        self.options: Any = None
        self.rows_sent = self.batches_sent = self.bytes_sent = 0
        self.dumps_sent = 0
        self.failed_sends = 0
        self.last_error: str | None = None
        self.ended = False
        self.spool_only = False
        self.siblings: dict[str, _spool.Spool] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="pprobe-collect", daemon=True)
        self.thread.start()

    def after_fork_child(self) -> None:
        """A forked child is a new client (its own id, queue and thread). The parent's Flight
        client is kept, never closed or freed here: its destructor waits for gRPC threads
        that exist only in the parent, and would hang the child for good."""
        if self.client is not None:
            _INHERITED.append(self.client)
        grpc_ran = "pyarrow._flight" in sys.modules
        self.breaker = _breaker.Breaker(self.breaker.threshold, self.breaker.reset_s)
        self._init_process()
        # gRPC cannot be used again in a child forked after it ran (its threads are gone; with
        # GRPC_ENABLE_FORK_SUPPORT Arrow's build aborts): such a child writes its batches to
        # its spool, and a process of the run that can send (the parent) sends them.
        self.spool_only = grpc_ran
        if not self.spool_only:
            self.start()

    def close(
        self, exit_status: dict[str, Any] | None = None, process: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Drain for at most ``drain_seconds``, spool the rest; this process's figures.
        ``process`` (its procs/*.json content) goes to the collector with the end."""
        self.exit_status = exit_status
        self.process = process
        with self.cv:
            self.stopping = True
            self.deadline = time.monotonic() + self.drain_s
            self.cv.notify_all()
        t = self.thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=self.drain_s + CALL_TIMEOUT_S / 4)
        # Anything left over goes to the spool. A sender still stuck in a call (a collector
        # that accepts connections but never answers) has its batches spooled too: should
        # that call still succeed, the collector keeps each batch once all the same.
        self._spool_queue(with_inflight=t is not None and t.is_alive())
        if self.spool_only and not self.ended:
            self.ended = True
            self._spool_end()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        sp = self.spool
        return {
            "url": self.url,
            "client": self.client_id,
            "local": "keep" if self.keep_local else "drop",
            "rows_sent": self.rows_sent,
            "batches_sent": self.batches_sent,
            "bytes_sent": self.bytes_sent,
            "dumps_sent": self.dumps_sent,
            "failed_sends": self.failed_sends,
            "breaker": self.breaker.state,
            "breaker_opened": self.breaker.opened,
            "spool": sp.folder.path if sp is not None else None,
            "spooled_batches": len(sp) if sp is not None else 0,
            "rows_dropped": sp.rows_dropped if sp is not None else 0,
            "batches_dropped": sp.batches_dropped if sp is not None else 0,
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------ the writer's side
    def submit(self, stream: str, batch: Any) -> None:
        """Queue one batch (the log writer's thread calls this; it never blocks on I/O other
        than a local spool write when the queue is full). Never raises."""
        if not batch.num_rows:
            return
        try:
            self._submit(stream, batch)
        except Exception as e:
            _report.internal_error("handing a batch to the collector client", e)

    def _submit(self, stream: str, batch: Any) -> None:
        header = self._header(stream)
        if self.spool_only:
            self._to_spool(header, batch)
            if self.dumps and stream == "tensors" and "dump_path" in batch.schema.names:
                self._submit_dumps([p for p in batch.column("dump_path").to_pylist() if p])
            return
        size = batch.nbytes
        with self.cv:
            full = self.queued_bytes + size > QUEUE_BYTES
            if not full:
                self.queue.append((header, batch))
                self.queued_bytes += size
                self.cv.notify()
        if full:
            self._to_spool(header, batch)
        if self.dumps and stream == "tensors" and "dump_path" in batch.schema.names:
            names = [p for p in batch.column("dump_path").to_pylist() if p]
            if names:
                self._submit_dumps(names)

    def _submit_dumps(self, names: list[str]) -> None:
        rows: list[tuple[str, str, bytes]] = []
        size = 0
        for name in dict.fromkeys(names):
            try:
                codec, data = encode_dump(os.path.join(self.run_dir, name))
            except OSError as e:
                _report.internal_error("reading a dump for the collector", e)
                continue
            rows.append((name, codec, data))
            size += len(data)
            if size >= DUMP_BATCH_BYTES:
                self.submit("dumps", dump_batch(rows))
                rows, size = [], 0
        if rows:
            self.submit("dumps", dump_batch(rows))

    def _header(self, stream: str) -> dict[str, Any]:
        with self.cv:
            n = self.next_id
            self.next_id += 1
        return {
            "run": self.run_id,
            "host": self.host,
            "pid": self.pid,
            "rank": state.rank,
            "world_size": state.world_size,
            "stream": stream,
            "client": self.client_id,
            "batch": n,
        }

    # ------------------------------------------------------------------ the sender thread
    def _loop(self) -> None:
        state.local.depth = state.INTERNAL  # its own NumPy/pyarrow work is never recorded
        try:
            while True:
                with self.cv:
                    if not self.queue:
                        if self.stopping and (not self._spooled() or self._late()):
                            break
                        wait = self._idle_wait()
                        if wait > 0:
                            self.cv.wait(wait)
                    items = list(self.queue)
                    self.queue.clear()
                    self.queued_bytes = 0
                if items:
                    self._deliver(items)
                if self._spooled() and self.breaker.allow() and not self._late():
                    self._drain_spool()
            self._end()
        except BaseException as e:  # the sender must not die silently
            _report.internal_error("sending to the collector", e)
            self._spool_queue()

    def _idle_wait(self) -> float:
        """How long the sender sleeps with nothing queued: until the breaker lets a spooled
        batch be tried (and, at exit, no longer than the drain deadline)."""
        if self._spooled():
            wait = self.breaker.wait_s() if not self.breaker.allow() else 0.0
            if not self.stopping:
                wait = max(0.05, min(0.5, wait))
        else:
            wait = 0.5
        if self.deadline is not None:
            wait = min(wait, max(0.0, self.deadline - time.monotonic()))
        return wait

    def _late(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _remaining(self) -> float:
        if self.deadline is None:
            return CALL_TIMEOUT_S
        return max(0.0, min(CALL_TIMEOUT_S, self.deadline - time.monotonic()))

    def _spooled(self) -> bool:
        if self.spool is not None and len(self.spool) > 0:
            return True
        return any(sp.names() for sp in self._siblings())

    def _spool_root(self) -> str:
        return self.spool_path or os.path.join(self.run_dir, ".spool")

    def _siblings(self) -> list[_spool.Spool]:
        """The spools of this run's other processes on this host that cannot send (children
        forked after gRPC ran): this process sends their batches."""
        root = self._spool_root()
        own = f"{self.host}-{self.pid}"
        try:
            names = [n for n in os.listdir(root) if n != own and not n.startswith(".")]
        except OSError:
            return []
        for n in names:
            if n not in self.siblings:
                try:
                    folder = safefs.RunDir.open(os.path.join(root, n), self.permissions)
                except OSError:
                    continue
                self.siblings[n] = _spool.Spool(folder, self.spool_limit)
        return [self.siblings[n] for n in names if n in self.siblings]

    def _deliver(self, items: list[tuple[dict[str, Any], Any]]) -> None:
        """Send queued batches, grouped by stream and schema; what fails goes to the spool."""
        groups: list[list[tuple[dict[str, Any], Any]]] = []
        for h, b in items:
            last = groups[-1] if groups else None
            if last and last[0][0]["stream"] == h["stream"] and last[0][1].schema.equals(b.schema):
                last.append((h, b))
            else:
                groups.append([(h, b)])
        # Every taken batch stays in ``inflight`` until it is sent or spooled: close() spools
        # what is there when the sender is stuck in a call, the groups not tried yet
        # included (they are in no queue: a process exiting then lost them).
        with self.cv:
            self.inflight = list(items)
        for g in groups:
            with self.cv:
                if not self.inflight:  # close() spooled what was left: not sent twice
                    return
            ok = self._send(g)
            with self.cv:
                if not self.inflight:  # close() spooled them all, this group's too
                    return
                del self.inflight[: len(g)]  # the groups are ``items`` in order: g leads
                if not ok:  # under the lock: close() cannot spool them as well, or miss them
                    for h, b in g:
                        self._to_spool(h, b)

    def _drain_spool(self) -> None:
        import pyarrow as pa

        spools = ([self.spool] if self.spool is not None else []) + self._siblings()
        for sp in spools:
            for name in sp.names():
                if self.queue or not self.breaker.allow() or self._late():
                    return  # new batches first; the spool waits for the next round
                try:
                    h, b = sp.get(name)
                except (OSError, ValueError, KeyError, pa.ArrowException) as e:
                    _report.internal_error("reading the collector spool", e)
                    sp.set_aside(name)
                    continue
                ok = self._send_end(b) if h["stream"] == END else self._send([(h, b)])
                if not ok:
                    return
                sp.remove(name)

    def _send(self, group: list[tuple[dict[str, Any], Any]]) -> bool:
        """One DoPut with every batch of ``group``: tried ``retries`` times with backoff,
        while the breaker allows and the exit's deadline is not passed."""
        for attempt in range(self.retries):
            if not self.breaker.allow() or self._late():
                return False
            try:
                self._put(group)
            except Exception as e:
                self.failed_sends += 1
                self.last_error = f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}"
                self._reset_client()
                self.breaker.failure()
                if attempt + 1 < self.retries:
                    time.sleep(min(_breaker.backoff(attempt), self._remaining()))
                continue
            self.breaker.success()
            for h, b in group:
                self.batches_sent += 1
                self.bytes_sent += b.nbytes
                if h["stream"] == "dumps":
                    self.dumps_sent += b.num_rows
                else:
                    self.rows_sent += b.num_rows
            return True
        return False

    def _connect(self) -> None:
        if self.client is not None:
            return
        import pyarrow.flight as flight

        self.flight = flight
        kw: dict[str, Any] = {}
        if self.tls_root:
            with open(self.tls_root, "rb") as f:
                kw["tls_root_certs"] = f.read()
        self.client = flight.FlightClient(self.url, **kw)

    def _call_options(self) -> Any:
        headers = [(wire.AUTH.encode(), wire.bearer(self.token))] if self.token else []
        return self.flight.FlightCallOptions(headers=headers, timeout=max(0.2, self._remaining()))

    def _put(self, group: list[tuple[dict[str, Any], Any]]) -> None:
        import pyarrow as pa

        self._connect()
        fl = self.flight
        header = group[0][0]
        desc = fl.FlightDescriptor.for_command(wire.command(header))
        writer, reader = self.client.do_put(desc, group[0][1].schema, self._call_options())
        try:
            for h, b in group:
                writer.write_with_metadata(b, pa.py_buffer(wire.batch_meta(h["batch"])))
            writer.done_writing()
        finally:
            writer.close()  # raises what the collector answered, if it refused

    def _reset_client(self) -> None:
        """Drop the connection after a failure: a new channel reconnects at once when the
        collector is back (gRPC's own reconnect backoff can wait much longer)."""
        c, self.client = self.client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _end_body(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "host": self.host,
            "pid": self.pid,
            "rank": state.rank,
            "client": self.client_id,
            "exit": getattr(self, "exit_status", None),
            "process": getattr(self, "process", None),
            **{k: v for k, v in self.summary().items() if k not in ("url", "spool")},
        }

    def _end(self) -> None:
        """Tell the collector this process is done, with its figures (once, best effort)."""
        if self.ended or not self.breaker.allow():
            return
        self.ended = True
        try:
            self._action_end(json.dumps(self._end_body(), default=str).encode())
        except Exception as e:
            self.last_error = f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}"
        finally:
            self._reset_client()

    def _action_end(self, body: bytes) -> None:
        self._connect()
        action = self.flight.Action("end", body)
        list(self.client.do_action(action, self._call_options()))

    def _spool_end(self) -> None:
        """A spool-only child's end, as a spool file (stream ``end``, one JSON row)."""
        import numpy as np
        import pyarrow as pa

        from ..writer import _texts

        body = json.dumps(self._end_body(), default=str)
        b = pa.RecordBatch.from_arrays([_texts(pa, np, [body])], names=["body"])
        self._to_spool(self._header(END), b)

    def _send_end(self, batch: Any) -> bool:
        """Send a spooled end record of another process."""
        if not self.breaker.allow() or self._late():
            return False
        try:
            self._action_end(str(batch.column("body")[0].as_py()).encode())
        except Exception as e:
            self.last_error = f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}"
            self._reset_client()
            self.breaker.failure()
            return False
        self.breaker.success()
        return True

    # ------------------------------------------------------------------ the spool
    def _open_spool(self) -> _spool.Spool | None:
        with self._spool_lock:
            if self.spool is None:
                self.spool = self._make_spool()
            return self.spool

    def _make_spool(self) -> _spool.Spool | None:
        name = f"{self.host}-{self.pid}"
        try:
            if self.spool_path:
                return _spool.Spool.open(self.spool_path, name, self.spool_limit, self.permissions)
            else:
                folder = self.run_folder or safefs.RunDir.open(self.run_dir, self.permissions)
                sp = folder.subdir(".spool")
                try:
                    return _spool.Spool(sp.subdir(name), self.spool_limit)
                finally:
                    sp.close()
        except Exception as e:
            _report.internal_error("opening the collector spool", e)
            return None

    def _to_spool(self, header: dict[str, Any], batch: Any) -> None:
        sp = self._open_spool()
        try:
            if sp is None or not sp.put(header, batch):
                if sp is None:
                    return
                _report.warn_once(
                    "collector-spool-full",
                    f"the collector spool is full (PPROBE_COLLECTOR_SPOOL_BYTES="
                    f"{self.spool_limit}): batches are dropped and counted in meta.json "
                    "(collector.rows_dropped).",
                )
        except Exception as e:
            _report.internal_error("writing the collector spool", e)

    def _spool_queue(self, with_inflight: bool = False) -> None:
        with self.cv:
            items = list(self.queue)
            self.queue.clear()
            self.queued_bytes = 0
            if with_inflight:
                items = self.inflight + items
                self.inflight = []
        for h, b in items:
            self._to_spool(h, b)


def dump_batch(rows: list[tuple[str, str, bytes]]) -> Any:
    """(name, codec, data) rows as one Arrow batch, built from buffers: ``pa.array(list)``
    would import pandas into the program (see pprobe.writer._texts)."""
    import numpy as np
    import pyarrow as pa

    from ..writer import _texts

    datas = [r[2] for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, datas), dtype=np.int64, count=len(rows)), out=offsets[1:])
    data = pa.Array.from_buffers(
        pa.large_binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(datas))]
    )
    cols = [_texts(pa, np, [r[0] for r in rows]), _texts(pa, np, [r[1] for r in rows]), data]
    return pa.RecordBatch.from_arrays(cols, names=list(wire.DUMP_COLUMNS))


def start(session: Any) -> Forwarder:
    """The forwarder of ``session`` (pprobe.session.Session), started."""
    run = session.run
    f = Forwarder(session.config, run.id, run.dir, session.writer.host, run.folder)
    f.start()
    return f
