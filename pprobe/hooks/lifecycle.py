"""Zero-code lifecycle detection: where ``before_step``, ``after_epoch``... come from.

Sources, all switched on by :func:`activate` (the first hook added, or ``[[hooks]]`` in the
config); with no hook nothing here is imported and the step path costs nothing more.

* **Steps.** ``recorder.set_step`` calls :func:`_on_step_change` (a step listener) whenever the
  step moves: an optimizer step ending (pprobe.interceptors.torch_modules), ``pprobe.step()``
  or ``PPROBE_STEP_AT`` (pprobe.stepat). There ``after_step(old)`` fires, then at once
  ``before_step(new)``. The first step's start is only observable where a source says so: the
  first ``optimizer.step()`` begins (torch's global optimizer pre-hook), the first call of a
  ``PPROBE_STEP_AT`` function or the first run of its line; with ``pprobe.step()`` alone it is
  the first call (the step it ends). ``before_training`` fires there, just before the first
  ``before_epoch`` / ``before_step``.
* **Epochs.** ``DataLoader.__iter__`` and the iterators' ``__next__`` are wrapped (only now).
  The training loader is the one whose iterator is running when the first optimizer step
  begins; epoch 0 opens then (late: its first batches were already fetched), each new
  iterator of that loader opens the next epoch, the iterator running out (StopIteration)
  closes it, and so does a new iterator of that loader when the previous one was left early.
  ``pprobe.epoch()`` sets epochs by hand and stops this detection.
* **End.** ``after_epoch`` (still open), ``after_training`` and ``cleanup`` run from the
  session's stop: at exit, after an uncaught exception, on ``sys.exit``/``os._exit``, on
  SIGTERM (pprobe.session's watcher thread, within its grace second) or ``pprobe.disable()``;
  cleanup once per process (:func:`pprobe.hooks.dispatch.shutdown`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from typing import Any

from .. import _report, recorder, state
from . import dispatch

_active = False
started = False  # before_training emitted by this module
open_step: int | None = None  # the step whose before_step fired and whose after_step did not
pending: int | None = None  # the step an optimizer step ended into, before_step not yet fired
epoch = 0
epochs_started = 0
epoch_open = False
manual_epochs = False  # pprobe.epoch() was called: DataLoader epochs are not counted
steps_in_epoch = 0
_quiet = 0  # > 0: a set_step that pprobe.stepat emits itself (it fires the points)
_train_loader: Any = None  # weakref to the training DataLoader
_live_loader: Any = None  # weakref to the loader whose iterator runs now
_optimizer: Any = None  # weakref to the optimizer whose services are registered
#: id -> weakref of every optimizer that stepped: the last one to take its first step gives
#: the services (a program that trains a second model; a GAN: its second optimizer)
_seen_optimizers: dict[int, Any] = {}
_handles: list[Any] = []
_torch_done = False


# ---------------------------------------------------------------------- activation
def activate() -> None:
    """Start zero-code detection (idempotent; the first hook calls it)."""
    global _active
    if _active:
        return
    _active = True
    os.register_at_fork(after_in_child=_after_fork_child)
    if _on_step_change not in recorder.step_listeners:
        recorder.step_ending_listeners.append(_on_step_ending)
        recorder.step_listeners.append(_on_step_change)
    _base_services()
    if "torch" in sys.modules:
        _install_torch()
    else:
        try:
            import wrapt

            wrapt.register_post_import_hook(_torch_imported, "torch")
        except Exception as exc:  # noqa: BLE001
            _report.internal_error("watching for torch (lifecycle hooks)", exc)


def _after_fork_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing fork) is not the training
    process: its copy of the hooks never fires, not even cleanup at its exit."""
    global _active
    _active = False
    dispatch._hooks.clear()  # no lock: another thread may have held it at the fork
    dispatch._lock = threading.RLock()
    dispatch._cleaned = True


def _torch_imported(module: Any) -> None:
    try:
        if _active:
            _install_torch()
    except Exception as exc:  # noqa: BLE001 - an import hook must not break the import
        _report.internal_error("lifecycle hooks for torch", exc)


def _base_services() -> None:
    from ..session import Session

    reg = dispatch.register_service
    reg("logger", logging.getLogger("pprobe.hooks"))
    reg("step", state.step)
    reg("epoch", epoch)
    s = Session.active
    if s is None:
        return
    reg("config", s.config)
    run_dir = s.run.dir
    reg("experiment_dir", run_dir)
    perms = s.config.permissions
    dispatch.register_lazy_service("logs_dir", lambda: _make_dir(run_dir, "logs", perms))
    dispatch.register_lazy_service(
        "visualization_dir", lambda: _make_dir(run_dir, "visualization", perms)
    )


def _make_dir(run_dir: str, name: str, permissions: str) -> str:
    """A folder of the run, made on first use with the run folder's permissions."""
    from ..safefs import PERMISSIONS

    path = os.path.join(run_dir, name)
    mode = PERMISSIONS[permissions][0]
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)  # makedirs' mode is masked by the umask
    return path


def _install_torch() -> None:
    global _torch_done
    if _torch_done:
        return
    _torch_done = True
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torch.utils.data import dataloader

    _handles.append(register_optimizer_step_pre_hook(_on_optimizer_pre))
    loader_cls = dataloader.DataLoader
    iter_cls = dataloader._BaseDataLoaderIter
    orig_iter = loader_cls.__iter__
    orig_next = iter_cls.__next__

    def __iter__(self: Any) -> Any:
        it = orig_iter(self)
        try:
            _loader_started(self, it)
        except Exception as exc:  # noqa: BLE001
            _report.internal_error("DataLoader.__iter__ (lifecycle hooks)", exc)
        return it

    def __next__(self: Any) -> Any:
        try:
            batch = orig_next(self)
        except StopIteration:
            try:
                _loader_ended(self)
            except Exception as exc:  # noqa: BLE001
                _report.internal_error("DataLoader iterator end (lifecycle hooks)", exc)
            raise
        if pending is not None:
            try:
                _batch_fetched(self)
            except Exception as exc:  # noqa: BLE001
                _report.internal_error("DataLoader batch (lifecycle hooks)", exc)
        return batch

    __iter__.__wrapped__ = orig_iter  # type: ignore[attr-defined]
    __next__.__wrapped__ = orig_next  # type: ignore[attr-defined]
    loader_cls.__iter__ = __iter__  # type: ignore[method-assign]
    iter_cls.__next__ = __next__  # type: ignore[method-assign]
    recorder.add_internal_path(__file__)


# ---------------------------------------------------------------------- training start
def _ctx() -> dict[str, Any]:
    return {"model": dispatch.get_service("model")}


def _heard() -> bool:
    """Whether a point this module emits reaches a hook: some hook is live and no framework
    integration (or a program's ``claim``) has taken the points. When not, the points'
    context (model, metrics) is not built and :func:`dispatch.emit` is not called: the
    step path then costs only this module's bookkeeping."""
    return dispatch._claimed is None and bool(dispatch._hooks)


def _start() -> None:
    global started
    if started:
        return
    started = True
    dispatch.emit("before_training", **_ctx())


#: The step whose ``before_step`` this module is emitting now (else None): a hook can tell
#: zero-code detection's points from a program's or an integration's own emits.
opening: int | None = None


def _open_step(n: int, unheard: bool = False) -> None:
    """Step ``n`` opens: its ``before_step`` unless ``unheard`` (the caller has just found
    that it calls no hook: :func:`dispatch.calls_none` is not asked twice a step)."""
    global open_step, steps_in_epoch, pending, opening
    open_step, pending = n, None
    steps_in_epoch += 1
    dispatch.register_service("step", n)
    dispatch.step_opened, dispatch.step_opened_ns = n, time.perf_counter_ns()
    if not unheard and _heard() and not dispatch.calls_none("before_step", n):
        opening = n
        try:
            dispatch.emit("before_step", step=n, **_ctx())
        finally:
            opening = None


def _close_step() -> None:
    global open_step
    if open_step is None:
        return
    n, open_step = open_step, None
    if _heard() and not dispatch.calls_none("after_step", n):
        dispatch.emit("after_step", step=n, metrics=_step_metrics(), **_ctx())


def _step_metrics() -> dict[str, Any]:
    out: dict[str, Any] = {}
    opt = _optimizer() if _optimizer is not None else None
    if opt is not None:
        try:
            out["lr"] = float(opt.param_groups[0]["lr"])
        except Exception:  # noqa: BLE001
            pass
    return out


def _open_epoch(n: int) -> None:
    global epoch, epoch_open, steps_in_epoch, epochs_started
    epoch, epoch_open, steps_in_epoch = n, True, 0
    epochs_started += 1
    dispatch.register_service("epoch", n)
    dispatch.emit("before_epoch", epoch=n, **_ctx())


def _close_epoch() -> None:
    global epoch_open
    if not epoch_open:
        return
    epoch_open = False
    dispatch.emit("after_epoch", epoch=epoch, metrics={"steps": steps_in_epoch}, **_ctx())


def begin_step(n: int) -> None:
    """A source knows step ``n`` starts now (optimizer pre-hook, PPROBE_STEP_AT)."""
    _start()
    if open_step == n:
        return
    _close_step()
    _open_step(n)


def end_step() -> None:
    """A source knows the open step ends now (a PPROBE_STEP_AT function returns)."""
    _close_step()


class quiet:
    """``with quiet(): recorder.set_step(n)``: a step change whose points the caller fires."""

    def __enter__(self) -> None:
        global _quiet
        _quiet += 1

    def __exit__(self, *exc: object) -> None:
        global _quiet
        _quiet -= 1


def _py_on_step_ending(old: int, new: int) -> None:
    """recorder's step-ending listener (the native core's ``lifecycle_ending`` takes its idle
    steps and hands it the rest): step ``old`` ends (``state.step`` is still ``old``,
    so what ``after_step`` records is in the step that ends)."""
    global open_step
    if _quiet or old == new:
        return
    if (
        open_step is not None
        and started
        and (not _heard() or dispatch.calls_none("after_step", open_step))
    ):
        open_step = None  # _close_step with no hook to call: no context, no emit
        return
    with state.internal():
        _start()
        if open_step is None:
            # late: pprobe.step() ends steps, and a pending step may end before it opened
            _open_step(old if pending is None else pending)
        _close_step()


def _py_on_step_change(old: int, new: int) -> None:
    """recorder's step listener: the step moved from ``old`` to ``new`` (the native core's
    ``lifecycle_change`` is its twin and hands it manual steps).

    ``pprobe.step()`` opens the new step at once. An optimizer step leaves it pending: it
    opens at the training loader's next batch or the next ``optimizer.step()``, whichever
    comes first, so the step after the last one never opens."""
    global pending
    if _quiet or old == new:
        return
    if state.manual_step:
        with state.internal():
            _open_step(new)
    else:
        pending = new


# ---------------------------------------------------------------------- torch
def _py_on_optimizer_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global optimizer pre-hook (the native core's ``lifecycle_pre`` takes the idle
    steps of known optimizers and hands it the rest)."""
    global _optimizer, _train_loader
    if state.manual_step or _quiet:
        return
    if _optimizer is not None:
        w = _seen_optimizers.get(id(optimizer))
        if (
            w is not None
            and w() is optimizer
            and (pending is None or not _heard() or dispatch.calls_none("before_step", pending))
        ):
            # a later step of a known optimizer whose before_step calls no hook:
            # _open_step's bookkeeping only (no context, no emit, no torch op)
            if pending is not None:
                _open_step(pending, unheard=True)
            return
        try:
            with state.internal():
                w = _seen_optimizers.get(id(optimizer))
                if w is None or w() is not optimizer:  # its first step: its services now
                    _seen_optimizers[id(optimizer)] = weakref.ref(optimizer)
                    _optimizer = weakref.ref(optimizer)
                    _find_services(optimizer, again=True)
                if pending is not None:
                    _open_step(pending)
        except Exception as exc:  # noqa: BLE001
            _report.internal_error("optimizer pre-step hook (lifecycle hooks)", exc)
        return
    try:
        with state.internal():
            _optimizer = weakref.ref(optimizer)
            _seen_optimizers[id(optimizer)] = weakref.ref(optimizer)
            _find_services(optimizer)
            live = _live_loader() if _live_loader is not None else None
            if live is not None and not manual_epochs:
                _train_loader = weakref.ref(live)
                dispatch.register_service("train_loader", live)
            _start()
            if live is not None and not manual_epochs and not epoch_open:
                _open_epoch(0)
            if open_step is None:
                _open_step(state.step)
    except Exception as exc:  # noqa: BLE001
        _report.internal_error("optimizer pre-step hook (lifecycle hooks)", exc)


def _fire_before(n: int) -> None:
    """The native core's ``lifecycle_pre`` found that step ``n`` of a known optimizer opens
    and that its ``before_step`` calls a hook, and did :func:`_open_step`'s bookkeeping: the
    emit, as :func:`_py_on_optimizer_pre` makes it there (pprobe's own work; what the hooks
    raise is reported, never raised into the optimizer's step)."""
    global opening
    try:
        with state.internal():
            opening = n
            try:
                dispatch.emit("before_step", step=n, **_ctx())
            finally:
                opening = None
    except Exception as exc:  # noqa: BLE001
        _report.internal_error("optimizer pre-step hook (lifecycle hooks)", exc)


def _fire_after(n: int) -> None:
    """The native core's ``lifecycle_ending`` closed the open step ``n``, whose
    ``after_step`` calls a hook: the emit, as :func:`_close_step` makes it from
    :func:`_py_on_step_ending` (what it raises goes to the recorder's listener loop)."""
    with state.internal():
        dispatch.emit("after_step", step=n, metrics=_step_metrics(), **_ctx())


def _fast_paths() -> tuple[Any, Any, Any]:
    """The listeners and the pre-hook: the native core's twins (an idle step costs no Python
    frame: pprobe/_native.c, "lifecycle hooks' steps"), or the Python functions."""
    from .. import core

    native = core.native
    if native is None:
        return _py_on_optimizer_pre, _py_on_step_ending, _py_on_step_change
    twins = (_py_on_optimizer_pre, _py_on_step_ending, _py_on_step_change,
             dispatch.py_calls_none, _fire_before, _fire_after)  # fmt: skip
    native.lifecycle_setup(globals(), vars(dispatch), vars(state), *twins)
    dispatch.calls_none = native.calls_none
    return native.lifecycle_pre, native.lifecycle_ending, native.lifecycle_change


_on_optimizer_pre, _on_step_ending, _on_step_change = _fast_paths()


def _find_services(optimizer: Any, again: bool = False) -> None:
    """model (the module holding the optimizer's parameters), optimizer, scheduler, device.
    ``again``: a later optimizer replaces the first one's (a program that trains twice)."""
    reg = dispatch.register_service
    reg("optimizer", optimizer)
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    model = _model_of(ids)
    if model is not None and (again or dispatch.get_service("model") is None):
        reg("model", model)
    try:
        first = next(p for g in optimizer.param_groups for p in g["params"])
        reg("device", first.device)
    except StopIteration:
        pass
    if again or dispatch.get_service("scheduler") is None:
        sched = _scheduler_of(optimizer)
        if sched is not None or again:
            reg("scheduler", sched)


def _model_of(ids: set[int]) -> Any:
    """The module that holds the most of these parameters, the smallest such one."""
    tm = sys.modules.get("pprobe.interceptors.torch_modules")
    if tm is None:
        return None
    best: Any = None
    key: tuple[int, int] = (0, 0)
    for i, (_, ref) in list(tm._paths.items()):
        m = ref()
        if m is None or id(m) != i:
            continue
        own = [id(p) for p in m.parameters()]
        k = (sum(1 for p in own if p in ids), -len(own))
        if k[0] and k > key:
            best, key = m, k
    return best


def _scheduler_of(optimizer: Any) -> Any:
    """An LR scheduler built on ``optimizer`` (found once, at the first step)."""
    import gc

    try:
        from torch.optim.lr_scheduler import LRScheduler
    except ImportError:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            # type(), not isinstance(): isinstance reads __class__, which some objects turn
            # into a property that warns (torch.distributed.reduce_op)
            if issubclass(type(obj), LRScheduler):
                d = getattr(obj, "__dict__", None)
                if isinstance(d, dict) and d.get("optimizer") is optimizer:
                    return obj
    return None


def _loader_started(loader: Any, it: Any) -> None:
    global _live_loader
    _live_loader = weakref.ref(loader)
    it._pprobe_loader = weakref.ref(loader)
    train = _train_loader() if _train_loader is not None else None
    if train is None or loader is not train or manual_epochs:
        return
    with state.internal():
        nxt = epoch + 1 if epochs_started else 0
        _close_epoch()
        _open_epoch(nxt)


def _batch_fetched(it: Any) -> None:
    """The training loader gave a batch while a step is pending: that step starts."""
    ref = getattr(it, "_pprobe_loader", None)
    train = _train_loader() if _train_loader is not None else None
    if ref is not None and train is not None and ref() is train and pending is not None:
        with state.internal():
            _open_step(pending)


def _loader_ended(it: Any) -> None:
    global _live_loader
    ref = getattr(it, "_pprobe_loader", None)
    loader = ref() if ref is not None else None
    if _live_loader is not None and _live_loader() is loader:
        _live_loader = None
    train = _train_loader() if _train_loader is not None else None
    if loader is not None and loader is train and not manual_epochs:
        with state.internal():
            _close_epoch()


# ---------------------------------------------------------------------- manual epochs
def set_epoch(n: int) -> None:
    """``pprobe.epoch(n)``: epoch ``n`` begins (the open one ends)."""
    global manual_epochs
    manual_epochs = True
    with state.internal():
        _start()
        _close_epoch()
        _open_epoch(n)


# ---------------------------------------------------------------------- end
def finish() -> None:
    """The session stops: the open epoch ends, then after_training and cleanup (once). A step
    still open gets no after_step: it did not end (the program stopped inside it)."""
    if not _active:
        return
    with state.internal():
        _close_epoch()
        dispatch.shutdown(model=dispatch.get_service("model"), metrics=_final_metrics())


def _final_metrics() -> dict[str, Any]:
    return {"steps": state.step, "epochs": epochs_started}
