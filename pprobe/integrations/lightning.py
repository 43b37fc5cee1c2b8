"""PyTorch Lightning (``lightning.pytorch`` and ``pytorch_lightning``): a Callback in every Trainer.

``Trainer.__init__`` is wrapped to append a :class:`Callback` subclass of the framework's own
(made once per framework module) to ``trainer.callbacks``. The Trainer's construction claims
the hook points for ``lightning``: zero-code detection stops emitting, and the callback emits
at Lightning's boundaries:

==============================  ===========================================================
Lightning callback               pprobe
==============================  ===========================================================
on_fit_start                     services trainer, model (the LightningModule), optimizer,
                                 scheduler
on_train_start                   services train_loader, val_loader; ``before_training``
on_train_epoch_start             ``before_epoch(epoch=trainer.current_epoch)``
on_train_batch_start             pprobe's step := trainer.global_step; ``before_step(step)``
on_train_batch_end               ``after_step(step)`` (the same step), then pprobe's step :=
                                 trainer.global_step (the count of optimizer steps done)
on_train_epoch_end               ``after_epoch(epoch, metrics)``
on_train_end / on_exception      ``after_training(metrics)`` (once per fit)
process exit                     ``cleanup`` (once)
==============================  ===========================================================

``metrics`` is ``trainer.callback_metrics`` as floats (built only when a hook is live).

``self.log`` values: at ``on_train_batch_end``, ``on_train_epoch_end`` and
``on_validation_end`` (not during the sanity check) the numbers of the public
``trainer.callback_metrics`` that are new or changed since the last look are written to
``python.metrics`` (name, value) with ``step`` = ``trainer.global_step`` at that moment, each
value once (:class:`MetricsSeen`).
"""

from __future__ import annotations

import atexit
import functools
from typing import Any

from . import (
    claim,
    emit,
    first_of,
    guarded,
    hooks_live,
    numbers,
    record_metrics,
    register_services,
    set_step,
)

SOURCE = "lightning"
#: framework module name -> (Trainer class, its original __init__)
_patched: dict[str, tuple[Any, Any]] = {}
_cleanup_armed = False


def _trainer_services(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """The services a Trainer knows from ``fit`` on: trainer, model, optimizer, scheduler."""
    configs = getattr(trainer, "lr_scheduler_configs", None) or []
    return {
        "trainer": trainer,
        "model": pl_module,
        "optimizer": first_of(getattr(trainer, "optimizers", None)),
        "scheduler": getattr(first_of(configs), "scheduler", None),
    }


def install(module: Any) -> dict[str, Any]:
    """Patch ``module.Trainer`` (module: ``lightning.pytorch`` or ``pytorch_lightning``)."""
    name = module.__name__
    if name in _patched:
        return {"patched": "Trainer.__init__"}
    trainer_cls = module.Trainer
    callback_cls = callback_class(name)
    orig = trainer_cls.__init__

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        _attach(self, callback_cls)

    trainer_cls.__init__ = __init__
    _patched[name] = (trainer_cls, orig)
    return {"patched": "Trainer.__init__", "version": getattr(module, "__version__", None)}


def uninstall() -> None:
    for cls, orig in _patched.values():
        cls.__init__ = orig
    _patched.clear()


@guarded("the Lightning integration (Trainer.__init__)")
def _attach(trainer: Any, callback_cls: type) -> None:
    callbacks = trainer.callbacks
    if not any(isinstance(c, callback_cls) for c in callbacks):
        callbacks.append(callback_cls())
    claim(SOURCE)
    _arm_cleanup()


def _arm_cleanup() -> None:
    """``cleanup`` once at exit (registered after the session's exit handler: runs first)."""
    global _cleanup_armed
    if not _cleanup_armed:
        _cleanup_armed = True
        atexit.register(guarded("the Lightning integration (exit)")(_cleanup))


def _cleanup() -> None:
    emit("cleanup", SOURCE)


def _metrics(trainer: Any) -> dict[str, float] | None:
    return numbers(getattr(trainer, "callback_metrics", None)) if hooks_live() else None


class MetricsSeen:
    """The ``self.log`` values already written: :meth:`new` keeps those that are new or
    changed (compared bit for bit, NaN included) since the last call."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def new(self, values: dict[str, float]) -> dict[str, float]:
        out = {}
        for k, v in values.items():
            old = self.last.get(k)
            if old is None or not (old == v or (old != old and v != v)):
                out[k] = self.last[k] = v
        return out


def _record_logged(trainer: Any, seen: MetricsSeen) -> None:
    """The new or changed numbers of ``trainer.callback_metrics`` into python.metrics at
    ``trainer.global_step`` (the sanity check's validation values are not training's)."""
    if getattr(trainer, "sanity_checking", False):
        return
    values = seen.new(numbers(getattr(trainer, "callback_metrics", None)))
    if values:
        record_metrics(values, int(trainer.global_step))


def make_callback(base: type) -> type:
    """The Callback class for one framework module (its ``Callback`` is ``base``)."""

    class PprobeCallback(base):  # type: ignore[misc, valid-type]
        """pprobe's lifecycle points at Lightning's boundaries (pprobe.integrations.lightning)."""

        def __init__(self) -> None:
            super().__init__()
            self._step = 0
            self._training = False
            self._logged = MetricsSeen()

        @property
        def state_key(self) -> str:
            return "pprobe"

        @guarded("the Lightning integration (on_fit_start)")
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            register_services(_trainer_services(trainer, pl_module))

        @guarded("the Lightning integration (on_train_start)")
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            register_services({
                **_trainer_services(trainer, pl_module),
                "train_loader": getattr(trainer, "train_dataloader", None),
                "val_loader": getattr(trainer, "val_dataloaders", None),
                "epoch": trainer.current_epoch,
                "step": trainer.global_step,
            })  # fmt: skip
            self._training = True
            set_step(trainer.global_step)
            emit("before_training", SOURCE, model=pl_module)

        @guarded("the Lightning integration (on_train_epoch_start)")
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            register_services({"epoch": trainer.current_epoch})
            emit("before_epoch", SOURCE, epoch=trainer.current_epoch, model=pl_module)

        @guarded("the Lightning integration (on_train_batch_start)")
        def on_train_batch_start(
            self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            self._step = step = trainer.global_step
            set_step(step)
            register_services({"step": step})
            emit("before_step", SOURCE, step=step, model=pl_module)

        @guarded("the Lightning integration (on_train_batch_end)")
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            _record_logged(trainer, self._logged)
            emit("after_step", SOURCE, step=self._step, model=pl_module,
                 metrics=_metrics(trainer))  # fmt: skip
            set_step(trainer.global_step)

        @guarded("the Lightning integration (on_validation_end)")
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            _record_logged(trainer, self._logged)

        @guarded("the Lightning integration (on_train_epoch_end)")
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            _record_logged(trainer, self._logged)
            emit("after_epoch", SOURCE, epoch=trainer.current_epoch, model=pl_module,
                 metrics=_metrics(trainer))  # fmt: skip

        @guarded("the Lightning integration (on_train_end)")
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self._end(trainer, pl_module)

        @guarded("the Lightning integration (on_exception)")
        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self._end(trainer, pl_module)

        def _end(self, trainer: Any, pl_module: Any) -> None:
            if self._training:
                self._training = False
                emit("after_training", SOURCE, model=pl_module, metrics=_metrics(trainer))

    return PprobeCallback


#: framework module -> the name its Callback class has here (picklable: ddp_spawn pickles
#: the Trainer with its callbacks; the class is found again through :func:`__getattr__`).
CLASS_NAMES = {"lightning.pytorch": "LightningCallback", "pytorch_lightning": "PLCallback"}
_classes: dict[str, type] = {}


def callback_class(framework: str) -> type:
    """The Callback class for ``framework`` (made once, from its own ``Callback``)."""
    if framework not in _classes:
        from importlib import import_module

        cls = make_callback(import_module(f"{framework}.callbacks").Callback)
        cls.__name__ = cls.__qualname__ = CLASS_NAMES[framework]
        cls.__module__ = __name__
        _classes[framework] = cls
    return _classes[framework]


def __getattr__(name: str) -> Any:
    for framework, cls_name in CLASS_NAMES.items():
        if cls_name == name:
            return callback_class(framework)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
