"""Helpers for the benchmark's child programs: read the arguments, stop the probe, report.

A child program is started by ``bench/harness.py`` as ``python bench/workloads/<name>.py
'<json args>'`` in a fresh interpreter, with or without pprobe's bootstrap on PYTHONPATH. It
prints one line ``BENCH_RESULT {json}`` on stdout. This module imports only the standard
library, so it never changes what the probe sees or how long start-up takes.

Under the probe it also meters pprobe's writer thread (CPU per op row written, see
``_Meter``): workloads import it first, before numpy or torch. The result line says which
recording engine ran (``probe.core``, read from the run's meta.json). A result with an
``unavailable`` key (a peer tool the variant needs is not installed, see ``_require``) makes
the harness report the variant ``unavailable``, not failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import time
from typing import Any

MARK = "BENCH_RESULT "
ARGS: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
#: "cpu": process CPU time (every thread of the child, pprobe's writer included), robust on a
#: machine that other processes share; "wall": elapsed time. The other is reported too.
CLOCK = ARGS.get("clock", "cpu")


class Span:
    """Times a block on both clocks; ``.s`` is the chosen one, ``.wall`` and ``.cpu`` both."""

    def __enter__(self) -> Span:
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c
        self.s = self.cpu if CLOCK == "cpu" else self.wall

    def put(self, out: dict[str, Any], key: str) -> None:
        """out[key] (chosen clock), out[key + '_wall'], out[key + '_cpu']."""
        out[key], out[key + "_wall"], out[key + "_cpu"] = self.s, self.wall, self.cpu


def session() -> Any:
    """pprobe's active session in this process, or None (probe absent or off)."""
    mod = sys.modules.get("pprobe.session")
    return None if mod is None else mod.Session.active


def rows_per_call(fn: Any, n: int = 200) -> float | None:
    """How many log rows ``fn(n)`` (n calls of one op) adds, per call; None without a probe.

    Flushes the writer before and after (outside any timing) so that every row is counted.
    """
    s = session()
    if s is None:
        return None
    drain(s)
    before = s.writer.rows_written
    fn(n)
    drain(s)
    return (s.writer.rows_written - before) / n


# ---------------------------------------------------------------------- the writer's CPU
#
# pprobe's writer thread ("pprobe-writer") turns the buffered records into Arrow batches and
# writes them. Its CPU per op row is read from the thread's own CPU clock at the end of the
# run (pthread_getcpuclockid; /proc/self/task/<tid>/stat as a fallback and a cross-check),
# less the one-time import of pyarrow (which the writer does on its first flush with rows),
# divided by the op rows that thread wrote. Every flush the benchmark asks for is handed to
# the writer thread (:func:`drain`), so that no row is written on another thread unless
# pprobe itself does so; the meter below counts those too.

#: pprobe's lazy imports on the writer's first flush, by who encodes the shards
#: (``Writer.log_writer``: pprobe's own encoder imports no pyarrow; a writer without that method
#: is an older tree, whose ``_to_batches`` and ``_Strings`` imported these three).
_WRITER_IMPORTS = ("pyarrow", "pyarrow._compute", "pprobe.schema")
_OWN_WRITER_IMPORTS = ("pprobe.arrowipc",)
_PYARROW_WRITER_IMPORTS = ("pyarrow", "pyarrow.ipc")


def _writer_imports(w: Any) -> tuple[str, ...]:
    which = getattr(w, "log_writer", None)
    if which is None:
        return _WRITER_IMPORTS
    return _OWN_WRITER_IMPORTS if which()[0] == "pprobe" else _PYARROW_WRITER_IMPORTS


class _Meter:
    """Wraps the session's ``writer.flush`` (an instance attribute: the writer thread's loop
    and ``Writer.close`` call ``self.flush()``) to count rows and CPU per thread, and to do
    the writer's one-time imports separately, on the same thread at the same moment (so the
    process does the same work) but timed apart from the per-row cost."""

    def __init__(self, s: Any) -> None:
        self.writer = w = s.writer
        self.real = w.flush
        self.batches_before = w.batches  # > 0: a flush ran before the meter (import unseen)
        self.rows_before = w.rows_written
        self.imports = _writer_imports(w)
        self.preloaded = [m for m in self.imports if m in sys.modules]
        self.import_cpu_s = 0.0
        self.imported = False
        self.flushes = 0
        self.rows_writer = 0  # op rows written by flushes on the writer thread
        self.cpu_writer = 0.0  # thread CPU inside those flushes (imports excluded)
        self.rows_other = 0  # op rows written by flushes on any other thread
        self.cpu_other = 0.0
        self.first: tuple[int, float] | None = None  # (rows, CPU s) of the first flush with rows
        #: flushes inside this wrapper: the real flush releases the writer's lock before the
        #: wrapper counts its rows, so :func:`drain` waits for this to be 0 as well
        self.busy = 0
        self._busy_lock = threading.Lock()
        w.flush = self.flush

    def flush(self) -> None:
        with self._busy_lock:
            self.busy += 1
        try:
            self._flush()
        finally:
            with self._busy_lock:
                self.busy -= 1

    def _flush(self) -> None:
        w = self.writer
        on_writer = threading.current_thread() is w.thread
        if not self.imported and len(_buffer()):
            self.imported = True
            c0 = time.thread_time()
            for m in self.imports:
                try:
                    importlib.import_module(m)
                except Exception:
                    pass
            self.import_cpu_s = time.thread_time() - c0
        r0, c0 = w.rows_written, time.thread_time()
        self.real()
        dc, dr = time.thread_time() - c0, w.rows_written - r0
        if dr:
            self.flushes += 1
            if self.first is None:
                self.first = (dr, dc)
        if on_writer:
            self.rows_writer += dr
            self.cpu_writer += dc
        else:
            self.rows_other += dr
            self.cpu_other += dc


_meter: _Meter | None = None


def _buffer() -> Any:
    rec = sys.modules.get("pprobe.recorder")
    return () if rec is None else rec.buffer


def drain(s: Any, timeout: float = 120.0) -> None:
    """Have the writer thread write every buffered row, and wait until it has.

    ``Writer.flush`` called here would run on this thread; the writer's CPU per row is
    measured on the writer thread, so the flush is handed to it (``wake``). Falls back to a
    flush on this thread when the writer thread is not running.
    """
    w = s.writer
    t = getattr(w, "thread", None)
    if t is None or not t.is_alive() or t is threading.current_thread():
        w.flush()
        return
    deadline = time.monotonic() + timeout
    while len(_buffer()):
        w.wake()
        if time.monotonic() > deadline:
            w.flush()
            return
        time.sleep(0.0005)
    with w.lock:  # the flush that took the last rows holds the lock until they are written
        pass
    while _meter is not None and _meter.busy and time.monotonic() < deadline:
        time.sleep(0.0005)  # ... and its wrapper counts them after releasing it


def _thread_cpu(t: threading.Thread) -> dict[str, Any]:
    """CPU seconds of a live thread of this process: its CPU clock, and /proc's ticks."""
    out: dict[str, Any] = {}
    try:
        out["clock_s"] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))  # type: ignore[arg-type]
    except Exception as e:
        out["clock_error"] = f"{type(e).__name__}: {e}"
    try:
        with open(f"/proc/self/task/{t.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[0] is field 3 (state): utime and stime are fields 14 and 15
        out["proc_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception as e:
        out["proc_error"] = f"{type(e).__name__}: {e}"
    return out


def writer_cost(s: Any) -> dict[str, Any]:
    """The writer thread's CPU and rows so far (call after :func:`drain`, before stop)."""
    w = s.writer
    t = getattr(w, "thread", None)
    if t is None or not t.is_alive():
        t = next((x for x in threading.enumerate() if x.name == "pprobe-writer"), None)
    out: dict[str, Any] = {"rows": w.rows_written, "batches": w.batches}
    if t is None or not t.is_alive():
        out["error"] = "no live pprobe-writer thread"
        return out
    cpu = _thread_cpu(t)
    out.update(cpu)
    total = cpu.get("clock_s", cpu.get("proc_s"))
    out["thread_cpu_s"] = total
    out["method"] = "pthread_getcpuclockid" if "clock_s" in cpu else "/proc/self/task/stat"
    m = _meter
    if m is None:
        out["error"] = "writer not metered"
        return out
    rows = m.rows_writer
    out.update(
        {
            "import_cpu_s": m.import_cpu_s,
            "flushes": m.flushes,
            "rows_writer_thread": rows,
            "rows_other_threads": m.rows_other,
            "flush_cpu_s": m.cpu_writer,
            "other_threads_flush_cpu_s": m.cpu_other,
            "rows_before_meter": m.rows_before,
            "preloaded": m.preloaded,
        }
    )
    if m.batches_before:
        out["note"] = "a flush ran before the meter: the one-time imports are not separated"
    if total is not None and rows:
        out["us_per_row"] = (total - m.import_cpu_s) / rows * 1e6
        out["flush_us_per_row"] = m.cpu_writer / rows * 1e6
    if m.first is not None:
        out["first_flush_rows"], out["first_flush_cpu_s"] = m.first
        later = rows - m.first[0]
        if later > 0:  # the first flush with rows pays more one-time work than the import
            out["later_flushes_us_per_row"] = (m.cpu_writer - m.first[1]) / later * 1e6
    return out


def writer_snapshot(s: Any) -> tuple[float | None, int]:
    """(CPU seconds of the writer thread so far, op rows written): take both after
    :func:`drain`; the difference of two snapshots is the writer's cost for those rows."""
    t = getattr(s.writer, "thread", None)
    if t is None or not t.is_alive():
        return None, s.writer.rows_written
    cpu = _thread_cpu(t)
    return cpu.get("clock_s", cpu.get("proc_s")), s.writer.rows_written


def writer_us_per_row(a: tuple[float | None, int], b: tuple[float | None, int]) -> float | None:
    """Writer CPU per op row between two :func:`writer_snapshot` s."""
    if a[0] is None or b[0] is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * 1e6


def _start_meter() -> None:
    global _meter
    s = session()
    if s is not None and _meter is None:
        try:
            _meter = _Meter(s)
        except Exception as e:  # a pprobe whose writer differs: report, do not fail the run
            sys.stderr.write(f"bench: writer meter not installed: {type(e).__name__}: {e}\n")


def calibrated(fn: Any, n_max: int, target_s: float, n_min: int = 200) -> int:
    """Calls per timed loop so that one loop takes about ``target_s`` (also the warm-up).

    A probed op can be 100x slower than the bare one: a fixed count would make the slow
    variants run for minutes.
    """
    probe = 500
    per_call = fn(probe) / 1e9 / probe
    return int(max(n_min, min(n_max, target_s / max(per_call, 1e-9))))


def finish_probe() -> tuple[float, dict[str, Any]]:
    """Stop pprobe as the program's exit would (flush the log, write meta.json).

    Returns the seconds it took and facts about what the probe did: which frameworks it
    installed, why torch was not probed when it was not, rows written, dumps, internal errors.
    """
    s = session()
    if s is None:
        return 0.0, {"active": False, "untouched": untouched()}
    installed = sorted(s.installed)
    coverage = json.loads(json.dumps(s.run.coverage, default=str))
    with Span() as sp:  # the program's exit would write these rows: counted in finish_s
        drain(s)
        writer = writer_cost(s)
        s.stop()
    dt = sp.s
    facts: dict[str, Any] = {
        "active": True,
        "installed": installed,
        "coverage": coverage,
        "config": {"mode": s.config.mode, "torch_levels": list(s.config.torch_levels)},
        "rows": s.writer.rows_written,
        "writer": writer,
        "dumps": s.dumper.summary() if s.dumper is not None else None,
        "run_dir": s.run.dir,
    }
    writer["rows_at_stop"] = s.writer.rows_written - writer["rows"]  # 0 after the drain
    try:
        with open(os.path.join(s.run.dir, "meta.json")) as f:
            facts["core"] = json.load(f).get("core")
    except Exception as e:
        facts["core_error"] = f"meta.json: {type(e).__name__}: {e}"
    report = sys.modules.get("pprobe._report")
    if report is not None and report.errors:
        facts["errors"] = [
            f"{e.get('where')}: {e.get('type', '')} {e.get('message', '')}".strip()
            for e in report.errors[:5]
        ]
    if "torch" in sys.modules and "torch" not in installed and "torch" in s.config.frameworks:
        facts["torch_error"] = _torch_probe_error()
    return dt, facts


def untouched() -> dict[str, bool]:
    """Whether the frameworks this process imported are exactly as without pprobe.

    With PPROBE=0 nothing may be patched: then the steady-state cost is zero by
    construction, whatever a noisy timing says.
    """
    out: dict[str, bool] = {"pprobe_session_imported": "pprobe.session" in sys.modules}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy_unpatched"] = type(np.add) is np.ufunc and type(np.mean).__module__ != "wrapt"
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.overrides import _get_current_function_mode_stack

        out["torch_no_mode"] = not _get_current_function_mode_stack()
    return out


def _torch_probe_error() -> str:
    """Why the torch interceptor is not installed (session.py hides a missing module)."""
    from pprobe import session as sess

    name = sess.INTERCEPTORS.get("torch", "?")
    try:
        importlib.import_module(name)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return f"{name} imports but was not installed"


def emit(result: dict[str, Any]) -> None:
    """Print the result line the harness parses (after stopping the probe, timed)."""
    dt, facts = finish_probe()
    result.setdefault("finish_s", 0.0)
    result["finish_s"] += dt
    result["probe"] = facts
    sys.stdout.write(MARK + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _require() -> None:
    """Report ``unavailable`` and exit when a module the variant needs is not installed.

    ``ARGS["requires"]`` maps top-level module names to what to install (a peer tool such as
    msprobe). Checked on import of this module, before the workload imports numpy or torch, so a
    missing peer costs no heavy import; the harness reads the ``unavailable`` key of the result.
    """
    for mod, install in (ARGS.get("requires") or {}).items():
        if importlib.util.find_spec(mod) is None:
            emit({"unavailable": f"{mod} is not installed ({install})"})
            raise SystemExit(0)


# Workloads import this module first, before numpy or torch: the meter must see the writer's
# first flush (the one that imports pyarrow).
_require()
_start_meter()
