"""Framework integrations: Lightning, transformers.Trainer and Accelerate, installed on import.

:func:`watch` (called once by the session's start) registers a post-import hook per framework
module in :data:`WATCHED`; nothing of a framework is imported before the program imports it,
and this package imports nothing heavy. When the program imports one, its module here
(``lightning.py``, ``transformers.py``, ``accelerate.py``) patches it:

- Lightning (``lightning.pytorch`` and ``pytorch_lightning``): a Callback appended to every
  Trainer; it claims the hook points (``pprobe.hooks.claim``) and emits them at the
  framework's exact boundaries, and sets pprobe's step to ``trainer.global_step``.
- transformers: a TrainerCallback added to every Trainer, the same points, and ``on_log``
  metrics written to ``python.metrics`` with their step.
- Accelerate: ``Accelerator.log`` values written to ``python.metrics``.

Every callback body runs under :func:`guarded`: a failure inside pprobe is reported once
(stderr and meta.json) and never raised into the training. docs/integrations.md says when
each point fires and what is recorded.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: framework module -> (its name in PPROBE_INTEGRATIONS, the module here that integrates it
#: with its ``install(module)``).
WATCHED = {
    "lightning.pytorch": ("lightning", "pprobe.integrations.lightning"),
    "pytorch_lightning": ("lightning", "pprobe.integrations.lightning"),
    # the modules that define the classes patched: ``import transformers`` alone (lazy) does
    # not import its Trainer, and pprobe does not either
    "transformers.trainer": ("transformers", "pprobe.integrations.transformers"),
    "accelerate.accelerator": ("accelerate", "pprobe.integrations.accelerate"),
}

#: framework module -> what its install() returned (installed once per process).
installed: dict[str, Any] = {}
_watching = False


def watch(enabled: Iterable[str] = ("lightning", "transformers", "accelerate")) -> None:
    """Install each integration named in ``enabled`` (the ``integrations`` setting) now if
    its framework is imported, else when it is."""
    global _watching
    if _watching:
        return
    _watching = True
    wanted = set(enabled)
    for name, (integration, _) in WATCHED.items():
        if integration not in wanted:
            continue
        if name in sys.modules:
            _install(name)
        else:
            import wrapt

            wrapt.register_post_import_hook(_hook_for(name), name)


def _hook_for(name: str) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        # a post-import hook that raises would make the program's import fail
        try:
            _install(name)
        except Exception as e:  # noqa: BLE001
            _internal(f"the {name} integration", e)

    return hook


def _install(name: str) -> None:
    if name in installed or _session() is None:
        return
    installed[name] = None  # once, even when it fails
    try:
        mod = importlib.import_module(WATCHED[name][1])
        installed[name] = mod.install(sys.modules[name])
    except Exception as e:  # noqa: BLE001 - an integration never breaks the import
        _internal(f"installing the {name} integration", e)


def _session() -> Any:
    mod = sys.modules.get("pprobe.session")
    return mod.Session.active if mod is not None else None


def _internal(where: str, exc: BaseException) -> None:
    from .. import _report

    _report.internal_error(where, exc, "The program goes on; the integration skips this call.")


def guarded(what: str) -> Callable[[F], F]:
    """A callback body that never raises: a failure is reported once per ``what`` and kind,
    and the call returns None. pprobe's own work inside is not recorded as ops. Without an
    active session (after ``pprobe.disable()``) it does nothing: the patches stay, inert."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            from .. import state

            if _session() is None:
                return None
            try:
                with state.internal():
                    return fn(*args, **kw)
            except Exception as e:  # noqa: BLE001 - never into the training loop
                _internal(what, e)
                return None

        return wrapper  # type: ignore[return-value]

    return deco


# ---------------------------------------------------------------------- what callbacks do
def emit(point: str, source: str, **ctx: Any) -> None:
    """``pprobe.hooks.emit`` from ``source`` (imported only when hooks are live)."""
    hooks = sys.modules.get("pprobe.hooks.dispatch")
    if hooks is None:  # nobody imported pprobe.hooks: no hook can be live
        return
    hooks.emit(point, source=source, **ctx)


def hooks_live() -> bool:
    """Whether any hook is live (else the points' context is not worth building)."""
    hooks = sys.modules.get("pprobe.hooks.dispatch")
    return hooks is not None and bool(hooks._hooks)


def claim(source: str) -> None:
    from ..hooks import dispatch

    dispatch.claim(source)


def register_services(services: Mapping[str, Any]) -> None:
    """Services for hooks (``BaseHook.get_service``); None values are not registered."""
    from ..hooks import dispatch

    for name, obj in services.items():
        if obj is not None:
            dispatch.register_service(name, obj)


def set_step(step: int) -> None:
    """pprobe's step (the ``step`` column of the rows that follow) is the framework's: the
    optimizer-step detection stops counting, as after ``pprobe.step()``."""
    from .. import recorder, state

    state.manual_step = True
    if state.step != step:
        recorder.set_step(int(step))


def numbers(values: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric entries of ``values`` (floats, ints, 0-d tensors and arrays) as floats;
    strings, bools, lists and larger tensors are left out."""
    out: dict[str, float] = {}
    for k, v in (values or {}).items():
        if isinstance(v, bool) or isinstance(v, (str, bytes)):
            continue
        if isinstance(v, (int, float)):
            out[str(k)] = float(v)
            continue
        numel = getattr(v, "numel", None) or getattr(v, "size", None)
        try:
            n = numel() if callable(numel) else numel
            if n == 1 and hasattr(v, "item"):
                out[str(k)] = float(v.item())
        except Exception:  # noqa: BLE001 - not a number: left out
            pass
    return out


def record_metrics(values: Mapping[str, float], step: int | None) -> None:
    """Rows of ``python.metrics`` (``name``, ``value``, and pprobe's columns), the same as
    ``@metric`` rows, with ``step`` = the framework's step (pprobe's when None)."""
    if not values:
        return
    from .. import state
    from ..ext import tables

    std = tables._std()
    std["step"] = state.step if step is None else int(step)
    tables._add("metrics", [{"name": k, "value": v} for k, v in values.items()], std)
    tables._activate()


def first_of(items: Iterable[Any] | None) -> Any:
    for x in items or ():
        return x
    return None


__all__ = ["WATCHED", "guarded", "installed", "watch"]
