"""The built-in hooks: TimeTracking, SystemMonitor, GradientFlow and FeatureMap.

Each writes its rows to a table of schema ``python`` through the extension API
(:func:`pprobe.ext.tables.record`): ``python.time_tracking``, ``python.system_monitor``,
``python.gradient_flow`` and ``python.feature_maps`` (docs/hooks-builtin.md lists the columns).
Every row carries the hook's ``name`` in column ``hook`` and the step (or epoch) of the point
that made it in ``step`` (``epoch``). Hooks never change the program's results: they read
tensors (detached, under ``torch.no_grad``), never write them, and run with recording off.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import math
import operator
import os
import struct
import sys
import threading
import time
import zlib
from typing import Any

from .. import core, state
from . import dispatch
from .base import BaseHook, HookRegistry

# ---------------------------------------------------------------------- shared helpers
_tables: Any = None  # pprobe.ext.tables once imported (no importlib call per row)


def _ext_tables() -> Any:
    global _tables
    if _tables is None:
        from ..ext import tables

        _tables = tables
    return _tables


def record(table: str, rows: Any) -> None:
    """Rows into python.<table> (the extension API; exporters see them through its tap).
    The built-in hooks' own rows (a dict or a list of dicts with str keys, under a valid
    table name, or a ``(make, args)`` maker: :func:`record_later`): the checks
    ``pprobe.record`` makes of a user's rows are skipped."""
    t = _ext_tables()
    t.defer(table, [rows] if type(rows) is dict else rows)
    t._activate()


def record_later(table: str, make: Any, *args: Any) -> None:
    """Rows into python.<table> that ``make(*args)`` makes off the caller's thread, at the
    tables' next take (the flush), in the order they were deferred, with the standard
    columns of this call (step, rank, time): the caller's thread pays one append. ``args``
    must hold what the rows need as it is now (it is read later)."""
    record(table, (make, args))


def record_columns(table: str, cols: dict[str, list[Any]]) -> None:
    """Rows into python.<table> given column by column (lists of one length; as
    :func:`record`'s rows: the built-in hooks' own): no dict per row on the caller's thread,
    none at the flush. No rows (empty lists): nothing."""
    if any(cols.values()):
        t = _ext_tables()
        t._add_columns(table, cols)
        t._activate()


def run_dir(hook: BaseHook) -> str | None:
    """The run folder: the ``experiment_dir`` service, else the active session's run."""
    d = hook.get_service("experiment_dir")
    if d:
        return str(d)
    mod = sys.modules.get("pprobe.session")
    s = mod.Session.active if mod is not None else None
    return s.run.dir if s is not None else None


def service_dir(hook: BaseHook, service: str, default: str) -> str | None:
    """The folder of service ``service`` (logs_dir, visualization_dir), else
    ``<run folder>/<default>``; made if missing. None without a run folder."""
    d = hook.get_service(service)
    if not d:
        base = run_dir(hook)
        if base is None:
            return None
        d = os.path.join(base, default)
    os.makedirs(str(d), exist_ok=True)
    return str(d)


def _torch() -> Any:
    """torch when the program imported it (a hook never imports it)."""
    return sys.modules.get("torch")


def _plain(torch: Any, tensors: list[Any]) -> Any:
    """A context for the hooks' own torch calls: ``torch._C.DisableTorchFunction`` (no
    ``__torch_function__`` mode, pprobe's interceptor included, sees them: about half of their
    cost under the probe) when every tensor is a plain tensor; a tensor subclass (DTensor, ...)
    keeps its dispatch, so then nothing is disabled."""
    tensor, param = torch.Tensor, torch.nn.Parameter
    for t in tensors:  # a loop, not all(genexpr): this runs several times a step
        c = type(t)
        if c is not tensor and c is not param:
            return contextlib.nullcontext()
    return torch._C.DisableTorchFunction()


# ---------------------------------------------------------------------- TimeTrackingHook
@HookRegistry.register("TimeTrackingHook")
class TimeTrackingHook(BaseHook):
    """Step and epoch durations, throughput and ETA, into python.time_tracking.

    ``batch_size``: samples per step (else the ``train_loader`` service's ``batch_size``);
    with it throughput is samples/s, without it steps/s. ``total_steps`` / ``total_epochs``
    (else ``len(train_loader) * total_epochs``): with a total, ETA in seconds.
    ``log_to_file``: also one line per row to ``log_path`` (relative to the run's logs folder
    unless absolute).
    """

    def __init__(self, name: str | None = None, frequency: int = 1, log_to_file: bool = False,
                 log_path: str = "time_tracking.log", batch_size: int | None = None,
                 total_steps: int | None = None, total_epochs: int | None = None,
                 **params: Any) -> None:  # fmt: skip
        super().__init__(name, frequency, **params)
        self.log_to_file = bool(log_to_file)
        self.log_path = log_path
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.total_epochs = total_epochs
        self._t_train: float | None = None
        self._last: tuple[int, float] | None = None  # (step, time) of the last after_step
        self._first: tuple[int, float] | None = None  # (step, time) of the first after_step
        self._t_epoch: dict[int, float] = {}
        self._file: Any = None

    # the numbers
    def _batch(self, loader: Any) -> int | None:
        """Samples per step; ``loader``: the train_loader service."""
        if self.batch_size:
            return int(self.batch_size)
        bs = getattr(loader, "batch_size", None)
        return int(bs) if isinstance(bs, int) and bs > 0 else None

    def _total(self, loader: Any) -> int | None:
        """Steps in the run, when known; ``loader``: the train_loader service."""
        if self.total_steps:
            return int(self.total_steps)
        if self.total_epochs and loader is not None:
            try:
                return int(self.total_epochs) * len(loader)
            except TypeError:
                return None
        return None

    def before_training(self, model: Any = None) -> None:
        self._t_train = time.perf_counter()

    # The points take their times and what the rows need now; the rows (and their log
    # lines) are made off the training thread, at the tables' next flush, in order
    # (record_later). No before_step of its own: a step's duration runs from its
    # before_step point, which dispatch stamps whether or not a hook is called there
    # (dispatch.step_opened), so the step this hook fires at makes no before_step call.
    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None:
        now_ns = time.perf_counter_ns()
        if self._t_train is None:
            self._t_train = now_ns / 1e9  # time.perf_counter()'s clock
        opened = dispatch.step_opened_ns if dispatch.step_opened == step else None
        loader = None if self.batch_size and self.total_steps else dispatch.get_service(
            "train_loader")  # fmt: skip
        record_later("time_tracking", self._step_rows, step, now_ns, opened,
                     dispatch.get_service("epoch"), loader)  # fmt: skip

    def _step_rows(self, step: int, now_ns: int, opened: int | None, epoch: Any,
                   loader: Any) -> list[dict[str, Any]]:  # fmt: skip
        now = now_ns / 1e9
        duration = None if opened is None else (now_ns - opened) / 1e9
        avg = None  # the mean step time since the last row (covers untimed steps)
        if self._last is not None and step > self._last[0]:
            avg = (now - self._last[1]) / (step - self._last[0])
        per_step = avg if avg is not None else duration
        t_train = self._t_train if self._t_train is not None else now
        row: dict[str, Any] = {"hook": self.name, "event": "step", "step": step,
                               "epoch": epoch, "duration_s": duration,
                               "avg_step_s": avg, "elapsed_s": now - t_train,
                               "steps_per_s": None, "samples_per_s": None,
                               "eta_s": None}  # fmt: skip
        if per_step:
            row["steps_per_s"] = 1.0 / per_step
            bs = self._batch(loader)
            if bs:
                row["samples_per_s"] = bs / per_step
        total = self._total(loader)
        if total is not None and self._first is not None and step > self._first[0]:
            mean = (now - self._first[1]) / (step - self._first[0])
            row["eta_s"] = max(0, total - step - 1) * mean
        if self._first is None:
            self._first = (step, now)
        self._last = (step, now)
        return self._logged(row)

    def before_epoch(self, epoch: int, model: Any = None) -> None:
        self._t_epoch[epoch] = time.perf_counter()

    def after_epoch(self, epoch: int, model: Any = None, metrics: Any = None) -> None:
        t0 = self._t_epoch.pop(epoch, None)
        now = time.perf_counter()
        row: dict[str, Any] = {"hook": self.name, "event": "epoch", "epoch": epoch,
                               "duration_s": None if t0 is None else now - t0,
                               "elapsed_s": None if self._t_train is None
                               else now - self._t_train}  # fmt: skip
        if self.total_epochs and t0 is not None and self._t_train is not None:
            row["eta_s"] = max(0, int(self.total_epochs) - epoch - 1) * (now - t0)
        record_later("time_tracking", self._logged, row)

    def after_training(self, model: Any = None, metrics: Any = None) -> None:
        if self._t_train is not None:
            now = time.perf_counter()
            record_later("time_tracking", self._logged,
                         {"hook": self.name, "event": "training",
                          "duration_s": now - self._t_train,
                          "elapsed_s": now - self._t_train})  # fmt: skip
        self.cleanup()

    def cleanup(self) -> None:
        # the rows still deferred first (their log lines go to the file this closes)
        _ext_tables()._take_recorded()
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def _logged(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """``row`` as the rows a maker returns, its line written to the log file first."""
        if self.log_to_file:
            self._log_line(row)
        return [row]

    def _log_line(self, row: dict[str, Any]) -> None:
        if self._file is None:
            path = self.log_path
            if not os.path.isabs(path):
                logs = service_dir(self, "logs_dir", "logs")
                if logs is None:
                    return
                path = os.path.join(logs, path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        parts = [f"{row['event']}"]
        for k in ("step", "epoch"):
            if row.get(k) is not None:
                parts.append(f"{k}={row[k]}")
        for k, unit in (("duration_s", "s"), ("avg_step_s", "s"), ("steps_per_s", "/s"),
                        ("samples_per_s", "/s"), ("eta_s", "s"), ("elapsed_s", "s")):  # fmt: skip
            v = row.get(k)
            if v is not None:
                parts.append(f"{k[:-2] if unit == 's' else k}={v:.6g}{unit}")
        self._file.write(" ".join(parts) + "\n")
        self._file.flush()


# ---------------------------------------------------------------------- SystemMonitorHook
def _proc_cpu_s() -> float:
    return time.process_time()


def _proc_rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _proc_meminfo() -> tuple[int, int] | None:
    """(total, available) bytes from /proc/meminfo."""
    try:
        got: dict[str, int] = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                got[k] = int(rest.split()[0]) * 1024
        return got["MemTotal"], got.get("MemAvailable", got.get("MemFree", 0))
    except (OSError, ValueError, KeyError, IndexError):
        return None


class _Sampler:
    """The sampling thread: reads CPU, memory and GPU every ``interval`` s, keeps the last."""

    def __init__(self, hook: SystemMonitorHook) -> None:
        self.hook = hook
        #: the last sample as the rows' columns after ``hook``, ``event`` and ``step`` /
        #: ``epoch``: one dict per GPU (one without GPU columns on a machine without one),
        #: made here on the sampling thread; replaced by the next sample, never changed
        self.rows: list[dict[str, Any]] = [{}]
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="pprobe-sysmon", daemon=True)
        try:
            import psutil

            self.ps: Any = psutil.Process()
            self.psutil: Any = psutil
            self.ps.cpu_percent(None)  # the first call only starts the interval
        except Exception:  # not installed (it is no dependency): /proc
            self.ps = self.psutil = None
        self.nvml: Any = None
        if hook.track_gpu or hook.track_gpu_memory:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
            except Exception:
                self.nvml = None
        self._cpu0 = (time.monotonic(), _proc_cpu_s())

    def start(self) -> None:
        self.sample()
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    def _loop(self) -> None:
        state.local.depth = state.INTERNAL  # nothing this thread does is recorded
        while not self.stopping.wait(self.hook.interval):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - the program goes on
                from .. import _report

                _report.internal_error(f"hook {self.hook.name} sampling", e)
                return

    def sample(self) -> None:
        h = self.hook
        s: dict[str, Any] = {"sampled_ts_ns": time.time_ns()}
        if h.track_cpu:
            if self.ps is not None:
                s["cpu_percent"] = float(self.ps.cpu_percent(None))
            else:
                t, c = time.monotonic(), _proc_cpu_s()
                dt = t - self._cpu0[0]
                s["cpu_percent"] = 100.0 * (c - self._cpu0[1]) / dt if dt > 0 else 0.0
                self._cpu0 = (t, c)
        if h.track_memory:
            if self.ps is not None:
                s["rss_bytes"] = int(self.ps.memory_info().rss)
                vm = self.psutil.virtual_memory()
                s["sys_mem_total_bytes"] = int(vm.total)
                s["sys_mem_used_bytes"] = int(vm.total - vm.available)
            else:
                s["rss_bytes"] = _proc_rss()
                mi = _proc_meminfo()
                if mi is not None:
                    s["sys_mem_total_bytes"] = mi[0]
                    s["sys_mem_used_bytes"] = mi[0] - mi[1]
            if s.get("sys_mem_total_bytes"):
                s["sys_mem_percent"] = 100.0 * s["sys_mem_used_bytes"] / s["sys_mem_total_bytes"]
        if h.track_gpu or h.track_gpu_memory:
            s["gpus"] = self._gpus()
        gpus = s.pop("gpus", None) or [{}]
        self.rows = [{**s, **g} for g in gpus]
        self.samples += 1

    def _gpus(self) -> list[dict[str, Any]]:
        """One dict per GPU: pynvml when present, else torch.cuda's allocator (no
        utilisation), else none. torch.cuda is read only when the program initialised it."""
        h = self.hook
        out: list[dict[str, Any]] = []
        if self.nvml is not None:
            nv = self.nvml
            for i in range(nv.nvmlDeviceGetCount()):
                d = nv.nvmlDeviceGetHandleByIndex(i)
                g: dict[str, Any] = {"gpu": i, "gpu_source": "nvml"}
                if h.track_gpu:
                    g["gpu_util_percent"] = float(nv.nvmlDeviceGetUtilizationRates(d).gpu)
                if h.track_gpu_memory:
                    m = nv.nvmlDeviceGetMemoryInfo(d)
                    g["gpu_mem_used_bytes"], g["gpu_mem_total_bytes"] = int(m.used), int(m.total)
                out.append(g)
            return out
        torch = _torch()
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not h.track_gpu_memory:
            return out
        try:
            if not cuda.is_initialized():
                return out
            for i in range(cuda.device_count()):
                out.append({"gpu": i, "gpu_source": "torch.cuda",
                            "gpu_mem_used_bytes": int(cuda.memory_allocated(i)),
                            "gpu_mem_reserved_bytes": int(cuda.memory_reserved(i))})  # fmt: skip
        except Exception:
            pass
        return out


@HookRegistry.register("SystemMonitorHook")
class SystemMonitorHook(BaseHook):
    """CPU %, RSS, system memory, GPU utilisation and memory into python.system_monitor.

    A daemon thread (``pprobe-sysmon``) samples every ``interval`` seconds; ``after_step`` (at
    the hook's ``frequency``) and ``after_epoch`` record the latest sample, one row per GPU
    (``gpu`` NULL on a machine without one).
    """

    def __init__(self, name: str | None = None, frequency: int = 1, interval: float = 1.0,
                 track_cpu: bool = True, track_memory: bool = True, track_gpu: bool = True,
                 track_gpu_memory: bool = True, **params: Any) -> None:  # fmt: skip
        super().__init__(name, frequency, **params)
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval <= 0:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        self.interval = float(interval)
        self.track_cpu, self.track_memory = bool(track_cpu), bool(track_memory)
        self.track_gpu, self.track_gpu_memory = bool(track_gpu), bool(track_gpu_memory)
        self.sampler: _Sampler | None = None

    def _start(self) -> _Sampler:
        if self.sampler is None:
            self.sampler = _Sampler(self)
            self.sampler.start()
        return self.sampler

    def before_training(self, model: Any = None) -> None:
        self._start()

    # The rows are made off the training thread at the tables' next flush (record_later)
    # from the sample that is the last one now (the sampler replaces it, never changes it).
    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None:
        record_later("system_monitor", self._rows, "step", step,
                     (self.sampler or self._start()).rows)  # fmt: skip

    def after_epoch(self, epoch: int, model: Any = None, metrics: Any = None) -> None:
        record_later("system_monitor", self._rows, "epoch", epoch, self._start().rows)

    def _rows(self, event: str, at: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        name = self.name
        return [{"hook": name, "event": event, event: at, **r} for r in rows]

    def after_training(self, model: Any = None, metrics: Any = None) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        sm, self.sampler = self.sampler, None
        if sm is not None:
            sm.stop()


# ---------------------------------------------------------------------- GradientFlowHook
_AFTER_STEP = frozenset(["after_step"])
_STEP_POINTS = frozenset(["before_step", "after_step"])


def _probing_steps() -> bool:
    """Whether the probe's torch interception is on: its optimizer post-hook moves the step,
    so zero-code detection opens a new step before every optimizer step."""
    tm = sys.modules.get("pprobe.interceptors.torch_modules")
    return tm is not None and bool(tm._on) and not state.manual_step


#: The statistics GradientFlowHook computes per parameter, in its table's column order.
GRAD_STATS = ("norm", "max_abs", "mean", "zero_frac", "nan_count", "inf_count")


def grad_stats(torch: Any, grads: list[Any], counts: bool) -> tuple[Any, Any]:
    """Two 1-D tensors on the grads' device: floats ``norms + mins + maxs + sums`` (4 per
    grad, in the widest of the grads' dtypes) and int64 ``nonzeros [+ nans + infs]`` (the NaN
    and inf counts only with ``counts``).

    Only kernel launches: nothing here waits for the device (no ``.item()``, no ``.cpu()``).
    About 4 + 3 per grad launches (5 per grad with ``counts``), none per element in Python."""
    low = (torch.float16, torch.bfloat16)
    norms = list(torch._foreach_norm(grads))  # one fused launch per device and dtype
    mins, maxs = [], []
    for g in grads:
        lo, hi = torch.aminmax(g) if g.numel() else (g.new_zeros(()), g.new_zeros(()))
        mins.append(lo)
        maxs.append(hi)
    sums = [g.sum(dtype=torch.float32) if g.dtype in low else g.sum() for g in grads]
    ints = [torch.count_nonzero(g) for g in grads]
    if counts:
        ints += [torch.isnan(g).sum() for g in grads] + [torch.isinf(g).sum() for g in grads]
    return torch.stack(norms + mins + maxs + sums), torch.stack(ints)


_codes: dict[Any, int] | None = None


def native_grad_columns(torch: Any, grads: list[Any],
                        plain: bool = False) -> tuple[list[Any], ...] | None:  # fmt: skip
    """The python.gradient_flow columns norm, max_abs, mean, zero_frac, nan_count and
    inf_count (a list each, an item per grad) of contiguous floating CPU grads, from the
    native code: one call for every grad that reads their attributes, then, without the GIL,
    their memory, in double (the statistics thread takes the GIL twice per wake-up, not per
    torch op; the training thread does not hand it over dozens of times a step). None when
    it does not apply (``PPROBE_CORE=python``, no native code, another dtype, device or
    layout, a subclass or a view that is not plain memory): the torch path gives the same
    numbers (:func:`grad_stats`, :func:`_cols`). ``plain``: the caller has entered
    :func:`_plain` for these grads (the attribute reads, which a torch function mode would
    see), else it is entered here."""
    mod = core.dumpio()
    if mod is None or not grads:
        return None
    global _codes
    codes = _codes
    if codes is None:  # torch dtype -> pprobe/_dumpio.c's type code (the torch handler's)
        from ..interceptors.torch_values import _STATS_CODES

        codes = _codes = _STATS_CODES
    try:
        if plain:  # no context to enter (the training thread's steady path runs this)
            return mod.grad_columns(grads, torch.Tensor, torch.strided, codes)  # type: ignore[no-any-return]
        with _plain(torch, grads):
            return mod.grad_columns(grads, torch.Tensor, torch.strided, codes)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None  # symbolic sizes, no storage: the torch path


def _cols(hook: str, step: int, names: list[str], numels: list[int], fl: list[float],
          ints: list[int], counts: dict[int, tuple[int, int]] | None,
          ) -> dict[str, list[Any]]:  # fmt: skip
    """The python.gradient_flow rows of one step from :func:`grad_stats`' host values, column
    by column (:data:`GRADIENT_FLOW_COLUMNS`); ``counts``: (nan, inf) per index when they
    were not in ``ints`` (0, 0 where the norm is finite: every element is)."""
    n = len(names)
    cols: dict[str, list[Any]] = {k: [] for k in GRADIENT_FLOW_COLUMNS}
    for i, name in enumerate(names):
        size = max(1, numels[i])
        if counts is None:
            nan, inf = ints[n + i], ints[2 * n + i]
        else:
            nan, inf = counts.get(i, (0, 0))
        lo, hi = fl[n + i], fl[2 * n + i]
        max_abs = hi if lo != lo or hi != hi else max(-lo, hi)  # NaN: aminmax says NaN
        vals = (
            hook,
            step,
            name,
            numels[i],
            fl[i],
            max_abs,
            fl[3 * n + i] / size,
            (numels[i] - ints[i]) / size,
            nan,
            inf,
        )
        for k, v in zip(GRADIENT_FLOW_COLUMNS, vals):
            cols[k].append(v)
    return cols


#: python.gradient_flow's own columns, in order.
GRADIENT_FLOW_COLUMNS = ("hook", "step", "param", "numel", "norm", "max_abs", "mean",
                         "zero_frac", "nan_count", "inf_count")  # fmt: skip


def rows_of(cols: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Rows (dicts) of columns given as lists."""
    return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


def _reused(torch: Any, prev: list[Any], grads: list[Any]) -> bool:
    """Whether ``grads`` share memory with the earlier ``prev`` (still alive: no address was
    freed and reused in between): the same tensors, or views of the same storage."""
    with _plain(torch, prev + grads):
        old = {g.data_ptr() for g in prev if g.numel()}
        return any(g.numel() and g.data_ptr() in old for g in grads)


_WRITTEN = (
    "a gradient was written in place after the step (its version counter moved "
    "before its statistics were read): that step's rows are dropped"
)


@HookRegistry.register("GradientFlowHook")
class GradientFlowHook(BaseHook):
    """Per parameter per step: grad norm, max |g|, mean, fraction of zeros, NaN and inf counts,
    into python.gradient_flow.

    Where the gradients are read: when an optimizer is known (the ``optimizer`` service, or
    ``optimizer=`` here), in its step pre-hook, so exactly the gradients the step uses, wherever
    the loop calls ``zero_grad``; ``before_step`` arms it on the steps the hook fires at. Without
    one, in ``after_step`` from the model's ``.grad`` as they are then.

    On an accelerator the statistics are computed on the device, stacked into two tensors and
    copied to pinned host memory without waiting (``non_blocking``); the rows are written
    when that copy's CUDA event has completed (checked at the next ``after_step``, waited for
    at ``after_training`` / ``cleanup``). Nothing synchronises the program's stream per step.
    On the CPU the statistics are computed on the training thread (one native call for every
    grad) unless ``async_cpu`` says otherwise: ``"auto"`` (the default) hands a step's grads to
    a thread when they hold at least ``async_min_bytes`` (default 4 MiB: reading them then
    takes longer than the hand-off costs) and the process may use more than one core;
    ``True`` always, ``False`` never. With the thread, the training thread only hands the
    grads to the ``pprobe-gradflow`` thread, which wakes every 0.05 s, computes and writes them: by
    reference (the grad tensors themselves and their ``_version`` counters) when the loop
    drops its grads each step (``zero_grad()``'s default ``set_to_none=True``), else as a copy
    into a snapshot buffer (one fused ``torch._foreach_copy_``). A reference's rows are kept
    only when no counter has moved by the time the training thread next looks (:meth:`_verify`);
    a moved one drops that step's rows and switches the hook to copies. References held and
    buffers are bounded by ``max_snapshot_bytes`` (default 64 MiB); past it (the thread fell
    behind) the statistics are computed at once on the training thread. There the NaN and
    inf counts are computed only for parameters whose norm is not finite (a finite norm
    means every element is finite).
    """

    def __init__(self, name: str | None = None, frequency: int = 1, optimizer: Any = None,
                 async_cpu: bool | str = "auto", async_min_bytes: int = 4 << 20,
                 max_snapshot_bytes: int = 64 << 20, handoff: str = "auto",
                 **params: Any) -> None:  # fmt: skip
        super().__init__(name, frequency, **params)
        if handoff not in ("auto", "copy"):
            raise ValueError(f"GradientFlowHook handoff must be 'auto' or 'copy', not {handoff!r}")
        if async_cpu not in (True, False, "auto"):
            raise ValueError("GradientFlowHook async_cpu must be 'auto', true or false, "
                             f"not {async_cpu!r}")  # fmt: skip
        self.optimizer = optimizer
        self.async_cpu: bool | str = async_cpu if async_cpu == "auto" else bool(async_cpu)
        self.async_min_bytes = int(async_min_bytes)
        self.max_snapshot_bytes = int(max_snapshot_bytes)
        self._lock = threading.Lock()
        self.poll = 0.05
        self._free: list[tuple[Any, list[Any]]] = []  # CPU snapshot buffer sets not in use
        self._buf_bytes = 0
        #: CPU hand-offs: "probe" (the first, a copy), then "ref" (the grad tensors
        #: themselves) or "copy" (the loop writes its grads in place): see _handoff
        self._mode = "copy" if handoff == "copy" else "probe"
        self._prev: list[Any] | None = None  # the probe hand-off's grads
        self._held = 0  # bytes of the grads held by reference, not yet verified
        self._unverified: list[tuple[list[Any], list[int], dict[str, list[Any]], int]] = []
        self._ready: collections.deque[dict[str, list[Any]]] = collections.deque()
        self._last: tuple[list[Any], list[int]] | None = None  # the latest reference hand-off
        self.dropped_steps = 0  # steps whose rows were dropped: a grad changed (_verify)
        self._jobs: collections.deque[Any] = collections.deque()
        self._job_lock = threading.Lock()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self._hooked: Any = None  # the optimizer whose pre-hook is installed
        self._handle: Any = None
        self._armed: int | None = None  # the step the pre-hook captures for
        self._captured: int | None = None  # the step the pre-hook computed
        #: (step, names, numels, [host floats, host ints], CUDA event) not yet written
        self._inflight: list[tuple[int, list[str], list[int], list[Any], Any]] = []
        self._names: dict[int, str] = {}
        self._model: Any = None
        self._layout: tuple[Any, list[Any]] | None = None
        self._zero_code = False  # the last before_step came from zero-code detection
        self._self_arm = True  # False once zero-code detection was seen not to step
        #: _steady's state: (params, names, numels, torch), kept by _keep_fast, dropped
        #: with the layout
        self._fast: tuple[Any, ...] | None = None
        self._native_ok = False  # whether the last _cpu_cols was the native call's

    def _opt(self) -> Any:
        return self.optimizer if self.optimizer is not None else self.get_service("optimizer")

    def _install(self, model: Any) -> None:
        if model is not None and model is not self._model:
            self._model = model
            try:
                self._names = {id(p): n for n, p in model.named_parameters()}
            except Exception:
                self._names = {}
            self._layout = self._fast = None
        opt = self._opt()
        if opt is not None and opt is not self._hooked and hasattr(opt, "register_step_pre_hook"):
            if self._handle is not None:
                self._handle.remove()
            self._handle = opt.register_step_pre_hook(self._pre)
            self._hooked = opt

    def before_training(self, model: Any = None) -> None:
        self._install(model if model is not None else self.get_service("model"))

    def before_step(self, step: int, model: Any = None) -> None:
        # _install only when something changed: another model, no pre-hook yet, another
        # optimizer (what _install itself checks, without its calls on every step)
        if model is None or model is not self._model or self._hooked is None \
                or self._opt() is not self._hooked:  # fmt: skip
            self._install(model if model is not None else self.get_service("model"))
        self._armed = step if self._hooked is not None else None
        self.idle_points = None  # this step's after_step is wanted until _pre has taken it
        lc = sys.modules.get("pprobe.hooks.lifecycle")
        self._zero_code = lc is not None and lc.opening == step

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step pre-hook: the grads as the step will use them.

        Armed by ``before_step`` with its step; or, while ``before_step`` is idle (zero-code
        detection's steps, a steady CPU loop: see :meth:`_idle`), with the step zero-code
        detection has just opened, when :meth:`should_trigger` says so. A failure is the
        hook's (reported, counted, switched off after repeats), never the optimizer's."""
        step, self._armed = self._armed, None
        if step is None:
            idle = self.idle_points
            if not idle or "before_step" not in idle:
                return
            step = self._own_step()
            if step is None:
                return
        local = state.local
        saved = local.depth
        local.depth = state.INTERNAL  # the hook's own torch calls are not recorded
        try:
            params = [p for g in opt.param_groups for p in g["params"]]
            if not self._steady(step, params):
                self._verify()  # also here: a loop that never emits after_step still verifies
                self._compute(step, params)
            self._captured = step
            self.idle_points = self._idle()
        except Exception as exc:  # noqa: BLE001 - a hook never breaks the program
            self.idle_points = None
            dispatch._failed(self, "optimizer pre-hook", exc)
        finally:
            local.depth = saved

    def _steady(self, step: int, params: list[Any]) -> bool:
        """The steady state of a CPU loop, in as little Python as it takes: the same plain
        parameters as at the last step :meth:`_compute` found them all with a CPU grad, the
        statistics on this thread (no hand-off), nothing waiting from an earlier step; one
        native call for every grad, the rows handed over as columns. False (nothing done)
        when any of that does not hold, or a grad is not one the native call reads: then
        :meth:`_compute` does the whole work."""
        fast = self._fast
        if fast is None or self._last is not None or self._unverified or self._inflight \
                or self.async_cpu is True:  # fmt: skip
            return False
        known, names, numels, torch = fast
        if len(params) != len(known) or not all(map(operator.is_, params, known)):
            return False
        with torch._C.DisableTorchFunction():  # plain tensors: checked when known was kept
            got = native_grad_columns(torch, [p.grad for p in params], plain=True)
        if got is None:  # a grad is missing or not one the native call reads
            return False
        _ext_tables()._add_columns("gradient_flow", self._native_cols(step, names, numels, got))
        return True

    def _own_step(self) -> int | None:
        """The step to take in the pre-hook while ``before_step`` is idle: the one zero-code
        detection opened (its optimizer pre-hook runs before this one), when this hook is
        live and fires at it; else None."""
        lc = sys.modules.get("pprobe.hooks.lifecycle")  # imported: its emits armed _zero_code
        step = None if lc is None else lc.open_step
        if step is not None and step == self._captured:
            # zero-code detection opened no step since the last one taken: something else
            # makes the steps (a program's own emits): before_step is never idle again
            self._self_arm = False
            self.idle_points = None
            return None
        if step is None or self.off or self not in dispatch._hooks:
            return None
        try:
            return step if self.should_trigger(step) else None
        except Exception as exc:  # noqa: BLE001
            self.idle_points = None
            dispatch._failed(self, "should_trigger", exc)
            return None

    def _idle(self) -> frozenset[str] | None:
        """The points idle after a step taken in the pre-hook. ``after_step``, when its rows
        are written and nothing waits for a later look (no hand-off, no device copy);
        ``before_step`` too when zero-code detection made this step's ``before_step`` (not a
        framework's or the program's own emit), nothing has claimed the points and the
        optimizer hooked is the ``optimizer`` service: the pre-hook then arms itself with
        the steps zero-code detection opens. A new model or optimizer service wakes them
        (dispatch.register_service)."""
        if self._inflight or self._unverified or self._jobs or self._ready \
                or self._last is not None:  # fmt: skip
            return None
        if self._zero_code and self._self_arm and dispatch._claimed is None \
                and self._hooked is self._opt() and _probing_steps():  # fmt: skip
            return _STEP_POINTS
        return _AFTER_STEP

    def _param_name(self, p: Any, i: int) -> str:
        return self._names.get(id(p)) or f"param{i}"

    def _compute(self, step: int, params: list[Any]) -> None:
        """Launch the statistics of the parameters' grads (those that have one); on the CPU
        hand them to the thread (or write the rows now), on an accelerator copy them to pinned
        host memory without waiting and write them once the copy is done."""
        torch = _torch()
        if torch is None or not params:
            return
        # Every tensor attribute read (.grad, .device, .numel()) under a torch function mode
        # goes through the mode (pprobe's interceptor: several us each): all of them inside.
        # So does torch.no_grad() (its _set_grad_enabled calls): entered inside too, and only
        # where kernels run (reading .grad and ._version needs none)
        ctx = _plain(torch, params)
        # every grad is of a plain parameter (no subclass): already in DisableTorchFunction
        plain_all = type(ctx) is not contextlib.nullcontext
        with ctx:
            grads_all = [p.grad for p in params]
            # the layout (devices, names, sizes) is worked out once per parameter list
            sig = tuple([id(p) if g is not None else 0 for p, g in zip(params, grads_all)])
            if self._layout is None or self._layout[0] != sig:
                by_dev: dict[Any, list[int]] = {}
                for i, g in enumerate(grads_all):
                    if g is not None:
                        by_dev.setdefault(g.device, []).append(i)
                groups = []
                for dev, idx in by_dev.items():
                    gs = [grads_all[i] for i in idx]
                    groups.append((dev, idx, [self._param_name(params[i], i) for i in idx],
                                   [g.numel() for g in gs],
                                   tuple((tuple(g.shape), g.dtype) for g in gs),
                                   sum(g.numel() * g.element_size() for g in gs)))  # fmt: skip
                self._layout = (sig, groups)
                self._fast = None
            whole = len(self._layout[1]) == 1 and len(self._layout[1][0][1]) == len(params)
            for dev, idx, names, numels, key, nbytes in self._layout[1]:
                grads = grads_all if whole else [grads_all[i] for i in idx]
                if dev.type == "cpu":
                    if not (
                        self._threaded(nbytes)
                        and self._handoff(torch, step, names, numels, grads, key, nbytes)
                    ):
                        cols = self._cpu_cols(torch, step, names, numels, grads,
                                              plain=plain_all)  # fmt: skip
                        record_columns("gradient_flow", cols)
                        if whole and plain_all and self._native_ok and self._fast is None:
                            self._keep_fast(torch, params, names, numels)
                    continue
                # an accelerator: the NaN/inf counts are computed with the rest (no host check)
                hosts = []
                with torch.no_grad():
                    fl, it = grad_stats(torch, grads, counts=True)
                    for t in (fl, it):
                        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=dev.type == "cuda")
                        h.copy_(t, non_blocking=True)
                        hosts.append(h)
                ev = torch.cuda.Event() if dev.type == "cuda" else None
                if ev is not None:
                    ev.record()
                self._inflight.append((step, names, numels, hosts, ev))

    def _threaded(self, nbytes: int) -> bool:
        """Whether CPU grads of ``nbytes`` go to the statistics thread (``async_cpu``)."""
        a = self.async_cpu
        if a == "auto":
            return nbytes >= self.async_min_bytes and state.cores() > 1
        return bool(a)

    def _cpu_cols(self, torch: Any, step: int, names: list[str], numels: list[int],
                  grads: list[Any], plain: bool = False) -> dict[str, list[Any]]:  # fmt: skip
        """The python.gradient_flow rows (:func:`_cols`) of CPU grads, computed now (on the
        calling thread); ``plain``: in :func:`_plain` for them already."""
        got = native_grad_columns(torch, grads, plain)
        self._native_ok = got is not None
        if got is not None:
            return self._native_cols(step, names, numels, got)
        with _plain(torch, grads), torch.no_grad():
            fl, it = grad_stats(torch, grads, counts=False)
            flv, itv = fl.tolist(), it.tolist()
            bad = [j for j in range(len(grads)) if not math.isfinite(flv[j])]
            counts = {j: (int(torch.isnan(grads[j]).sum()), int(torch.isinf(grads[j]).sum()))
                      for j in bad}  # fmt: skip
        return _cols(self.name, step, names, numels, flv, itv, counts)

    def _keep_fast(self, torch: Any, params: list[Any], names: list[str],
                   numels: list[int]) -> None:  # fmt: skip
        """What :meth:`_steady` needs, kept once :meth:`_compute` has read every grad of
        these plain parameters on the CPU, on this thread, with the native call."""
        self._fast = (list(params), names, numels, torch)

    def _native_cols(self, step: int, names: list[str], numels: list[int],
                     got: tuple[list[Any], ...]) -> dict[str, list[Any]]:  # fmt: skip
        """The rows (:func:`_cols`) with :func:`native_grad_columns`' columns."""
        n = len(names)
        norm, max_abs, mean, zero_frac, nan, inf = got
        assert len(norm) == n
        return {"hook": [self.name] * n, "step": [step] * n, "param": names, "numel": numels,
                "norm": norm, "max_abs": max_abs, "mean": mean, "zero_frac": zero_frac,
                "nan_count": nan, "inf_count": inf}  # fmt: skip

    def _handoff(self, torch: Any, step: int, names: list[str], numels: list[int],
                 grads: list[Any], key: Any, nbytes: int) -> bool:  # fmt: skip
        """Leave CPU grads to the ``pprobe-gradflow`` thread (it wakes every ``poll`` s: no
        hand-off per step): by reference (the grad tensors themselves and their ``_version``
        counters, checked again once the thread has read them: :meth:`_verify`) or as a copy
        into a free buffer set (one fused ``_foreach_copy_``). The first hand-off copies; the
        second decides: the same tensors (or storage) again means the loop writes its grads
        in place (``zero_grad(set_to_none=False)``, accumulation), so copies from then on;
        fresh tensors (``zero_grad()``'s default drops them) mean references.
        False (compute them now instead) when the references held and buffers would pass
        ``max_snapshot_bytes`` in all: the thread has fallen behind."""
        if self._mode == "probe" and self._prev is not None:
            self._mode = "copy" if _reused(torch, self._prev, grads) else "ref"
            self._prev = None
            if self._mode == "copy":
                self._say("the loop writes its gradients in place between steps "
                          "(zero_grad(set_to_none=False) or accumulation)")  # fmt: skip
        if self._mode == "ref":
            versions = [g._version for g in grads]
            with self._lock:
                if self._buf_bytes + self._held + nbytes > self.max_snapshot_bytes:
                    return False
                self._held += nbytes
            self._jobs.append((step, names, numels, grads, versions, nbytes))
            self._last = (grads, versions)
        else:
            with self._lock:
                bufs = next((b for b in self._free if b[0] == key), None)
                if bufs is not None:
                    self._free.remove(bufs)
                elif self._buf_bytes + self._held + nbytes <= self.max_snapshot_bytes:
                    self._buf_bytes += nbytes
                    bufs = (key, [torch.empty_like(g, memory_format=torch.contiguous_format)
                                  for g in grads])  # fmt: skip
                else:
                    return False
            with torch.no_grad():
                torch._foreach_copy_(bufs[1], grads)
            self._jobs.append((step, names, numels, bufs[1], None, bufs))
            if self._mode == "probe":
                self._prev = grads  # compared with the next hand-off's grads
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="pprobe-gradflow",
                                            daemon=True)  # fmt: skip
            self._worker.start()
            # at exit, before the session's own handler (registered earlier, so run later)
            # writes the tables: the snapshots still waiting become rows
            atexit.register(self._drain, True)
        return True

    def _say(self, why: str) -> None:
        """Reference hand-offs off for good (copies from now on), said once per hook."""
        self._mode = "copy"
        from .. import _report

        _report.warn_once(f"GradientFlowHook {self.name} copies",
                          f"GradientFlowHook {self.name}: {why}; its gradients are copied "
                          "for the statistics thread from now on (a copy per step).")  # fmt: skip

    def _work(self) -> None:
        state.local.depth = state.INTERNAL  # nothing this thread does is recorded
        while not self._stop.wait(self.poll):
            self._run_jobs()
            self._write_ready()

    def _run_jobs(self) -> None:
        """Compute the statistics of every hand-off waiting (on whichever thread calls it),
        all of them in one native call where it applies: the thread gives up and takes back
        the GIL once per wake-up, not once per step (each time it takes it back, the
        training thread is made to hand it over). A copy's rows are written now, a
        reference's wait for :meth:`_verify`."""
        torch = _torch()
        while True:
            with self._job_lock:  # a waiter knows that the jobs it saw are done
                jobs = []
                while True:
                    try:
                        jobs.append(self._jobs.popleft())
                    except IndexError:
                        break
                if not jobs:
                    return
                outs = self._many_cols(torch, jobs)
                for (_s, _n, _c, grads, versions, hold), out in zip(jobs, outs):
                    if versions is None:
                        record_columns("gradient_flow", out)
                        with self._lock:
                            self._free.append(hold)
                    else:
                        with self._lock:
                            self._unverified.append((grads, versions, out, hold))

    def _many_cols(self, torch: Any, jobs: list[Any]) -> list[dict[str, list[Any]]]:
        """Each job's rows (:func:`_cols`): one native call for all their grads, else job by
        job (as :meth:`_cpu_cols` alone: a job that fails gives no rows and is reported)."""
        if len(jobs) > 1:
            try:
                with state.internal():
                    got = native_grad_columns(torch, [g for j in jobs for g in j[3]])
                    if got is not None:
                        outs, k = [], 0
                        for step, names, numels, grads, _v, _h in jobs:
                            part = tuple(c[k : k + len(grads)] for c in got)
                            outs.append(self._native_cols(step, names, numels, part))
                            k += len(grads)
                        return outs
            except Exception:  # noqa: BLE001 - job by job below, which reports it
                pass
        outs = []
        for step, names, numels, grads, _v, _h in jobs:
            try:
                with state.internal():
                    outs.append(self._cpu_cols(torch, step, names, numels, grads))
            except Exception as e:  # noqa: BLE001 - the program goes on
                dispatch._failed(self, "after_step", e)
                outs.append(_cols(self.name, step, [], [], [], [], None))
        return outs

    def _verify(self) -> None:
        """On the training thread: the rows of grads read by reference are kept when no grad's
        ``_version`` has moved since the hand-off. A write in place (which bumps it) done by
        this thread has completed by the time it is here, so an unchanged counter means the
        statistics thread read the values the step used. A moved one: that step's rows are
        dropped (counted in ``dropped_steps``) and the hook copies from then on."""
        if self._last is None and not self._unverified:
            return  # nothing handed over by reference (the training thread computes them)
        last, self._last = self._last, None
        torch = _torch()
        if last is not None and self._mode == "ref":
            # the latest hand-off, not yet read, perhaps: a write to it since (the loop
            # scaling its grads after opt.step(), say) switches to copies before the next step
            with _plain(torch, last[0]):
                moved = [g for g, v in zip(*last) if g._version != v]
            if moved:
                self._say(_WRITTEN)
        if not self._unverified:
            return
        with self._lock:
            batch, self._unverified = self._unverified, []
            self._held -= sum(b[3] for b in batch)
        for grads, versions, out, _ in batch:
            with _plain(torch, grads):  # _version under a torch function mode goes through it
                same = [g._version for g in grads] == versions
            if same:
                self._ready.append(out)
            else:
                self.dropped_steps += 1
                if self._mode != "copy":
                    self._say(_WRITTEN)

    def _write_ready(self) -> None:
        while True:
            try:
                out = self._ready.popleft()
            except IndexError:
                return
            record_columns("gradient_flow", out)

    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None:
        done, self._captured = self._captured, None
        if done != step:  # the pre-hook did not see this step: the grads as they are now
            m = model if model is not None else self.get_service("model")
            self._install(m)
            self._compute(step, list(m.parameters()) if m is not None else [])
        self._drain(wait=False)

    def _drain(self, wait: bool) -> None:
        if wait:
            self._run_jobs()  # the CPU hand-offs not yet computed
        self._verify()
        if wait:
            self._write_ready()
        while self._inflight:
            step, names, numels, hosts, ev = self._inflight[0]
            if ev is not None and not ev.query():
                if not wait:
                    return
                ev.synchronize()
            self._inflight.pop(0)
            fl, it = hosts[0].tolist(), hosts[1].tolist()
            record_columns("gradient_flow", _cols(self.name, step, names, numels, fl, it, None))

    def after_training(self, model: Any = None, metrics: Any = None) -> None:
        self._drain(wait=True)

    def cleanup(self) -> None:
        self._drain(wait=True)
        w, self._worker = self._worker, None
        if w is not None:
            self._stop.set()
            w.join(timeout=10)
            self._stop = threading.Event()
        self._drain(wait=True)
        self._free, self._buf_bytes, self._prev = [], 0, None
        if self._handle is not None:
            self._handle.remove()
            self._handle = self._hooked = None


# ---------------------------------------------------------------------- FeatureMapHook
def png_gray(pixels: Any) -> bytes:
    """An 8-bit grayscale PNG of a 2-D uint8 NumPy array (zlib + struct, no library)."""
    h, w = pixels.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))  # filter 0 per row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def feature_grid(maps: Any, pad: int = 1) -> Any:
    """(C, H, W) float maps -> one uint8 grid image, each channel scaled to 0..255 on its own
    min..max (a constant channel is 0), ``ceil(sqrt(C))`` columns, ``pad`` pixels between."""
    import numpy as np

    c, h, w = maps.shape
    cols = max(1, math.ceil(math.sqrt(c)))
    rows = max(1, math.ceil(c / cols))
    out = np.zeros((rows * h + (rows - 1) * pad, cols * w + (cols - 1) * pad), dtype=np.uint8)
    for k in range(c):
        m = maps[k].astype(np.float64)
        lo, hi = float(m.min()), float(m.max())
        img = np.zeros_like(m) if hi <= lo else (m - lo) * (255.0 / (hi - lo))
        r, q = divmod(k, cols)
        y, x = r * (h + pad), q * (w + pad)
        out[y : y + h, x : x + w] = np.rint(img).astype(np.uint8)
    return out


@HookRegistry.register("FeatureMapHook")
class FeatureMapHook(BaseHook):
    """Per module activation statistics (mean, std, min, max, fraction of zeros) into
    python.feature_maps on the steps the hook fires at; for convolution outputs, a PNG grid of
    up to ``max_features`` channels of batch item ``sample_batch_idx``, under the run's
    visualization folder (``<hook name>/step<step>_<module>.png``).

    ``modules``: module names (as in ``named_modules()``) or class names to watch; default
    every leaf module. Forward hooks are installed on the model (``before_training`` /
    ``before_step``'s ``model``, else the ``model`` service) and record only between
    ``before_step`` and ``after_step`` of the steps the hook fires at.
    """

    def __init__(self, name: str | None = None, frequency: int = 100, max_features: int = 16,
                 sample_batch_idx: int = 0, modules: list[str] | None = None,
                 save_images: bool = True, **params: Any) -> None:  # fmt: skip
        super().__init__(name, frequency, **params)
        if not isinstance(max_features, int) or max_features < 1:
            raise ValueError(f"max_features must be an integer >= 1, got {max_features!r}")
        if not isinstance(sample_batch_idx, int) or sample_batch_idx < 0:
            raise ValueError(f"sample_batch_idx must be an integer >= 0, got {sample_batch_idx!r}")
        self.max_features = max_features
        self.sample_batch_idx = sample_batch_idx
        self.modules = list(modules) if modules else None
        self.save_images = bool(save_images)
        self._model: Any = None
        self._handles: list[Any] = []
        self._step: int | None = None
        self.images: list[str] = []  # PNG paths written

    def _install(self, model: Any) -> None:
        if model is None or model is self._model or not hasattr(model, "named_modules"):
            return
        self._remove()
        self._model = model
        for mname, mod in model.named_modules():
            if self.modules is not None:
                if mname not in self.modules and type(mod).__name__ not in self.modules:
                    continue
            elif any(True for _ in mod.children()):
                continue
            self._handles.append(mod.register_forward_hook(self._make(mname or "model")))

    def _make(self, mname: str) -> Any:
        def fwd(mod: Any, inputs: Any, output: Any) -> None:
            if self._step is None:
                return
            with state.internal():
                try:
                    self._observe(self._step, mname, mod, output)
                except Exception as e:  # noqa: BLE001 - a hook never breaks the forward
                    dispatch._failed(self, f"forward[{mname}]", e)

        return fwd

    def _observe(self, step: int, mname: str, mod: Any, output: Any) -> None:
        torch = _torch()
        if torch is None or not isinstance(output, torch.Tensor):
            return
        with torch.no_grad(), _plain(torch, [output]):
            if not output.is_floating_point():
                return
            x = output.detach()
            xs = x.double()
            st = torch.stack([xs.mean(), xs.std() if x.numel() > 1 else xs.new_zeros(()),
                              xs.min(), xs.max(), (x == 0).double().mean()]).tolist()  # fmt: skip
        row: dict[str, Any] = {"hook": self.name, "step": step, "module": mname,
                               "module_type": type(mod).__name__, "shape": list(x.shape),
                               "mean": st[0], "std": st[1], "min": st[2], "max": st[3],
                               "zero_frac": st[4], "image": None}  # fmt: skip
        conv = "Conv" in type(mod).__name__ and x.dim() >= 3
        if conv and self.save_images and x.shape[0] > self.sample_batch_idx:
            row["image"] = self._image(step, mname, x[self.sample_batch_idx])
        record("feature_maps", row)

    def _image(self, step: int, mname: str, x: Any) -> str | None:
        vis = service_dir(self, "visualization_dir", "visualization")
        if vis is None:
            return None
        maps = x[: self.max_features]
        if maps.dim() == 2:  # Conv1d: (C, L) -> C strips of height 1
            maps = maps.unsqueeze(1)
        while maps.dim() > 3:  # Conv3d: the middle slice of each depth
            maps = maps[:, maps.shape[1] // 2]
        arr = maps.float().cpu().numpy()
        folder = os.path.join(vis, self.name)
        os.makedirs(folder, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in mname)
        path = os.path.join(folder, f"step{step:06d}_{safe}.png")
        with open(path, "wb") as f:
            f.write(png_gray(feature_grid(arr)))
        self.images.append(path)
        base = run_dir(self)
        return os.path.relpath(path, base) if base and path.startswith(base) else path

    def before_training(self, model: Any = None) -> None:
        self._install(model if model is not None else self.get_service("model"))

    def before_step(self, step: int, model: Any = None) -> None:
        self._install(model if model is not None else self.get_service("model"))
        self._step = step

    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None:
        self._step = None

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._model = None

    def after_training(self, model: Any = None, metrics: Any = None) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        self._step = None
        self._remove()


# ---------------------------------------------------------------------- ExportHook
@HookRegistry.register("ExportHook")
class ExportHook(BaseHook):
    """An exporter from the configuration: ``[[hooks]] type = "ExportHook"`` with
    ``exporter = "csv"`` (``path``) or ``"tensorboard"`` (``log_dir``). Made live when the hook
    is built (pprobe.hooks.exporters.add); the exporters close at ``cleanup``."""

    def __init__(self, name: str | None = None, frequency: int = 1, exporter: str = "csv",
                 path: str | None = None, log_dir: str | None = None,
                 **params: Any) -> None:  # fmt: skip
        super().__init__(name, frequency, **params)
        from . import exporters

        kw: dict[str, Any] = {}
        if path is not None:
            kw["path"] = path
        if log_dir is not None:
            kw["log_dir"] = log_dir
        self.exporter = exporters.add(exporter, **kw)


__all__ = [
    "ExportHook",
    "FeatureMapHook",
    "GradientFlowHook",
    "SystemMonitorHook",
    "TimeTrackingHook",
    "feature_grid",
    "grad_stats",
    "png_gray",
]
