"""Exporters: the hook tables and python.metrics forwarded to TensorBoard, CSV or any tracker.

An exporter is an object with ``log(values: dict[str, float], step: int)`` and ``close()``
(:class:`Exporter`). ``add(exporter)`` (or ``add("csv", path=...)``) makes it live: from then
on every row added to a forwarded table of schema ``python`` (``metrics`` and the built-in
hooks' tables, by default) reaches it, as scalars named ``<table>/<key>/<column>``
(``metrics`` rows as their ``name``).

The training thread only appends the rows to a bounded buffer (:class:`Forwarder`, a tap of
:mod:`pprobe.ext.tables`); a daemon thread, ``pprobe-export``, turns them into scalars and calls
the exporters. An exporter that raises is retried with exponential backoff; after
``max_retries`` failures in a row its circuit opens: it is not called for ``cooldown`` seconds,
then tried once again. Rows wait for it meanwhile; they are lost only when its buffer
(``buffer_rows``) is full, and then the count of dropped rows is recorded in ``python.errors``
(``event = 'dropped'``).
"""

from __future__ import annotations

import atexit
import collections
import csv
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import _report, state
from .base import BaseHook

#: Tables forwarded by default (``tables=`` changes it; ``"*"``: every table but errors).
DEFAULT_TABLES = ("metrics", "time_tracking", "system_monitor", "gradient_flow", "feature_maps")
#: Columns that name a value (parts of its tag), in tag order.
KEY_COLUMNS = ("event", "param", "module", "gpu", "name")
#: Columns never exported as values.
SKIP_COLUMNS = frozenset(("run_id", "pid", "rank", "step", "ts_ns", "epoch", "sampled_ts_ns",
                          "hook", "image", "shape"))  # fmt: skip
_NEVER = ("errors", "settings")


class Exporter:
    """The interface: ``log(values, step)`` sends one step's scalars; ``close()`` at the end.

    Called only from the exporter thread, one call at a time. Raising means "failed": the
    same values are offered again after a backoff."""

    name: str = ""

    def log(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        return None


def _run_path(path: str, default_dir: str = "logs") -> str:
    """``path`` relative to the run's ``logs`` folder (the ``logs_dir`` service), unless
    absolute; without a run, relative to the working directory."""
    if os.path.isabs(path):
        return path
    from . import dispatch

    base = dispatch.get_service("logs_dir")
    if not base:
        run = dispatch.get_service("experiment_dir")
        if not run:
            mod = sys.modules.get("pprobe.session")
            s = mod.Session.active if mod is not None else None
            run = s.run.dir if s is not None else None
        base = os.path.join(str(run), default_dir) if run else "."
    return os.path.join(str(base), path)


class CSVExporter(Exporter):
    """One CSV file in long form: ``step,tag,value,wall_time`` (a header when it is new)."""

    def __init__(self, path: str = "metrics.csv", name: str = "csv") -> None:
        self.path = path
        self.name = name
        self._f: Any = None
        self._w: Any = None

    def log(self, values: dict[str, float], step: int) -> None:
        if self._f is None:
            path = _run_path(self.path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            new = not os.path.exists(path) or os.path.getsize(path) == 0
            self._f = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - kept open
            self._w = csv.writer(self._f)
            if new:
                self._w.writerow(["step", "tag", "value", "wall_time"])
        now = time.time()
        for tag, v in values.items():
            self._w.writerow([step, tag, repr(v), f"{now:.6f}"])
        self._f.flush()

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()


class TensorBoardExporter(Exporter):
    """A TensorBoard ``SummaryWriter`` (torch.utils.tensorboard, else tensorboardX):
    ``add_scalar(tag, value, step)``. ``log_dir`` relative to the run's logs folder."""

    def __init__(self, log_dir: str = "tensorboard", name: str = "tensorboard",
                 flush_secs: int = 10) -> None:  # fmt: skip
        self.log_dir = log_dir
        self.name = name
        self.flush_secs = flush_secs
        self._w: Any = None

    def _writer(self) -> Any:
        if self._w is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                try:
                    from tensorboardX import SummaryWriter  # type: ignore[no-redef]
                except ImportError:
                    raise ImportError(
                        "TensorBoardExporter needs the tensorboard package (with torch) or "
                        "tensorboardX: pip install tensorboard"
                    ) from None
            self._w = SummaryWriter(log_dir=_run_path(self.log_dir), flush_secs=self.flush_secs)
        return self._w

    def log(self, values: dict[str, float], step: int) -> None:
        w = self._writer()
        for tag, v in values.items():
            w.add_scalar(tag, v, global_step=step)

    def flush(self) -> None:
        if self._w is not None:
            self._w.flush()

    def close(self) -> None:
        w, self._w = self._w, None
        if w is not None:
            w.close()


#: Exporter types by name (``add("csv", ...)``, ``[[exporters]] type = "csv"``).
TYPES: dict[str, type] = {
    "csv": CSVExporter,
    "CSVExporter": CSVExporter,
    "tensorboard": TensorBoardExporter,
    "TensorBoardExporter": TensorBoardExporter,
}


def create(type_name: str, **params: Any) -> Exporter:
    """An exporter of type ``type_name`` (one of :data:`TYPES`) with ``params``."""
    try:
        cls = TYPES[type_name]
    except KeyError:
        raise KeyError(
            f"unknown exporter type {type_name!r}; allowed: {', '.join(sorted(TYPES))}"
        ) from None
    try:
        return cls(**params)  # type: ignore[no-any-return]
    except TypeError as e:
        raise TypeError(f"exporter {type_name!r}: {e}") from None


# ---------------------------------------------------------------------- rows -> scalars
def to_scalars(table: str, rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """Rows of python.<table> -> [(step, {tag: value})], one entry per step, in order."""
    by_step: dict[int, dict[str, float]] = {}
    for r in rows:
        step = r.get("step")
        step = int(step) if isinstance(step, int) and not isinstance(step, bool) else 0
        out = by_step.setdefault(step, {})
        if table == "metrics":
            v = r.get("value")
            if isinstance(v, (int, float)) and not isinstance(v, bool) and r.get("name"):
                out[str(r["name"])] = float(v)
            continue
        key = [str(r[k]) for k in KEY_COLUMNS if r.get(k) is not None]
        prefix = "/".join([table, *key])
        for col, v in r.items():
            if col in SKIP_COLUMNS or col in KEY_COLUMNS or isinstance(v, bool):
                continue
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[f"{prefix}/{col}"] = float(v)
    return [(s, v) for s, v in by_step.items() if v]


# ---------------------------------------------------------------------- the forwarder
@dataclass
class _Target:
    exporter: Any
    pending: collections.deque[tuple[int, dict[str, float]]] = field(
        default_factory=collections.deque
    )
    failures: int = 0  # in a row
    retry_at: float = 0.0  # monotonic time before which it is not called
    broken: bool = False  # the circuit is open
    dropped: int = 0  # values lost to the buffer limit (not yet recorded)
    dropped_total: int = 0
    sent: int = 0
    reported: bool = False


class Forwarder:
    """The buffer, the ``pprobe-export`` thread and the exporters it calls."""

    def __init__(self, tables: Any = DEFAULT_TABLES, buffer_rows: int = 10_000,
                 max_retries: int = 5, backoff: float = 0.5, max_backoff: float = 30.0,
                 cooldown: float = 60.0, poll: float = 0.2,
                 thread: bool = True) -> None:  # fmt: skip
        self.tables: frozenset[str] | None = None if tables == "*" else frozenset(tables)
        self.buffer_rows = int(buffer_rows)
        self.max_retries = int(max_retries)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.cooldown, self.poll = float(cooldown), float(poll)
        self.targets: list[_Target] = []
        self._lock = threading.Lock()
        self._pump_lock = threading.Lock()
        self._queue: collections.deque[tuple[str, list[dict[str, Any]]]] = collections.deque()
        self._queued = 0  # rows in _queue
        self.dropped = 0  # rows dropped at the shared buffer (not yet recorded)
        self.dropped_total = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._threaded = thread  # False: the caller pumps (tests)

    # training thread: the tap (append, never wait)
    def tap(self, table: str, rows: list[dict[str, Any]]) -> None:
        if self._closed or table in _NEVER:
            return
        if self.tables is not None and table not in self.tables:
            return
        with self._lock:
            if self._queued + len(rows) > self.buffer_rows:
                self.dropped += len(rows)
                self.dropped_total += len(rows)
                return
            self._queue.append((table, rows))
            self._queued += len(rows)

    def add(self, exporter: Any) -> Any:
        for m in ("log", "close"):
            if not callable(getattr(exporter, m, None)):
                raise TypeError(f"an exporter needs a {m}() method; {exporter!r} has none")
        with self._lock:
            self.targets.append(_Target(exporter))
        self._start()
        return exporter

    def _start(self) -> None:
        from ..ext import tables

        if self.tap not in tables.taps:
            tables.taps.append(self.tap)
        if self._thread is None and self._threaded:
            self._thread = threading.Thread(target=self._loop, name="pprobe-export", daemon=True)
            self._thread.start()

    # the exporter thread
    def _loop(self) -> None:
        state.local.depth = state.INTERNAL  # nothing it does is recorded
        while not self._stop.is_set():
            self._wake.wait(self.poll)
            self._wake.clear()
            try:
                self.pump(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the program goes on
                _report.internal_error("forwarding rows to the exporters", e)

    def pump(self, now: float, final: bool = False, timeout: float = -1) -> bool:
        """Move the buffered rows to each exporter's queue, then send what may be sent (one
        thread at a time: the exporter thread, or the exit handler). False when another
        thread pumps for longer than ``timeout`` s (an exporter stuck in ``log``)."""
        from ..ext import tables  # imported by the time a Forwarder pumps (its start)

        tables._drain()  # values sampled on the program's thread become rows (and the tap)
        if not self._pump_lock.acquire(timeout=timeout):
            return False
        try:
            self._pump(now, final)
        finally:
            self._pump_lock.release()
        return True

    def _pump(self, now: float, final: bool) -> None:
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._queued = 0
            targets = list(self.targets)
        for table, rows in batch:
            for item in to_scalars(table, rows):
                for t in targets:
                    t.pending.append(item)
                    while len(t.pending) > self.buffer_rows:
                        t.pending.popleft()
                        t.dropped += 1
                        t.dropped_total += 1
        for t in targets:
            self._send(t, now, final)
        self._record_drops(targets)

    def _send(self, t: _Target, now: float, final: bool) -> None:
        if t.retry_at > now and not final:
            return
        while t.pending:
            step, values = t.pending[0]
            try:
                t.exporter.log(values, step)
            except Exception as e:  # noqa: BLE001 - an exporter never breaks the program
                t.failures += 1
                self._failed(t, e)
                if final:
                    return
                if t.failures >= self.max_retries:
                    t.broken = True
                    t.retry_at = now + self.cooldown
                else:
                    t.retry_at = now + min(self.max_backoff, self.backoff * 2 ** (t.failures - 1))
                return
            t.pending.popleft()
            t.sent += 1
            if t.failures or t.broken:
                self._event(t, "recovered", "", f"sending again after {t.failures} failures")
            t.failures, t.broken = 0, False

    def _name(self, t: _Target) -> str:
        return str(getattr(t.exporter, "name", "") or type(t.exporter).__name__)

    def _failed(self, t: _Target, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {e}"[:500]
        opening = t.failures >= self.max_retries and not t.broken
        if t.failures == 1 and not t.reported:
            t.reported = True
            _report._emit(f"pprobe: exporter {self._name(t)} raised {msg}; retried with "
                          f"backoff, its circuit opens after {self.max_retries} failures in a "
                          "row.")  # fmt: skip
            self._event(t, "raised", type(e).__name__, msg)
        elif opening:
            _report._emit(f"pprobe: exporter {self._name(t)} failed {t.failures} times in a row: "
                          f"circuit open, tried again in {self.cooldown:g} s.")  # fmt: skip
            self._event(t, "circuit open", type(e).__name__, msg)

    def _event(self, t: _Target | None, event: str, error: str, message: str,
               dropped: int | None = None) -> None:  # fmt: skip
        from ..ext import tables

        row: dict[str, Any] = {
            "source": "exporters" if t is None else f"exporter {self._name(t)}",
            "event": event, "error": error, "message": message,
            "failures": 0 if t is None else t.failures,
        }  # fmt: skip
        if dropped is not None:
            row["dropped"] = dropped
        tables._add("errors", [row])
        tables._activate()

    def _record_drops(self, targets: list[_Target]) -> None:
        with self._lock:
            n, self.dropped = self.dropped, 0
        if n:
            self._event(None, "dropped", "BufferFull",
                        f"{n} rows dropped: the exporters' buffer ({self.buffer_rows} rows) "
                        "was full", dropped=n)  # fmt: skip
        for t in targets:
            if t.dropped:
                n, t.dropped = t.dropped, 0
                self._event(t, "dropped", "BufferFull",
                            f"{n} steps of values dropped: its buffer ({self.buffer_rows}) "
                            "was full", dropped=n)  # fmt: skip

    def close(self, timeout: float = 10.0) -> None:
        """Send what is buffered (one try per exporter), close the exporters, stop the thread;
        values that could not be sent are counted as dropped in python.errors."""
        if self._closed:
            return
        from ..ext import tables

        try:  # rows recorded on the program's thread and not drained yet reach the tap first
            tables._drain()
        except Exception as e:  # noqa: BLE001 - the program goes on
            _report.internal_error("forwarding rows to the exporters", e)
        self._closed = True
        self._stop.set()
        self._wake.set()
        th = self._thread
        if th is not None and th.is_alive() and th is not threading.current_thread():
            th.join(timeout)
        if self.tap in tables.taps:
            tables.taps.remove(self.tap)
        prev = getattr(state.local, "depth", 0)
        state.local.depth = state.INTERNAL
        try:
            if not self.pump(time.monotonic(), final=True, timeout=timeout):
                _report._emit("pprobe: an exporter is still busy at the end; its rows are "
                              "counted as dropped.")  # fmt: skip
            for t in self.targets:
                if t.pending:
                    t.dropped += len(t.pending)
                    t.dropped_total += len(t.pending)
                    t.pending.clear()
                try:
                    t.exporter.close()
                except Exception as e:  # noqa: BLE001
                    self._event(t, "close failed", type(e).__name__, str(e)[:500])
            self._record_drops(self.targets)
        finally:
            state.local.depth = prev


_forwarder: Forwarder | None = None
_atexit = False


class _CloseAtCleanup(BaseHook):
    """Closes the exporters at the ``cleanup`` point (after every hook's ``after_training``,
    so their last rows are sent)."""

    def cleanup(self) -> None:
        close()


def forwarder(**settings: Any) -> Forwarder:
    """The process's forwarder (made on first use; ``settings`` apply only then)."""
    global _forwarder, _atexit
    if _forwarder is None or _forwarder._closed:
        _forwarder = Forwarder(**settings)
        from . import dispatch

        dispatch.add(_CloseAtCleanup(name="exporters"))
        if not _atexit:
            _atexit = True
            # registered after the session's own atexit handler, so it runs before it: what
            # is buffered is sent and the dropped counts reach python.errors before the
            # session's final flush (the exporters are closed at ``cleanup``, which the
            # session's stop emits after the hooks' last rows)
            atexit.register(_at_exit)
    return _forwarder


def _at_exit() -> None:
    f = _forwarder
    if f is None or f._closed:
        return
    prev = getattr(state.local, "depth", 0)
    state.local.depth = state.INTERNAL
    try:
        f.pump(time.monotonic(), final=True, timeout=5.0)
        for t in list(f.targets):
            flush = getattr(t.exporter, "flush", None)
            if callable(flush):
                try:
                    flush()
                except Exception:  # noqa: BLE001
                    pass
    except Exception as e:  # noqa: BLE001 - exit goes on
        _report.internal_error("sending the last rows to the exporters", e)
    finally:
        state.local.depth = prev


def add(exporter: Any, **params: Any) -> Any:
    """Make an exporter live: an object with ``log(values, step)`` and ``close()``, or a type
    name (``"csv"``, ``"tensorboard"``) built with ``params``. Returns the exporter."""
    if isinstance(exporter, str):
        exporter = create(exporter, **params)
    elif params:
        raise TypeError("parameters are given only with an exporter type name")
    return forwarder().add(exporter)


def from_config(entries: list[dict[str, Any]]) -> list[Any]:
    """Exporters from ``[[exporters]]`` entries (``type`` plus parameters)."""
    out = []
    for e in entries:
        params = dict(e)
        kind = params.pop("type", None)
        if not isinstance(kind, str):
            raise KeyError(f"an [[exporters]] entry needs a type; allowed: {', '.join(TYPES)}")
        out.append(add(kind, **params))
    return out


def close() -> None:
    """Flush and close every exporter (at exit, or earlier)."""
    f = _forwarder
    if f is not None:
        f.close()


def _reset() -> None:
    """Forget the forwarder (tests)."""
    global _forwarder
    f, _forwarder = _forwarder, None
    if f is not None:
        f.close()


__all__ = [
    "DEFAULT_TABLES",
    "CSVExporter",
    "Exporter",
    "Forwarder",
    "TensorBoardExporter",
    "add",
    "close",
    "create",
    "forwarder",
    "from_config",
    "to_scalars",
]
