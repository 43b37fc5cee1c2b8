"""``BaseHook`` (what a user subclasses) and ``HookRegistry`` (hook classes by type name)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

#: pprobe.hooks.dispatch once loaded (it imports this module): ``from . import dispatch``
#: in a method runs importlib's Python ``_handle_fromlist`` at every call
_dispatch: Any = None


def _services() -> Any:
    global _dispatch
    if _dispatch is None:
        from . import dispatch

        _dispatch = dispatch
    return _dispatch


class BaseHook:
    """A training lifecycle hook: override the points you need; every one is a no-op here.

    ``frequency``: the step-based points (``before_step`` / ``after_step``) fire every
    ``frequency`` steps, the epoch-based ones every ``frequency`` epochs; override
    :meth:`should_trigger` for another rule. ``name`` is how errors and tables name the hook.
    """

    #: Type name used by ``[[hooks]]`` entries (set by :meth:`HookRegistry.register`).
    type_name: str = ""

    def __init__(self, name: str | None = None, frequency: int = 1, **params: Any) -> None:
        if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
            raise ValueError(f"frequency must be an integer >= 1, got {frequency!r}")
        self.name = name or self.type_name or type(self).__name__
        self.frequency = frequency
        if params:
            bad = ", ".join(sorted(params))
            raise TypeError(f"{type(self).__name__} has no parameter {bad}")
        # failures / off: the isolation counters dispatch keeps (switched off after repeats)
        self.failures = 0
        self.off = False
        #: Points this hook has nothing to do at for now (a set of point names, or None):
        #: they are not called, and zero-code detection builds no context for them. The hook
        #: keeps it up to date itself (GradientFlowHook skips an ``after_step`` whose
        #: gradients its optimizer pre-hook has already taken).
        self.idle_points: frozenset[str] | None = None

    # -- when ---------------------------------------------------------------------------
    def should_trigger(self, step: int) -> bool:
        """Whether a step- or epoch-based point fires at ``step`` (an epoch for epoch points)."""
        return step % self.frequency == 0

    # -- services -----------------------------------------------------------------------
    def get_service(self, name: str) -> Any:
        """The service ``name`` (model, optimizer, logger, experiment_dir, ...) or None."""
        return (_dispatch or _services()).get_service(name)

    def register_service(self, name: str, obj: Any) -> None:
        (_dispatch or _services()).register_service(name, obj)

    # -- points (all optional) ----------------------------------------------------------
    def before_training(self, model: Any = None) -> None: ...

    def before_epoch(self, epoch: int, model: Any = None) -> None: ...

    def before_step(self, step: int, model: Any = None) -> None: ...

    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None: ...

    def after_epoch(self, epoch: int, model: Any = None, metrics: Any = None) -> None: ...

    def after_training(self, model: Any = None, metrics: Any = None) -> None: ...

    def cleanup(self) -> None: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} frequency={self.frequency}>"


class HookRegistry:
    """Hook classes by type name: ``@HookRegistry.register("MyHook")``."""

    _types: dict[str, type] = {}

    @classmethod
    def register(cls, name: str | None = None) -> Callable[[T], T]:
        def deco(klass: T) -> T:
            key = name or klass.__name__
            if not isinstance(key, str) or not key:
                raise ValueError(f"hook type name must be a non-empty string, got {key!r}")
            klass.type_name = key  # type: ignore[attr-defined]
            cls._types[key] = klass
            return klass

        return deco

    @classmethod
    def get(cls, name: str) -> type:
        try:
            return cls._types[name]
        except KeyError:
            allowed = ", ".join(sorted(cls._types)) or "(none registered)"
            raise KeyError(f"unknown hook type {name!r}; allowed: {allowed}") from None

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._types)

    @classmethod
    def create(cls, type_name: str, **params: Any) -> BaseHook:
        return cls.get(type_name)(**params)  # type: ignore[no-any-return]
