"""Hugging Face Accelerate: ``accelerator.log(values, step=...)`` -> ``python.metrics``.

``Accelerator.log`` is wrapped rather than a ``GeneralTracker`` registered: a tracker only
receives values when the program built its Accelerator with ``log_with=`` and called
``init_trackers()``, and adding one would change ``accelerator.trackers`` (what
``get_tracker``, ``end_training`` and the program see). The wrapper records every call and
changes nothing the program can observe. As a tracker would, it records on the main process
only (``Accelerator.log`` is ``@on_main_process``).

Rows: ``name``, ``value`` (every number in ``values``; strings are left out) with ``step``
= the ``step`` argument, or pprobe's step when it is None. The constructed Accelerator is
registered as the service ``accelerator``. Accelerate has no training loop of its own: the
hook points come from zero-code detection (its prepared optimizer's steps), not from here.
"""

from __future__ import annotations

import functools
from typing import Any

from . import guarded, numbers, record_metrics, register_services

_patched: list[tuple[Any, str, Any]] = []


def install(module: Any) -> dict[str, Any]:
    """Wrap ``Accelerator.log`` and ``Accelerator.__init__`` (module: accelerate.accelerator)."""
    if _patched:
        return {"patched": "Accelerator.log"}
    cls = module.Accelerator
    orig_log = cls.log
    orig_init = cls.__init__

    @functools.wraps(orig_log)
    def log(self: Any, values: Any, step: int | None = None, *args: Any, **kwargs: Any) -> Any:
        _record(self, values, step)
        return orig_log(self, values, step, *args, **kwargs)

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        _register(self)

    cls.log = log
    cls.__init__ = __init__
    _patched[:] = [(cls, "log", orig_log), (cls, "__init__", orig_init)]
    return {"patched": "Accelerator.log", "version": _version()}


def uninstall() -> None:
    for cls, name, orig in _patched:
        setattr(cls, name, orig)
    _patched.clear()


def _version() -> Any:
    import sys

    return getattr(sys.modules.get("accelerate"), "__version__", None)


@guarded("the Accelerate integration (Accelerator.log)")
def _record(accelerator: Any, values: Any, step: int | None) -> None:
    if not getattr(accelerator, "is_main_process", True):
        return
    record_metrics(numbers(values), step)


@guarded("the Accelerate integration (Accelerator.__init__)")
def _register(accelerator: Any) -> None:
    register_services({"accelerator": accelerator})
