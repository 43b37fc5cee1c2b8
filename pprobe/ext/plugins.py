"""Plugins: a ``Plugin`` subclass bundles tables, metrics, hooks and settings under one name.

Where they come from (docs/extending.md): ``PPROBE_PLUGINS`` / ``plugins = [...]`` in the
config files (comma-separated names at start-up), ``pprobe.load_plugin(name)``. A name is
an entry point of the group ``pprobe.plugins`` when one has that name, else a module path
(``pkg.mod`` or ``pkg.mod:Class``) whose module defines the plugin class; ``*`` loads every
entry point of the group. A plugin that fails to import or raises in ``on_load`` is reported
in one line naming it (and a python.errors row); what it registered is undone and the others
load. ``unload_plugin`` calls ``on_unload`` and undoes what it registered.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

from .. import _report
from . import hooks, tables

GROUP = "pprobe.plugins"
#: name -> the loaded plugin instance
loaded: dict[str, Plugin] = {}


class PluginError(Exception):
    """A plugin could not be found, imported or loaded (the message is one line)."""


class Plugin:
    """Subclass it, set ``name``, and register in :meth:`on_load` through the helpers: what
    they register is owned by the plugin and undone by ``unload_plugin``."""

    name: str = ""

    def on_load(self) -> None:
        """Called once when the plugin loads."""

    def on_unload(self) -> None:
        """Called when the plugin is unloaded, before its registrations are removed."""

    # helpers: the module-level API with this plugin as the owner
    def register_table(self, name: str, data: Any) -> None:
        tables.register_table(name, data, owner=self.name)

    def table(self, name: str | None = None) -> Callable[[Callable[[], Any]], Any]:
        def deco(fn: Callable[[], Any]) -> Any:
            self.register_table(name or fn.__name__, fn)
            return fn

        return deco

    def metric(self, name: str, fn: Callable[[], Any] | None = None) -> Any:
        if fn is None:
            return lambda f: self.metric(name, f)
        tables.register_metric(name, fn, owner=self.name)
        return fn

    def register_hook(self, target: Any, method: str = "forward", fn: Any = None) -> Any:
        return hooks.register_hook(target, method, fn, owner=self.name)

    hook = register_hook

    def hook_function(self, path: str, fn: Any = None) -> Any:
        return hooks.hook_function(path, fn, owner=self.name)

    def record(self, table: str, row: Any) -> None:
        tables.record(table, row)

    def register_setting(self, name: str, default: Any = None, type: Any = None,
                         help: str = "") -> Any:  # fmt: skip
        from . import settings

        return settings.register(name, default, type, help, owner=self.name)


# ---------------------------------------------------------------------- finding plugins
def entry_points() -> dict[str, Any]:
    """Entry points of the group ``pprobe.plugins``, by name."""
    from importlib.metadata import entry_points as eps

    return {ep.name: ep for ep in eps(group=GROUP)}


def _find(name: str) -> type[Plugin] | Plugin:
    eps = entry_points()
    if name in eps:
        obj = eps[name].load()
        if isinstance(obj, type) and issubclass(obj, Plugin) or isinstance(obj, Plugin):
            return obj
        if hasattr(obj, "__dict__"):
            return _in_module(obj, name)
        raise PluginError(f"entry point {name!r} is a {type(obj).__name__}, not a Plugin")
    mod_name, _, attr = name.partition(":")
    mod = importlib.import_module(mod_name)
    if attr:
        obj = getattr(mod, attr, None)
        if obj is None:
            raise PluginError(f"module {mod_name!r} has no {attr!r}")
        return obj  # type: ignore[no-any-return]
    return _in_module(mod, name)


def _in_module(mod: Any, name: str) -> type[Plugin]:
    found = [
        v for v in vars(mod).values()
        if isinstance(v, type) and issubclass(v, Plugin) and v is not Plugin
        and v.__module__ == mod.__name__
    ]  # fmt: skip
    if len(found) != 1:
        raise PluginError(
            f"module {mod.__name__!r} defines {len(found)} Plugin subclasses; allowed: one, or "
            f"name it: {name}:ClassName"
        )
    return found[0]


# ---------------------------------------------------------------------- load / unload
def load_plugin(plugin: Any) -> Plugin:
    """Load a plugin: a name (entry point or module path), a Plugin subclass or instance.
    Raises :class:`PluginError` (one line naming it) when it cannot be loaded."""
    label = plugin if isinstance(plugin, str) else getattr(plugin, "name", None) or repr(plugin)
    try:
        obj = _find(plugin) if isinstance(plugin, str) else plugin
        inst = obj() if isinstance(obj, type) else obj
        if not isinstance(inst, Plugin):
            raise PluginError(f"{type(inst).__name__} is not a pprobe.Plugin subclass")
    except PluginError as e:
        raise PluginError(f"plugin {label!r} cannot be loaded: {e}") from None
    except Exception as e:
        raise PluginError(f"plugin {label!r} cannot be loaded: {type(e).__name__}: {e}") from None
    if not inst.name:
        inst.name = label if isinstance(plugin, str) else type(inst).__name__
    if inst.name in loaded:
        return loaded[inst.name]
    inst._pprobe_spec = label  # type: ignore[attr-defined]  # what was asked for
    loaded[inst.name] = inst
    try:
        inst.on_load()
    except Exception as e:
        _undo(inst.name)
        del loaded[inst.name]
        raise PluginError(
            f"plugin {inst.name!r} raised in on_load: {type(e).__name__}: {e}; what it "
            "registered is undone"
        ) from None
    _note_loaded()
    return inst


def unload_plugin(name: Any) -> bool:
    """Call the plugin's ``on_unload`` and remove what it registered. False if not loaded."""
    key = name if isinstance(name, str) else getattr(name, "name", None)
    inst = loaded.pop(key, None) if isinstance(key, str) else None
    if inst is None:
        return False
    try:
        inst.on_unload()
    except Exception as e:
        _report._emit(f"pprobe: plugin {inst.name!r} raised in on_unload: {type(e).__name__}: "
                      f"{e}; its registrations are removed anyway")  # fmt: skip
    _undo(inst.name)
    _note_loaded()
    return True


def _undo(owner: str) -> None:
    with tables._lock:
        for key, src in list(tables.sources.items()):
            if src.owner == owner:
                del tables.sources[key]
        for k, v in list(tables.static.items()):
            if v[1] == owner:
                del tables.static[k]
        tables._sources_changed()
    hooks.remove_owned(owner)
    st = sys.modules.get("pprobe.ext.settings")
    if st is not None:
        st.unregister_owned(owner)


def load_configured(names: Iterable[str]) -> list[str]:
    """Start-up: load each name (``*``: every entry point); a failure is one line on stderr
    and a python.errors row, and the others still load. Returns the names loaded."""
    todo: list[str] = []
    for n in names:
        if n == "*":
            try:
                todo.extend(sorted(entry_points()))
            except Exception as e:
                _report._emit(f"pprobe: the {GROUP} entry points cannot be read: {e}")
        else:
            todo.append(n)
    done = []
    for n in dict.fromkeys(todo):
        try:
            done.append(load_plugin(n).name)
        except PluginError as e:
            _report._emit(f"pprobe: {e}. The program and the other plugins go on.")
            tables._add("errors", [{"source": f"plugin {n!r}", "event": "not loaded",
                                    "error": "PluginError", "message": str(e)[:500],
                                    "failures": 1}])  # fmt: skip
            tables._activate()
    return done


def _note_loaded() -> None:
    """meta.json's ``plugins``: what this process has loaded (``pprobe plugins`` reads it)."""
    s = tables._session()
    if s is None:
        return
    s.run.extra["plugins"] = [
        {
            "name": p.name,
            "class": f"{type(p).__module__}.{type(p).__qualname__}",
            "spec": getattr(p, "_pprobe_spec", p.name),
        }  # fmt: skip
        for p in loaded.values()
    ]
    s.write_meta()
