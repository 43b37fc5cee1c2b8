"""``pprobe collect``: an Arrow Flight server that writes every client's batches into run folders.

Layout, as a local run (docs/output.md), under the output folder::

    {run id}/meta.json                         the collected run (processes, their exits)
    {run id}/procs/{host}-{pid}.json           one per process: rank, batches, rows, dropped
    {run id}/log/ops-{host}-{pid}.arrows       shards per host and pid (``.{k}`` after a
    {run id}/log/tensors-{host}-{pid}.arrows   collector restart: a new shard, never an append)
    {run id}/log/python/{table}-{host}-{pid}-{k}.arrows
    {run id}/{dump name}                        dumps, with PPROBE_COLLECTOR_DUMPS=1
    LATEST                                      the newest run, for ``pprobe query --run DIR``

Exactly once. Every batch is written with its identity (client instance, batch id) in the
shard as the batch's own custom metadata, in the same write: the shard is the index. A batch
already kept is answered as kept and not written again. When the collector starts on an
existing run folder it reads those identities back, and cuts a shard's tail that a killed
collector left half-written, so a batch is either whole in a shard (and known) or absent.

Safety. Run ids and host names from clients are reduced to ``[A-Za-z0-9._-]`` and never start
with a dot; every folder is opened relative to the output folder's descriptor with
``O_NOFOLLOW`` (:mod:`pprobe.safefs`): a symlink planted at a run folder's name is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from .. import safefs
from . import wire
from .observe import Log, Metrics

#: Seconds between rewrites of a process's procs/*.json while batches arrive.
PROCS_EVERY_S = 2.0
CLIENT_KEY = b"pprobe.client"
BATCH_KEY = b"pprobe.batch"


def safe_name(s: str, limit: int = 120) -> str:
    """A client-given name as one plain, visible path component."""
    out = re.sub(r"[^A-Za-z0-9._-]", "_", s)
    if out.startswith("."):
        out = "_" + out
    if len(out) > limit:
        out = out[: limit - 17] + "-" + hashlib.sha256(s.encode()).hexdigest()[:16]
    return out or "_"


class RunStore:
    """One run folder of the output: its shards, the identities it holds, its processes."""

    def __init__(self, base: safefs.RunDir, name: str, run_id: str, log: Log, m: Metrics) -> None:
        self.name, self.run_id, self.log_, self.m = name, run_id, log, m
        self.folder = base.subdir(name)  # O_NOFOLLOW: a planted symlink is refused here
        self.logdir = self.folder.subdir("log")
        self.pydir: safefs.RunDir | None = None
        self.lock = threading.Lock()
        self.seen: set[tuple[str, int]] = set()
        self.sinks: dict[tuple[str, str, int], tuple[Any, Any, pa.Schema]] = {}
        self.procs: dict[tuple[str, int], dict[str, Any]] = {}
        self.procs_written: dict[tuple[str, int], float] = {}
        self.start = time.time()
        self._recover()
        self.write_meta()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Identities of the batches already in this run's shards; half-written tails cut."""
        for d, _dirs, files in os.walk(self.logdir.path):
            if os.path.basename(d) == ".cache":
                continue
            for f in files:
                if f.endswith(".arrows"):
                    self._scan(os.path.join(d, f))
        if self.seen:
            self.log_.event("recovered", run=self.run_id, batches=len(self.seen))

    def _scan(self, path: str) -> None:
        st = os.lstat(path)
        if not os.path.isfile(path) or os.path.islink(path) or st.st_uid != os.getuid():
            return
        end = 0
        try:
            with pa.OSFile(path, "rb") as f:
                r = pa.ipc.open_stream(f)
                end = f.tell()
                while True:
                    try:
                        _b, meta = r.read_next_batch_with_custom_metadata()
                    except StopIteration:
                        return
                    end = f.tell()
                    if meta is not None and CLIENT_KEY in meta:
                        self.seen.add((meta[CLIENT_KEY].decode(), int(meta[BATCH_KEY])))
        except (OSError, ValueError, pa.ArrowException):
            pass
        if end < st.st_size:  # a tail a killed collector left: cut it (the file is ours)
            fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.ftruncate(fd, end)
            finally:
                os.close(fd)
            self.log_.event("truncated", run=self.run_id, shard=os.path.basename(path),
                            at=end, size=st.st_size)  # fmt: skip

    # ------------------------------------------------------------------ writing
    def put(self, h: dict[str, Any], batch_id: int, batch: pa.RecordBatch) -> bool:
        """Keep one batch; False when it was kept before (a duplicate)."""
        key = (h["client"], batch_id)
        with self.lock:
            if key in self.seen:
                self.m.dedup.inc()
                return False
            stream, host, pid = h["stream"], safe_name(h["host"]), h["pid"]
            if stream == "dumps":
                self._dumps(batch)
            else:
                w = self._sink(stream, host, pid, batch.schema)
                meta = {CLIENT_KEY: h["client"].encode(), BATCH_KEY: str(batch_id).encode()}
                w[0].write_batch(batch, custom_metadata=meta)
                w[1].flush()
            self.seen.add(key)
            p = self._proc(h, host)
            if stream != "dumps":
                p["rows"][stream] = p["rows"].get(stream, 0) + batch.num_rows
            p["batches"] += 1
            p["last_seen"] = time.time()
            if time.monotonic() - self.procs_written.get((host, pid), 0.0) > PROCS_EVERY_S:
                self._write_proc(host, pid)
        self.m.rows.labels(stream.split(".")[0]).inc(batch.num_rows if stream != "dumps" else 0)
        self.m.bytes.inc(batch.nbytes)
        self.m.batches.inc()
        return True

    def _proc(self, h: dict[str, Any], host: str) -> dict[str, Any]:
        k = (host, h["pid"])
        p = self.procs.get(k)
        if p is None:
            p = self.procs[k] = {"host": host, "pid": h["pid"], "rank": h.get("rank"),
                                 "world_size": h.get("world_size"), "clients": [],
                                 "rows": {}, "batches": 0, "first_seen": time.time(),
                                 "last_seen": None, "end": None}  # fmt: skip
            self.m.clients.inc()
            self.log_.event("client", run=self.run_id, host=host, pid=h["pid"], rank=h.get("rank"))
        if h["client"] not in p["clients"]:
            p["clients"].append(h["client"])
        if p["rank"] is None and h.get("rank") is not None:
            p["rank"] = h["rank"]
        return p

    def _sink(self, stream: str, host: str, pid: int, sch: pa.Schema) -> tuple[Any, Any, pa.Schema]:
        k = (stream, host, pid)
        s = self.sinks.get(k)
        if s is not None and s[2].equals(sch, check_metadata=False):
            return s
        if s is not None:  # a python.* table whose columns changed: a new shard
            s[0].close()
            s[1].close()
        if stream.startswith("python."):
            if self.pydir is None:
                self.pydir = self.logdir.subdir("python")
            folder, table = self.pydir, stream.split(".", 1)[1]
            names = (f"{table}-{host}-{pid}-{i}.arrows" for i in range(1 << 20))
        else:
            folder = self.logdir
            names = (f"{stream}-{host}-{pid}{'.' + str(i) if i else ''}.arrows"
                     for i in range(1 << 20))  # fmt: skip
        for name in names:
            try:
                f = folder.create_for(name, lambda p: pa.OSFile(p, "ab"))
                break
            except FileExistsError:
                continue
        opts = pa.ipc.IpcWriteOptions(compression="lz4")
        w = pa.ipc.new_stream(f, sch, options=opts)
        s = self.sinks[k] = (w, f, sch)
        return s

    def _dumps(self, batch: pa.RecordBatch) -> None:
        names = batch.column("name").to_pylist()
        datas = batch.column("data")
        for i, name in enumerate(names):
            if not isinstance(name, str) or safe_name(name, 200) != name:
                raise wire.BadHeader(f"dump name {name!r} is not a plain file name")
            if self.folder.lstat(name) is not None:
                continue  # sent before (a retry): the file is whole, it was renamed in place
            self.folder.replace_atomic(name, datas[i].as_py())

    # ------------------------------------------------------------------ metadata
    def end(self, body: dict[str, Any]) -> None:
        host, pid = safe_name(str(body.get("host"))), body.get("pid")
        with self.lock:
            p = self.procs.get((host, pid)) if isinstance(pid, int) else None
            if p is None and isinstance(pid, int):
                p = self._proc({"client": str(body.get("client")), "pid": pid,
                                "rank": body.get("rank")}, host)  # fmt: skip
            if p is None or not isinstance(pid, int):
                raise wire.BadHeader("'pid' must be an integer")
            keep = ("exit", "rows_sent", "rows_dropped", "batches_dropped", "spooled_batches",
                    "failed_sends", "breaker_opened")  # fmt: skip
            p["end"] = {k: body.get(k) for k in keep}
            if isinstance(body.get("process"), dict):  # the process's own procs/*.json
                p["process"] = body["process"]
            self._write_proc(host, pid)
            self.write_meta()
        fields: dict[str, Any] = {
            k: body.get(k) for k in ("rows_sent", "rows_dropped", "spooled_batches")
        }
        self.log_.event("client-end", run=self.run_id, host=host, pid=pid, **fields)
        if body.get("rows_dropped"):
            self.log_.event("rows-dropped", level="warning", run=self.run_id, host=host,
                            pid=pid, rows=body.get("rows_dropped"))  # fmt: skip

    def _write_proc(self, host: str, pid: int) -> None:
        procs = self.folder.subdir("procs")
        try:
            data = json.dumps(self.procs[(host, pid)], indent=1, default=str).encode()
            procs.replace_atomic(f"{host}-{pid}.json", data)
        finally:
            procs.close()
        self.procs_written[(host, pid)] = time.monotonic()

    def write_meta(self, final: bool = False) -> None:
        procs = list(self.procs.values())
        ended = [p for p in procs if p["end"] is not None]
        if procs and len(ended) == len(procs):
            bad = [p["end"].get("exit") for p in ended
                   if (p["end"].get("exit") or {}).get("status") not in ("ok", None)]  # fmt: skip
            exit_ = bad[0] if bad else {"status": "ok", "code": 0}
        else:
            exit_ = {"status": "collector stopped" if final else "running"}
        meta = {
            "run_id": self.run_id,
            "collected": True,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": self.start,
            "end": time.time() if final or len(ended) == len(procs) else None,
            "exit": exit_,
            "processes": len(procs),
            "ranks": sorted({p["rank"] for p in procs if p["rank"] is not None}),
            "rows_written": sum(p["rows"].get("ops", 0) for p in procs),  # as a local run's
            "rows_dropped": sum((p["end"] or {}).get("rows_dropped") or 0 for p in procs),
        }
        self.folder.replace_atomic("meta.json", json.dumps(meta, indent=1).encode())

    def close(self) -> None:
        with self.lock:
            for w, f, _s in self.sinks.values():
                try:
                    w.close()  # the end-of-stream marker
                    f.close()
                except Exception:
                    pass
            self.sinks.clear()
            for host, pid in list(self.procs):
                self._write_proc(host, pid)
            self.write_meta(final=True)
            for d in (self.pydir, self.logdir, self.folder):
                if d is not None:
                    d.close()


class _AuthFactory(flight.ServerMiddlewareFactory):
    """Every call must carry ``authorization: Bearer <token>``; any other is refused."""

    def __init__(self, token: str, log: Log, m: Metrics) -> None:
        super().__init__()
        self.expected = wire.bearer(token)
        self.log, self.m = log, m

    def start_call(self, info: Any, headers: dict[str, Any]) -> None:
        import hmac

        for v in headers.get(wire.AUTH, []):
            got = v.encode() if isinstance(v, str) else bytes(v)
            if hmac.compare_digest(got, self.expected):
                return None
        self.m.errors.labels("auth").inc()
        self.log.event("refused", level="warning", method=str(info.method), why="no valid token")
        raise flight.FlightUnauthenticatedError("pprobe collect: a valid token is required")


class Collector(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        output: str,
        token: str,
        log: Log,
        metrics: Metrics,
        tls: tuple[bytes, bytes] | None = None,
        permissions: str = "private",
    ) -> None:
        kw: dict[str, Any] = {}
        if tls is not None:
            kw["tls_certificates"] = [flight.CertKeyPair(cert=tls[0], key=tls[1])]
        super().__init__(location, middleware={"auth": _AuthFactory(token, log, metrics)}, **kw)
        self.base = safefs.open_base(output, permissions)
        self.output = output
        self.log, self.m = log, metrics
        self.runs: dict[str, RunStore] = {}
        self.lock = threading.Lock()
        self.latest: str | None = None

    def _run(self, run_id: str) -> RunStore:
        name = safe_name(run_id)
        with self.lock:
            r = self.runs.get(name)
            if r is None:
                r = self.runs[name] = RunStore(self.base, name, run_id, self.log, self.m)
                self.log.event("run", run=run_id, folder=os.path.join(self.output, name))
            if self.latest != name:
                self.latest = name
                self.base.replace_atomic("LATEST", name.encode() + b"\n")
        return r

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        t0 = time.perf_counter()
        try:
            h = wire.parse_command(descriptor.command or b"")
            run = self._run(h["run"])
            kept = dups = rows = 0
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                if chunk.data is None:
                    continue
                bid = wire.parse_batch_meta(chunk.app_metadata)
                if run.put(h, bid, chunk.data):
                    kept += 1
                    rows += chunk.data.num_rows
                else:
                    dups += 1
            if dups:
                self.log.event("duplicates", run=h["run"], host=h["host"], pid=h["pid"],
                               stream=h["stream"], batches=dups)  # fmt: skip
        except wire.BadHeader as e:
            self.m.errors.labels("refused").inc()
            self.log.event("refused", level="warning", why=str(e), peer=context.peer())
            raise flight.FlightServerError(f"pprobe collect: refused: {e}") from None
        except safefs.UnsafeFolder as e:
            self.m.errors.labels("refused").inc()
            self.log.event("refused", level="warning", why=e.strerror, peer=context.peer())
            raise flight.FlightServerError(f"pprobe collect: refused: {e.strerror}") from None
        except flight.FlightError:
            raise
        except Exception as e:
            self.m.errors.labels("internal").inc()
            self.log.event("error", level="error", why=f"{e.__class__.__name__}: {e}")
            raise flight.FlightServerError(f"pprobe collect: {e.__class__.__name__}: {e}") from None
        finally:
            self.m.latency.labels("DoPut").observe(time.perf_counter() - t0)

    def do_action(self, context: Any, action: Any) -> list[Any]:
        t0 = time.perf_counter()
        try:
            if action.type != "end":
                raise flight.FlightServerError(f"pprobe collect: unknown action {action.type!r}")
            try:
                body = json.loads(action.body.to_pybytes())
                if not isinstance(body, dict) or not isinstance(body.get("run"), str):
                    raise ValueError
                self._run(body["run"]).end(body)
            except (ValueError, wire.BadHeader, safefs.UnsafeFolder):
                self.m.errors.labels("refused").inc()
                raise flight.FlightServerError(
                    "pprobe collect: refused: a bad 'end' body"
                ) from None
            return []
        finally:
            self.m.latency.labels("DoAction").observe(time.perf_counter() - t0)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("end", "a process is done: its final figures (JSON)")]

    def close_all(self) -> None:
        """Every shard closed, every meta.json written: after this, all kept batches are on disk."""
        with self.lock:
            for r in self.runs.values():
                try:
                    r.close()
                except Exception as e:
                    self.log.event("error", level="error", why=f"closing {r.name}: {e}")
            self.runs.clear()
            self.base.close()


def location(host: str, port: int, tls: bool) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"grpc+{'tls' if tls else 'tcp'}://{h}:{port}"


def _stderr() -> Any:
    return sys.stderr
