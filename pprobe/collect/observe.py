"""The collector's log lines and Prometheus metrics.

:class:`Log` writes one line per event to stderr: ``pprobe collect: event key=value ...``, or
with ``--log-json`` one JSON object per line (``ts``, ``level``, ``event`` and the fields).
:class:`Metrics` are prometheus_client counters when it is installed and ``--metrics-port``
is given (served on 127.0.0.1 only), else objects that count nothing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO


class Log:
    def __init__(self, as_json: bool = False, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.stream = stream
        self.lock = threading.Lock()

    def event(self, event: str, level: str = "info", **fields: Any) -> None:
        out = self.stream or sys.stderr
        if self.as_json:
            rec = {"ts": round(time.time(), 6), "level": level, "event": event, **fields}
            line = json.dumps(rec, default=str, sort_keys=False)
        else:
            kv = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            tag = "" if level == "info" else f"{level}: "
            line = f"pprobe collect: {tag}{event} {kv}".rstrip()
        with self.lock:
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass


class _Nothing:
    """A metric that counts nothing (prometheus_client absent or no --metrics-port)."""

    def labels(self, *a: Any, **k: Any) -> _Nothing:
        return self

    def inc(self, n: float = 1) -> None:
        pass

    def dec(self, n: float = 1) -> None:
        pass

    def observe(self, v: float) -> None:
        pass


class Metrics:
    """clients, rows, bytes, batches, deduplicated batches, errors and request latency."""

    clients: Any
    rows: Any
    bytes: Any
    batches: Any
    dedup: Any
    errors: Any
    latency: Any

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry
        if registry is None:
            n = _Nothing()
            self.clients = self.rows = self.bytes = self.batches = n
            self.dedup = self.errors = self.latency = n
            return
        from prometheus_client import Counter, Histogram

        r = registry
        self.clients = Counter("pprobe_collect_clients", "Processes that sent batches", registry=r)
        self.rows = Counter("pprobe_collect_rows", "Rows received and kept", ["stream"], registry=r)
        self.bytes = Counter("pprobe_collect_bytes", "Arrow bytes received and kept", registry=r)
        self.batches = Counter("pprobe_collect_batches", "Batches received and kept", registry=r)
        self.dedup = Counter(
            "pprobe_collect_batches_deduplicated", "Batches received again and not kept",
            registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "pprobe_collect_errors", "Calls refused or failed", ["kind"], registry=r
        )
        self.latency = Histogram(
            "pprobe_collect_request_seconds", "Time per call", ["method"], registry=r
        )

    @classmethod
    def serve(cls, port: int) -> tuple[Metrics, Any]:
        """Metrics served at http://127.0.0.1:port/metrics; (Metrics, server) ."""
        from prometheus_client import CollectorRegistry, start_http_server

        reg = CollectorRegistry()
        m = cls(reg)
        server = start_http_server(port, addr="127.0.0.1", registry=reg)
        return m, server
