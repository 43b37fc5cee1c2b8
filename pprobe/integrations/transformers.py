"""Hugging Face ``transformers.Trainer``: a TrainerCallback in every Trainer.

``Trainer.__init__`` is wrapped to ``add_callback`` pprobe's :class:`TrainerCallback`
subclass; the Trainer's construction claims the hook points for ``transformers``:

==============================  ===========================================================
TrainerCallback                  pprobe
==============================  ===========================================================
on_train_begin                   services trainer, model, optimizer, scheduler,
                                 train_loader, val_loader; ``before_training``
on_epoch_begin                   ``before_epoch(epoch=int(state.epoch))``
on_step_begin                    pprobe's step := state.global_step; ``before_step(step)``
on_step_end                      ``after_step(step)`` (the same step), then pprobe's step :=
                                 state.global_step (the count of optimizer steps done)
on_log                           every number logged (loss, learning_rate, grad_norm,
                                 epoch, eval_*, train_*, total_flos) -> ``python.metrics``
                                 with step = state.global_step
on_epoch_end                     ``after_epoch(epoch, metrics)``
on_train_end / train() raised    ``after_training(metrics)`` (once per train())
process exit                     ``cleanup`` (once)
==============================  ===========================================================

``metrics`` is the last ``on_log`` dict's numbers (HF logs every ``logging_steps``).
"""

from __future__ import annotations

import atexit
import functools
from typing import Any

from . import claim, emit, guarded, numbers, record_metrics, register_services, set_step

SOURCE = "transformers"
_patched: list[tuple[Any, str, Any]] = []
_classes: dict[str, type] = {}
_cleanup_armed = False


def install(module: Any) -> dict[str, Any]:
    """Wrap ``Trainer.__init__`` (``module``: ``transformers.trainer``, which the program
    imports when it first touches ``transformers.Trainer``)."""
    if _patched:
        return {"patched": "Trainer.__init__"}
    trainer_cls = module.Trainer
    orig = trainer_cls.__init__
    orig_train = trainer_cls.train

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        _attach(self)

    @functools.wraps(orig_train)
    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig_train(self, *args, **kwargs)
        except BaseException:  # the Trainer has no exception event: after_training here
            _raised(self)
            raise

    trainer_cls.__init__ = __init__
    trainer_cls.train = train
    _patched[:] = [(trainer_cls, "__init__", orig), (trainer_cls, "train", orig_train)]
    return {"patched": "Trainer.__init__", "version": getattr(module, "__version__", None)}


def uninstall() -> None:
    for cls, name, orig in _patched:
        setattr(cls, name, orig)
    _patched.clear()


@guarded("the transformers integration (Trainer.train raised)")
def _raised(trainer: Any) -> None:
    cls = callback_class()
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, cls):
            cb.end(getattr(trainer, "model", None))  # type: ignore[attr-defined]


@guarded("the transformers integration (Trainer.__init__)")
def _attach(trainer: Any) -> None:
    cls = callback_class()
    handler = trainer.callback_handler
    if not any(isinstance(c, cls) for c in handler.callbacks):
        trainer.add_callback(cls(trainer))
    claim(SOURCE)
    global _cleanup_armed
    if not _cleanup_armed:  # after the session's exit handler: runs before it
        _cleanup_armed = True
        atexit.register(guarded("the transformers integration (exit)")(_cleanup))


def _cleanup() -> None:
    emit("cleanup", SOURCE)


def callback_class() -> type:
    if "cls" not in _classes:
        import transformers

        _classes["cls"] = make_callback(transformers.TrainerCallback)
    return _classes["cls"]


def __getattr__(name: str) -> Any:
    if name == "PprobeTrainerCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_callback(base: type) -> type:
    class PprobeTrainerCallback(base):  # type: ignore[misc, valid-type]
        """pprobe's lifecycle points and metrics at the Trainer's boundaries."""

        def __init__(self, trainer: Any = None) -> None:
            self.trainer = trainer
            self._step = 0
            self._epoch = 0
            self._logs: dict[str, float] = {}
            self._training = False

        @guarded("the transformers integration (on_train_begin)")
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            register_services({
                "trainer": self.trainer,
                "model": kw.get("model"),
                "optimizer": kw.get("optimizer"),
                "scheduler": kw.get("lr_scheduler"),
                "train_loader": kw.get("train_dataloader"),
                "val_loader": kw.get("eval_dataloader"),
                "step": state.global_step,
            })  # fmt: skip
            set_step(state.global_step)
            self._training = True
            emit("before_training", SOURCE, model=kw.get("model"))

        @guarded("the transformers integration (on_epoch_begin)")
        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._epoch = int(state.epoch or 0)
            register_services({"epoch": self._epoch})
            emit("before_epoch", SOURCE, epoch=self._epoch, model=kw.get("model"))

        @guarded("the transformers integration (on_step_begin)")
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._step = step = state.global_step
            set_step(step)
            register_services({"step": step})
            emit("before_step", SOURCE, step=step, model=kw.get("model"))

        @guarded("the transformers integration (on_step_end)")
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("after_step", SOURCE, step=self._step, model=kw.get("model"),
                 metrics=dict(self._logs))  # fmt: skip
            set_step(state.global_step)

        @guarded("the transformers integration (on_log)")
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:  # fmt: skip
            values = numbers(logs)
            # the entry Trainer.log appended just before: earlier callbacks may have popped
            # keys from ``logs`` (ProgressCallback pops total_flos)
            history = getattr(state, "log_history", None)
            last = history[-1] if history else None
            if isinstance(last, dict) and last.get("step") == state.global_step:
                full = numbers({k: v for k, v in last.items() if k != "step"})
                if full.keys() >= values.keys():
                    values = full
            self._logs = values
            record_metrics(values, state.global_step)

        @guarded("the transformers integration (on_epoch_end)")
        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("after_epoch", SOURCE, epoch=self._epoch, model=kw.get("model"),
                 metrics=dict(self._logs))  # fmt: skip

        @guarded("the transformers integration (on_train_end)")
        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.end(kw.get("model"))

        def end(self, model: Any) -> None:
            """after_training, once per train() (on_train_end, or train() raised)."""
            if self._training:
                self._training = False
                emit("after_training", SOURCE, model=model, metrics=dict(self._logs))

    PprobeTrainerCallback.__module__ = __name__
    return PprobeTrainerCallback
