"""The live hooks, the services they share, and :func:`emit` that calls them at a boundary.

Who emits: zero-code detection (optimizer steps, DataLoader epochs, exit) unless a framework
integration has :func:`claim`\\ ed the boundaries, in which case only that integration emits
(its boundaries are exact). Hooks run under ``state.internal()``: their own NumPy/torch calls
are not recorded. A hook that raises is reported once and switched off after
:data:`MAX_FAILURES` failures; training goes on.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

from .. import state
from .base import BaseHook

#: The lifecycle points, in the order a run meets them.
POINTS = (
    "before_training",
    "before_epoch",
    "before_step",
    "after_step",
    "after_epoch",
    "after_training",
    "cleanup",
)
STEP_POINTS = ("before_step", "after_step")
EPOCH_POINTS = ("before_epoch", "after_epoch")
#: A hook that raised this many times is switched off.
MAX_FAILURES = 5

_lock = threading.RLock()
_hooks: list[Any] = []
_services: dict[str, Any] = {}
_claimed: str | None = None
_params: dict[tuple[type, str], frozenset[str] | None] = {}
#: name -> factory of a service made on first use (visualization_dir creates its folder)
_lazy: dict[str, Any] = {}
#: Whether training is running (before_training emitted, after_training not yet) and whether
#: cleanup ran: :func:`shutdown` closes what is open, and cleanup runs once per process.
_training = False
_cleaned = False
#: The step whose ``before_step`` point came last, and when (``time.perf_counter_ns()``):
#: stamped at every step that opens, whether or not a hook is called there (zero-code
#: detection: lifecycle's ``_open_step`` and its native twin; an emitter's own points:
#: :func:`emit`). TimeTracking times a step from it, so it needs no ``before_step`` of its own.
step_opened: Any = None
step_opened_ns = 0


def hooks() -> list[Any]:
    """The live hooks, in the order they were added."""
    return list(_hooks)


def add(hook: Any) -> Any:
    """Make ``hook`` live (it fires from the next boundary on); returns it."""
    with _lock:
        if hook not in _hooks:
            _hooks.append(hook)
    from . import lifecycle

    lifecycle.activate()  # zero-code detection starts with the first hook
    return hook


def remove(hook: Any) -> None:
    with _lock:
        if hook in _hooks:
            _hooks.remove(hook)


#: Services whose change wakes every hook's idle points (a hook idle on its steps may hold
#: state about them: GradientFlow's optimizer pre-hook).
_WAKING = frozenset(["model", "optimizer"])


def register_service(name: str, obj: Any) -> None:
    if name in _WAKING and _services.get(name) is not obj:
        for hook in tuple(_hooks):
            if getattr(hook, "__dict__", _NO_DICT).get("idle_points"):
                hook.idle_points = None
    _services[name] = obj


def register_lazy_service(name: str, factory: Any) -> None:
    """``name`` is made by ``factory()`` on its first :func:`get_service` (then kept)."""
    _lazy[name] = factory


def get_service(name: str) -> Any:
    if name not in _services and name in _lazy:
        try:
            _services[name] = _lazy.pop(name)()
        except Exception as exc:  # noqa: BLE001 - a service never breaks the program
            from .. import _report

            _report.internal_error(f"making the hook service {name!r}", exc)
            return None
    return _services.get(name)


def claim(source: str) -> None:
    """A framework integration takes over the boundaries: zero-code detection stops emitting."""
    global _claimed
    _claimed = source


def claimed_by() -> str | None:
    return _claimed


def _accepted(hook: Any, point: str) -> frozenset[str] | None:
    """The keyword names ``hook.point`` takes (None: it takes ``**kwargs``)."""
    key = (type(hook), point)
    if key not in _params:
        try:
            sig = inspect.signature(getattr(hook, point))
        except (TypeError, ValueError):
            _params[key] = None
        else:
            ps = sig.parameters.values()
            _params[key] = (
                None if any(p.kind is p.VAR_KEYWORD for p in ps) else frozenset(p.name for p in ps)
            )
    return _params[key]


#: The points, as a set (the check at each emit), and the step/epoch points: point -> the
#: context key that holds their count (what ``should_trigger`` is given).
_POINT_SET = frozenset(POINTS)
_COUNTED = {"before_step": "step", "after_step": "step", "before_epoch": "epoch",
            "after_epoch": "epoch"}  # fmt: skip
_base_trigger = BaseHook.should_trigger
#: class -> (the points it has a method of its own for, whether its should_trigger is
#: BaseHook's), looked up once per hook per emit
_kinds: dict[type, tuple[frozenset[str], bool]] = {}
_NO_DICT: dict[str, Any] = {}
_UNSEEN = object()  # a (class, point) whose keyword names _accepted has not read yet


def _kind(cls: type) -> tuple[frozenset[str], bool]:
    k = _kinds.get(cls)
    if k is None:
        own = frozenset(p for p in POINTS
                        if (fn := getattr(cls, p, None)) is not None
                        and fn is not getattr(BaseHook, p))  # fmt: skip
        k = _kinds[cls] = (own, getattr(cls, "should_trigger", None) is _base_trigger)
    return k


def py_calls_none(point: str, at: int) -> bool:
    """Whether the step or epoch point ``point`` at count ``at`` would call no hook: every
    live hook is off, has no method for it, holds it in its ``idle_points``, or has
    BaseHook's ``should_trigger`` and ``at % frequency`` is not 0. A hook with its own
    ``should_trigger`` counts as called (it is asked once, by :func:`emit`). Zero-code
    detection skips building the point's context (model, metrics) and the emit when this is
    True."""
    for hook in tuple(_hooks):
        own, plain = _kinds.get(type(hook)) or _kind(type(hook))
        d = getattr(hook, "__dict__", _NO_DICT)
        idle = d.get("idle_points")
        if ((point not in own and point not in d) or getattr(hook, "off", False)
                or (idle and point in idle)):  # fmt: skip
            continue
        if not plain or "should_trigger" in d:
            return False
        try:
            if not at % hook.frequency:
                return False
        except Exception:  # noqa: BLE001 - emit reports it
            return False
    return True


#: calls_none(point, at): the native core's twin of :func:`py_calls_none` (which answers
#: where the twin cannot tell: a hook class not yet seen) once lifecycle detection has set it
#: up, else the Python function.
calls_none = py_calls_none


def emit(point: str, source: str | None = None, **ctx: Any) -> None:
    """Call ``point`` on every live hook that wants it, with the context it accepts.

    ``source``: who emits (None for zero-code detection); ignored when another source has
    claimed the boundaries. ``ctx``: step, epoch, model, metrics, ... (each hook gets the
    names its method takes).

    A step a hook does not fire at costs one ``step % frequency`` per hook (BaseHook's own
    ``should_trigger``, inlined); no context is filtered and nothing is allocated for it.
    """
    if point not in _POINT_SET:
        raise ValueError(f"unknown hook point {point!r}; allowed: {', '.join(POINTS)}")
    global _training, _cleaned, step_opened, step_opened_ns
    if _claimed is not None and source != _claimed:
        return
    key = _COUNTED.get(point)
    if point == "before_step":
        step_opened, step_opened_ns = ctx.get("step"), time.perf_counter_ns()
    elif key is None:
        if point == "before_training":
            _training = True
        elif point == "after_training":
            _training = False
        elif point == "cleanup":  # once per process, whoever emits it (an integration, exit)
            if _cleaned:
                return
            _cleaned = True
    if not _hooks:
        return
    at = None if key is None else ctx.get(key)
    local = state.local
    for hook in tuple(_hooks):
        # one class lookup (_kind), and the instance's own dict for what it sets itself
        own, plain = _kinds.get(type(hook)) or _kind(type(hook))
        d = getattr(hook, "__dict__", _NO_DICT)
        idle = d.get("idle_points")
        if ((point not in own and point not in d) or getattr(hook, "off", False)
                or (idle and point in idle)):  # fmt: skip
            continue
        if at is not None:
            try:
                if plain and "should_trigger" not in d:
                    if at % hook.frequency:  # BaseHook.should_trigger, without the call
                        continue
                elif not hook.should_trigger(at):
                    continue
            except Exception as exc:  # noqa: BLE001 - a hook never breaks the program
                _failed(hook, "should_trigger", exc)
                continue
        names: Any = _params.get((type(hook), point), _UNSEEN)
        if names is _UNSEEN:
            names = _accepted(hook, point)
        # the context as it is when the method takes every name in it (no copy)
        kw = ctx if names is None or names.issuperset(ctx) else {
            k: v for k, v in ctx.items() if k in names}  # fmt: skip
        saved = local.depth
        local.depth = state.INTERNAL  # the hook's own NumPy/torch calls are not recorded
        try:
            getattr(hook, point)(**kw)
        except Exception as exc:  # noqa: BLE001 - a hook never breaks the program
            _failed(hook, point, exc)
        finally:
            local.depth = saved


def shutdown(**ctx: Any) -> None:
    """The end of the process (or of the probe): ``after_training`` when training is still
    open (whoever opened it: the zero-code source or the integration that claimed the
    boundaries), then ``cleanup``, which runs once per process whatever calls this again."""
    if _cleaned:
        return
    if _training:
        emit("after_training", source=_claimed, **ctx)
    emit("cleanup", source=_claimed)


def _failed(hook: Any, point: str, exc: BaseException) -> None:
    from .. import _report

    hook.failures = getattr(hook, "failures", 0) + 1
    first = hook.failures == 1
    if hook.failures >= MAX_FAILURES:
        hook.off = True
    name = getattr(hook, "name", type(hook).__name__)
    _report.internal_error(f"hook {name}.{point}", exc,
                           outcome="The program goes on; the hook is switched off after "
                           f"{MAX_FAILURES} failures.")  # fmt: skip
    if first or hook.off:  # the python.errors table: its first failure and when switched off
        try:
            from ..ext import tables

            tables._add("errors", [{"source": f"hook {name}.{point}",
                                    "event": "switched off" if hook.off else "raised",
                                    "error": type(exc).__name__, "message": str(exc)[:500],
                                    "failures": hook.failures}])  # fmt: skip
            tables._activate()
        except Exception:  # noqa: BLE001 - no table writer (no session): stderr said it
            pass


def _reset() -> None:
    """Forget every hook, service and claim (tests)."""
    global _claimed, _training, _cleaned, step_opened, step_opened_ns
    with _lock:
        _hooks.clear()
    _services.clear()
    _lazy.clear()
    _params.clear()
    _kinds.clear()
    _claimed = None
    _training = _cleaned = False
    step_opened, step_opened_ns = None, 0
