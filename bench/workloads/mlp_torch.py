"""Workload 3: a 128-256-256-10 MLP trained on CPU with SGD, batch 64.

Times ``steps`` training steps after ``warmup`` steps. With ``profiler`` set the timed steps
run inside torch.profiler.profile(record_shapes=True); its exit and a Chrome-trace export are
timed as the finish cost (for pprobe the finish is its own stop: flush and metadata).

With ``empty_mode`` set, the warm-up and timed steps run inside a TorchFunctionMode whose
handler only calls each function (:class:`_PassThrough`): what the mode alone costs.

With ``msprobe`` set to ``statistics`` or ``tensor`` (mindstudio-probe's task), the warm-up and
timed steps each run between msprobe's ``PrecisionDebugger`` ``start(model)``, ``stop()`` and
``step()``, at level L1 (every torch API call). msprobe writes each step's dump inside the loop
(``async_dump`` off), so its finish is empty. Its dump folder is a temporary folder under
``msprobe_dir``, deleted before the child exits; ``dump_mb`` is what the timed steps wrote. The
suite passes ``requires``: without msprobe the child reports ``unavailable`` before importing torch
(``_child._require``), and so it does when msprobe is there but its import fails.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from typing import Any

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import torch
import torch.nn.functional as F
from _child import ARGS, Span, emit
from torch import nn

steps, warmup = int(ARGS.get("steps", 200)), int(ARGS.get("warmup", 5))
if ARGS.get("torch_threads"):
    torch.set_num_threads(int(ARGS["torch_threads"]))
for _name in ARGS.get("preimport", ()):  # diagnosis: take a one-time import out of the timing
    __import__(_name)
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 128), torch.randint(0, 10, (64,))) for _ in range(8)]


if ARGS.get("ext"):  # the extension API's cost: a table and a metric sampled every step
    from pprobe import metric, table

    last = {"loss": 0.0, "n": 0}

    @table("training_state")
    def training_state() -> dict[str, Any]:
        return {"loss": last["loss"], "lr": opt.param_groups[0]["lr"], "n": last["n"]}

    @metric("steps_seen")
    def steps_seen() -> int:
        last["n"] += 1
        return last["n"]


class _NoThread:
    def join(self, timeout: float | None = None) -> None: ...


def _nothread(h: Any) -> Any:
    h._worker = _NoThread()  # _handoff starts no thread when one is set
    return h


_HOOKS = ARGS.get("hooks")  # the built-in hooks' cost (bench/hooks_cost.py)
#: hooks_ab: the same, measured in this one child by alternating blocks of steps with the
#: hooks live and with no hook machinery at all (see hooks_ab below)
_AB = ARGS.get("hooks_ab")
_HOOKS = _HOOKS or _AB
_live = bool(_HOOKS)  # whether step() emits the points (off in the "off" blocks of hooks_ab)
#: hooks_emit: who emits the points. "bench": step() below, every step, the points claimed
#: (what a framework integration's callback does); "zero": zero-code detection from the
#: optimizer's steps, unclaimed (what a plain loop with hooks from pprobe.toml runs)
_ZERO = ARGS.get("hooks_emit", "bench") == "zero"
if _HOOKS:
    from pprobe import hooks as _ph
    from pprobe.hooks import builtin as _bi

    _made = {
        "time_sys": lambda: [_bi.TimeTrackingHook(frequency=10),
                             _bi.SystemMonitorHook(frequency=10, interval=1.0)],
        # the default (async_cpu="auto": the MLP's 400 KB of grads stay on the training thread)
        "gradflow": lambda: [_bi.GradientFlowHook(frequency=1)],
        # the pprobe-gradflow thread, grads by reference
        "gradflow_ref": lambda: [_bi.GradientFlowHook(frequency=1, async_cpu=True)],
        "gradflow_copy": lambda: [_bi.GradientFlowHook(frequency=1, async_cpu=True,
                                                       handoff="copy")],
        # the statistics on the training thread (one native call), no hand-off
        "gradflow_sync": lambda: [_bi.GradientFlowHook(frequency=1, async_cpu=False)],
        # diagnosis: no pprobe-gradflow thread, the hand-offs wait for the block's settle
        # (hooks_ab with ab_quads only): the statistics never run beside the training thread
        "gradflow_nothread": lambda: [_nothread(_bi.GradientFlowHook(frequency=1,
                                                                     async_cpu=True))],
        # diagnosis: the same two hooks at a frequency they never fire at (after step 0):
        # the idle steps' checks and the sampler thread, without the firing steps' work
        "time_sys_idle": lambda: [_bi.TimeTrackingHook(frequency=10**9),
                                  _bi.SystemMonitorHook(frequency=10**9, interval=1.0)],
        "time": lambda: [_bi.TimeTrackingHook(frequency=10)],  # diagnosis: one of the two
        "sys": lambda: [_bi.SystemMonitorHook(frequency=10, interval=1.0)],
        "noop": lambda: [_ph.BaseHook()],  # the hook machinery and the emits
        "machinery": lambda: [],  # zero-code detection alone, no hook, no emit reaches one
    }[_HOOKS]()  # fmt: skip
    for _h in _made:
        _ph.add(_h)
    from pprobe.hooks import lifecycle as _lc

    _lc.activate()  # what the first add() does (idempotent)
    _ph.register_service("optimizer", opt)
    if not _ZERO:
        _ph.claim("bench")  # the points come from step() below, not zero-code detection
        _ph.emit("before_training", source="bench", model=model)


def step(i: int) -> float:
    xb, yb = data[i % len(data)]
    if _live and not _ZERO:  # what an integration's callback does at each step
        _ph.emit("before_step", source="bench", step=i, model=model)
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    if _live and not _ZERO:
        _ph.emit("after_step", source="bench", step=i, model=model)
    return loss


def _size(path: str) -> tuple[int, int]:
    """(bytes, files) under ``path``."""
    nbytes = files = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            nbytes += os.path.getsize(os.path.join(root, n))
            files += 1
    return nbytes, files


def run_msprobe(task: str, folder: str, out: dict[str, Any]) -> None:
    """The warm-up and timed steps under msprobe (task statistics or tensor, level L1)."""
    dump = os.path.join(folder, "dump")
    what: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["all"]}
    if task == "statistics":
        what["summary_mode"] = "statistics"  # max, min, mean, L2 norm per tensor
    config = {
        "task": task,
        "dump_path": dump,
        "rank": [],
        "step": [],
        "level": "L1",
        "async_dump": False,
        task: what,
    }
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    with Span() as setup:  # like pprobe's start-up and the profiler's import: not timed
        try:
            from msprobe.pytorch import PrecisionDebugger
        except ImportError as e:  # installed without a dependency of its own, say
            out["unavailable"] = f"msprobe is installed but cannot be imported: {e}"
            return
        dbg = PrecisionDebugger(config_path=path)

    def probed(i: int) -> None:
        dbg.start(model)
        step(i)
        dbg.stop()
        dbg.step()

    for i in range(warmup):  # the first start() mounts msprobe's hooks: not in the timing
        probed(i)
    b0, f0 = _size(dump)
    with Span() as loop:
        for i in range(steps):
            probed(i)
    b1, f1 = _size(dump)
    loop.put(out, "loop_s")
    setup.put(out, "setup_s")
    out["dump_mb"], out["dump_files"] = (b1 - b0) / 1e6, f1 - f0
    out["msprobe"] = {"task": task, "level": "L1"}


# The A/B benches (alternate, run_ab, run_ab_quads) collect garbage before each block,
# outside its timing: the collector's counts then start at zero in every block, and a block
# pays for the collections its own allocations trigger. Left alone, a full collection
# (several ms in a torch program) lands in whichever block crosses the threshold, moving
# that block by more than the differences looked for.


def _flush_op_log() -> None:
    """The op log's flush now, on the calling thread (as ``pprobe-writer`` makes it every
    ``flush_seconds``). The A/B benches end every block with it, inside the block's timing:
    each block then pays for writing its own rows. Left to the writer's timer, a flush (~15-20
    ms on this MLP, one per second) lands in whichever block is running and moves that
    quad's process-CPU ratio by several %."""
    from pprobe.session import Session

    s = Session.active
    if s is not None:
        s.writer.flush()


def alternate(out: dict[str, Any]) -> None:
    """The extension API's cost measured inside one process (bench/ext_cost.py): blocks of
    ``block_steps`` steps with the table and metric registered ("on") and unregistered ("off"),
    in the order on-off-off-on (linear drift cancels in each quad). Every block ends with the
    python tables' flush inside its timing, run on another thread as the ``pprobe-ext``
    thread runs it (the main thread waits, using no CPU): making and writing an "on" block's
    rows is counted in that block's process CPU, not in its main thread's. Each block gives
    the main thread's CPU time and the process's CPU time (every thread: pprobe's op writer,
    the tables' flush). The op log is flushed there too (:func:`_flush_op_log`)."""
    import queue
    import threading

    from pprobe.ext import tables as ext_tables

    asks: queue.Queue[int] = queue.Queue()
    done: queue.Queue[int] = queue.Queue()

    def flusher() -> None:  # one thread for the whole run, like pprobe-ext
        while asks.get():
            ext_tables.flush()
            _flush_op_log()
            done.put(1)

    threading.Thread(target=flusher, daemon=True).start()

    n, quads = int(ARGS.get("block_steps", 300)), int(ARGS.get("quads", 6))
    blocks: dict[str, list[list[float]]] = {"on": [], "off": []}
    i = warmup
    for q in range(quads):
        for kind in ("on", "off", "off", "on") if q % 2 == 0 else ("off", "on", "on", "off"):
            if kind == "on":
                ext_tables.register_table("training_state", training_state)
                ext_tables.register_metric("steps_seen", steps_seen)
            else:
                ext_tables.unregister("table", "training_state")
                ext_tables.unregister("metric", "steps_seen")
            gc.collect()  # every block starts from the same collector state (untimed)
            t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
            for _ in range(n):
                step(i)
                i += 1
            asks.put(1)
            done.get()
            blocks[kind].append(
                [time.thread_time() - t0, time.process_time() - p0, time.perf_counter() - w0]
            )
    asks.put(0)
    out["blocks"] = blocks
    out["block_steps"] = n
    out["loop_s"] = sum(b[1] for v in blocks.values() for b in v)


def _hooks_on(on: bool) -> None:
    """Put the hook machinery in place (``on``) or take all of it away: the live hooks, the
    bench's own emits, zero-code detection's step listeners and its global optimizer
    pre-hook (what the first ``pprobe.hooks.add`` installs). SystemMonitor's sampler thread
    keeps running in both states (its CPU is its own thread's, reported apart)."""
    global _live
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from pprobe import recorder
    from pprobe.hooks import dispatch, lifecycle

    _live = on
    for fn, lst in ((lifecycle._on_step_ending, recorder.step_ending_listeners),
                    (lifecycle._on_step_change, recorder.step_listeners)):  # fmt: skip
        if on and fn not in lst:
            lst.append(fn)
        elif not on and fn in lst:
            lst.remove(fn)
    if on:
        dispatch._hooks[:] = _made
        if not lifecycle._handles:
            lifecycle._handles.append(register_optimizer_step_pre_hook(lifecycle._on_optimizer_pre))
    else:
        dispatch._hooks.clear()
        while lifecycle._handles:
            lifecycle._handles.pop().remove()


def run_ab(out: dict[str, Any]) -> None:
    """hooks_ab: ``pairs`` pairs of blocks of ``block`` steps, hooks off then on or on then
    off (alternating, so that neither state always comes first), each block timed on the
    main thread's CPU clock. Per pair, on / off - 1 is the hooks' relative cost."""
    block, pairs = int(ARGS.get("block", 100)), int(ARGS.get("pairs", 20))
    off_s: list[float] = []
    on_s: list[float] = []
    i = 0
    sampler = None
    for h in _made:
        sampler = getattr(h, "sampler", None) or sampler
    c0, w0 = _thread_cpu(sampler), time.perf_counter()
    for p in range(pairs):
        for state_on in (False, True) if p % 2 == 0 else (True, False):
            _hooks_on(state_on)
            gc.collect()  # every block starts from the same collector state (untimed)
            t0 = time.thread_time()
            for _ in range(block):
                step(i)
                i += 1
            (on_s if state_on else off_s).append(time.thread_time() - t0)
    _hooks_on(True)
    out["ab_off_s"], out["ab_on_s"], out["ab_block"] = off_s, on_s, block
    out["ab_wall_s"] = time.perf_counter() - w0
    if sampler is not None:  # the sampler thread's own CPU over the whole alternation
        out["sampler_cpu_s"] = _thread_cpu(sampler) - c0
        out["sampler_samples"] = sampler.samples
    out["ab_loop_s"] = sum(off_s) + sum(on_s)


def _gradflow_on(on: bool) -> None:
    """GradientFlow's hooks in place or fully taken away: the hook machinery
    (:func:`_hooks_on`) and its own step pre-hook on the optimizer (put back by its next
    ``before_step``, as when it is first installed: its idle points are cleared too, or
    that ``before_step`` would never come)."""
    _hooks_on(on)
    if not on:
        for h in _made:
            if getattr(h, "_handle", None) is not None:
                h._handle.remove()
                h._handle = h._hooked = None
            h.idle_points = None


def run_ab_quads(out: dict[str, Any]) -> None:
    """hooks_ab with ``ab_quads``: blocks of ``block`` steps with the hooks in place ("on",
    :func:`_gradflow_on`) and fully taken away ("off"), in the order on-off-off-on,
    off-on-on-off, ... Each block ends with a settle inside its timing: the hand-offs the
    statistics thread has not computed yet are computed on another thread (as the
    ``pprobe-gradflow`` thread would; the main thread waits, using no CPU), the training
    thread verifies them (``_verify``) and the python tables and the op log are flushed on
    that other thread (as ``pprobe-ext`` and ``pprobe-writer`` would): an "on" block's
    statistics, rows and their write are in its process CPU. Per block: [main thread CPU,
    process CPU, wall] seconds."""
    import queue
    import threading

    from pprobe import state as _pstate
    from pprobe.ext import tables as ext_tables

    asks: queue.Queue[int] = queue.Queue()
    done: queue.Queue[int] = queue.Queue()
    flows = [h for h in _made if hasattr(h, "_run_jobs")]

    def settler() -> None:
        while True:
            kind = asks.get()
            if not kind:
                return
            for h in flows:
                if kind == 1:
                    h._run_jobs()
                else:
                    h._write_ready()
            if kind == 2:
                ext_tables.flush()
                _flush_op_log()
            done.put(1)

    threading.Thread(target=settler, daemon=True).start()
    block, quads = int(ARGS.get("block", 100)), int(ARGS.get("ab_quads", 6))
    blocks: dict[str, list[list[float]]] = {"on": [], "off": []}
    i = 0
    missed = 0  # "on" blocks whose last step a GradientFlow hook did not take
    for q in range(quads):
        for kind in ("on", "off", "off", "on") if q % 2 == 0 else ("off", "on", "on", "off"):
            _gradflow_on(kind == "on")
            gc.collect()  # every block starts from the same collector state (untimed)
            t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
            for _ in range(block):
                step(i)
                i += 1
            asks.put(1)  # the statistics not computed yet
            done.get()
            for h in flows:
                h._verify()
            asks.put(2)  # their rows, and the tables' flush
            done.get()
            if kind == "on":  # the hook took the block's last step (the loop's count when
                # the loop emits the points, zero-code detection's otherwise): it was live
                last = i - 1 if not _ZERO else _pstate.step - 1
                missed += sum(getattr(h, "_captured", None) != last for h in flows)
            blocks[kind].append(
                [time.thread_time() - t0, time.process_time() - p0, time.perf_counter() - w0]
            )
    asks.put(0)
    _gradflow_on(True)
    out["missed_blocks"] = missed
    out["blocks"], out["ab_block"] = blocks, block
    out["dropped_steps"] = sum(getattr(h, "dropped_steps", 0) for h in flows)
    out["ab_loop_s"] = sum(b[1] for v in blocks.values() for b in v)


def run_micro(out: dict[str, Any]) -> None:
    """hooks_micro: the machinery's direct cost per step, ``time.thread_time`` over ``n``
    calls in this process, on steps the hooks do not fire at (``step % 10 != 0``) and on
    steps they fire at (multiples of 10): the bench's two emits (points claimed, as in
    run_ab), zero-code emission's optimizer pre-hook and step listeners with the points
    unclaimed (what a plain loop runs) and claimed (what run_ab's "on" blocks run)."""
    import weakref

    from pprobe.hooks import dispatch, lifecycle

    n = int(ARGS.get("n", 20000))
    quiet = [s for s in range(1, 2 * n) if s % 10][:n]
    fire = [10 * s for s in range(1, n // 10 + 1)]
    lifecycle._optimizer = weakref.ref(opt)
    lifecycle._seen_optimizers[id(opt)] = weakref.ref(opt)
    dispatch.register_service("model", model)

    def emits(steps: list[int]) -> float:
        t = time.thread_time()
        for s in steps:
            _ph.emit("before_step", source="bench", step=s, model=model)
            _ph.emit("after_step", source="bench", step=s, model=model)
        return (time.thread_time() - t) / len(steps)

    def zero_code(steps: list[int]) -> float:
        t = time.thread_time()
        for s in steps:
            lifecycle.pending = s
            lifecycle._on_optimizer_pre(opt, (), {})
            lifecycle._on_step_ending(s, s + 1)
            lifecycle._on_step_change(s, s + 1)
        return (time.thread_time() - t) / len(steps)

    got = {"emits": emits(quiet), "emits_firing": emits(fire)}
    dispatch._claimed = None
    got["zero_code"] = zero_code(quiet)
    dispatch.claim("bench")
    got["zero_code_claimed"] = zero_code(quiet)
    out["micro_us"] = {k: v * 1e6 for k, v in got.items()}


def _thread_cpu(sampler: Any) -> float:
    if sampler is None or sampler.thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(sampler.thread.ident))


class _PassThrough(torch.overrides.TorchFunctionMode):
    """``empty_mode``: a TorchFunctionMode that records nothing and calls each function as it
    is. It is the floor of any api-level probe built on the mode (pprobe's ``api`` level is
    one): torch hands every call to the mode, property reads included (``p.grad`` in the
    optimizer), and a pass-through handler is the least a handler can do."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def main() -> None:
    if ARGS.get("empty_mode"):  # around the warm-up and the timed steps, as pprobe's modes
        _PassThrough().__enter__()
    if not ARGS.get("msprobe"):  # msprobe's warm-up runs under it (run_msprobe)
        for i in range(warmup):
            step(i)
    out: dict = {"steps": steps, "units": warmup + steps + 1}
    if ARGS.get("profiler"):
        from torch.profiler import ProfilerActivity, profile

        p = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        p.__enter__()
        with Span() as loop:
            for i in range(steps):
                step(i)
        with Span() as ex:
            p.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        with Span() as export:
            p.export_chrome_trace(path)
        out["trace_mb"] = os.path.getsize(path) / 1e6
        os.unlink(path)
        loop.put(out, "loop_s")
        ex.put(out, "exit_s")
        export.put(out, "export_s")
        out["finish_s"] = ex.s + export.s
    elif ARGS.get("msprobe"):
        d = tempfile.mkdtemp(prefix="msprobe-", dir=ARGS.get("msprobe_dir"))
        try:
            run_msprobe(ARGS["msprobe"], d, out)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    elif ARGS.get("ext") == "alternate":
        alternate(out)
    elif _AB and ARGS.get("hooks_micro"):
        run_micro(out)
    elif _AB and ARGS.get("ab_quads"):
        run_ab_quads(out)
    elif _AB:
        run_ab(out)
    else:
        t0 = time.thread_time()
        with Span() as loop:
            for i in range(steps):
                step(i)
        out["loop_thread_s"] = time.thread_time() - t0  # the main thread's CPU only
        loop.put(out, "loop_s")
    out["final_loss"] = float(step(steps).detach())
    out["mode_active"] = torch._C._is_torch_function_mode_enabled()
    emit(out)


main()
