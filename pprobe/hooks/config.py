"""Hooks from the configuration: ``[[hooks]]`` tables, a YAML ``hooks:`` list, hook modules.

:func:`install` runs at session start when ``hooks`` or ``hook_modules`` is set (only then is
``pprobe.hooks`` imported). Hook types come from :class:`~pprobe.hooks.HookRegistry`: the
built-in ones, the modules named in ``hook_modules`` and plugins (``PPROBE_PLUGINS``, loaded
before this runs) that register classes. A wrong module, type name or parameter is one line on
stderr naming it and the allowed values; that hook is left out and the program runs.
``PPROBE_STRICT=1`` (``strict = true``) makes it fatal instead (:class:`HookConfigError`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from .. import _report
from ..config import ConfigError
from .base import BaseHook, HookRegistry

#: Modules whose import registers pprobe's own hook types (the monitors), when present.
BUILTIN_MODULES = ("pprobe.hooks.builtin",)


class HookConfigError(ConfigError):
    """A ``[[hooks]]`` entry or hook module pprobe cannot use (fatal with PPROBE_STRICT)."""


def _builtin() -> None:
    for name in BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


def _import_user(name: str) -> Any:
    """Import a module of the program's. At start-up (sitecustomize) sys.path does not hold
    the script's folder yet: it and the working folder are searched too, for this import."""
    if name in sys.modules:
        return sys.modules[name]
    extra = [os.getcwd()]
    if sys.argv and sys.argv[0] and sys.argv[0] not in ("-c", "-m"):
        extra.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    added = [p for p in extra if p not in sys.path]
    sys.path[:0] = added
    try:
        return importlib.import_module(name)
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def _params_of(cls: type) -> list[str]:
    """The parameters a hook class takes (its ``__init__``'s, BaseHook's included)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            sig = inspect.signature(init)
        except (TypeError, ValueError):
            continue
        for p in list(sig.parameters.values())[1:]:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names:
                names.append(p.name)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            break
    return names


def build(entries: Any, modules: Any = (), strict: bool = False) -> list[BaseHook]:
    """Hook objects for ``entries`` (dicts with ``type``); errors reported (or raised)."""
    out: list[BaseHook] = []

    def fail(msg: str) -> None:
        if strict:
            raise HookConfigError(msg)
        _report._emit(f"pprobe: {msg}; this hook is left out, the program runs.")
        _report.warnings.append(msg)

    try:
        _builtin()
    except Exception as e:  # noqa: BLE001
        _report.internal_error("loading the built-in hooks", e)
    for mod in modules:
        try:
            _import_user(mod)
        except Exception as e:  # noqa: BLE001 - the user's module: report, go on
            fail(f"hook_modules: {mod!r} cannot be imported ({type(e).__name__}: {e})")
    for i, entry in enumerate(entries):
        params = dict(entry)
        type_name = params.pop("type", None)
        where = f"[[hooks]] entry {i + 1}"
        try:
            cls = HookRegistry.get(str(type_name))
        except KeyError:
            allowed = ", ".join(HookRegistry.names()) or "(none registered)"
            fail(f"{where}: unknown hook type {type_name!r}; allowed: {allowed}")
            continue
        accepted = _params_of(cls)
        bad = [k for k in params if k not in accepted]
        if bad:
            fail(
                f"{where} ({type_name}): unknown parameter {bad[0]!r}; allowed: "
                + ", ".join(accepted)
            )
            continue
        try:
            hook = cls(**params)
        except Exception as e:  # noqa: BLE001 - a bad value: the class says why
            fail(f"{where} ({type_name}): {type(e).__name__}: {e}")
            continue
        out.append(hook)
    return out


def install(cfg: Any) -> list[BaseHook]:
    """Build the configured hooks and make them live (session start)."""
    from . import dispatch, lifecycle

    hooks = build(cfg.hooks, cfg.hook_modules, strict=cfg.strict)
    lifecycle.activate()
    for h in hooks:
        dispatch.add(h)
    return hooks
