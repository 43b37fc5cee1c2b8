"""Settings that extensions register: ``config.register`` / ``config.get`` / ``config.set``.

A registered name is dotted, ``my_plugin.sample_rate``. Its value comes from, lowest to
highest (the precedence of pprobe's own settings): the default < ``[tool.pprobe.my_plugin]``
of ./pyproject.toml < ``[my_plugin]`` of ./pprobe.toml (or PPROBE_CONFIG's file) < the
environment variable ``PPROBE_MY_PLUGIN__SAMPLE_RATE`` (``PPROBE_`` + the name upper-cased,
each dot as ``__``) < ``config.set``. A bad value raises :class:`pprobe.config.ConfigError`
naming where it came from, as pprobe's own settings do.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import config as cfg
from ..config import ConfigError

_NAME = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+\Z")
_lock = threading.RLock()


@dataclass
class Registered:
    name: str
    default: Any
    type_name: str
    parse: Callable[[str, Any], Any]
    help: str
    value: Any = None
    source: str = "default"
    owner: str | None = None


registry: dict[str, Registered] = {}


def env_name(name: str) -> str:
    """``my_plugin.sample_rate`` -> ``PPROBE_MY_PLUGIN__SAMPLE_RATE``."""
    return "PPROBE_" + name.upper().replace(".", "__")


def _float(name: str, v: Any) -> float:
    try:
        if isinstance(v, bool):
            raise ValueError
        return float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={v!r} is not valid; allowed: a number") from None


def _int(name: str, v: Any) -> int:
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        return int(str(v).strip()) if not isinstance(v, (int, float)) else int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={v!r} is not valid; allowed: an integer") from None


def _str(name: str, v: Any) -> str:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ConfigError(f"{name}={v!r} is not valid; allowed: a string")
    return str(v)


_PARSERS: dict[Any, tuple[str, Callable[[str, Any], Any]]] = {
    float: ("float", _float),
    int: ("int", _int),
    bool: ("bool", cfg._bool),
    str: ("str", _str),
    list: ("list", cfg._list),
}


def _parser(type_: Any, default: Any) -> tuple[str, Callable[[str, Any], Any]]:
    if type_ is None:
        type_ = type(default) if default is not None else str
    if type_ in _PARSERS:
        return _PARSERS[type_]
    if callable(type_) and not isinstance(type_, type):  # parse(name, value), ConfigError
        return getattr(type_, "__name__", "custom"), type_
    raise ConfigError(f"config.register: type {type_!r} is not valid; allowed: "
                      "float, int, bool, str, list or a parse(name, value) function")  # fmt: skip


def _file_value(name: str) -> tuple[Any, str] | None:
    """The setting's value in the config files (later files win), or None."""
    ns, _, key = name.rpartition(".")
    found = None
    for path, is_pyproject in cfg._candidates(None, os.environ):
        table: Any = cfg._table(path, is_pyproject)
        for part in ns.split("."):
            table = table.get(part) if isinstance(table, dict) else None
        if isinstance(table, dict) and key in table:
            found = (table[key], path)
    return found


def register(name: str, default: Any = None, type: Any = None, help: str = "",
             owner: str | None = None) -> Any:  # fmt: skip
    """Declare a setting; returns its value (files and environment read now)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"config.register: name {name!r} is not valid; allowed: dotted lower-case names "
            "such as my_plugin.sample_rate"
        )
    if name.split(".")[0] in cfg.BY_FIELD:
        raise ConfigError(f"config.register: {name!r} is inside pprobe's own setting "
                          f"{name.split('.')[0]!r}; allowed: another first part")  # fmt: skip
    type_name, parse = _parser(type, default)
    r = Registered(name, default, type_name, parse, help, owner=owner)
    value, source = default, "default"
    got = _file_value(name)
    if got is not None:
        value, source = parse(f"{name} (from {got[1]})", got[0]), got[1]
    env = env_name(name)
    if env in os.environ:
        value, source = parse(env, os.environ[env]), "env " + env
    r.value, r.source = value, source
    with _lock:
        old = registry.get(name)
        if old is not None and old.source == "api":  # a set() before a re-register stays
            r.value, r.source = old.value, old.source
        registry[name] = r
    _persist()
    return r.value


def get(name: str) -> Any:
    with _lock:
        r = registry.get(name)
    if r is not None:
        return r.value
    if name in cfg.BY_FIELD:
        return getattr(_own_config(), name)
    raise ConfigError(f"unknown setting {name!r}; allowed: {', '.join(sorted(all_names()))}")


def set(name: str, value: Any) -> Any:  # noqa: A001 - the API's name
    with _lock:
        r = registry.get(name)
        if r is None:
            if name in cfg.BY_FIELD:
                raise ConfigError(
                    f"{name} is pprobe's own setting, fixed while a run records; allowed: "
                    f"pprobe.enable({name}=...), {cfg.BY_FIELD[name].env} or a config file"
                )
            raise ConfigError(
                f"unknown setting {name!r}; allowed: {', '.join(sorted(all_names()))} "
                "(config.register declares a new one)"
            )
        r.value, r.source = r.parse(f"{name} (from config.set)", value), "api"
    _persist()
    return r.value


def unregister_owned(owner: str) -> int:
    with _lock:
        mine = [k for k, r in registry.items() if r.owner == owner]
        for k in mine:
            del registry[k]
    return len(mine)


def all_names() -> list[str]:
    return sorted(list(cfg.BY_FIELD) + list(registry))


def _own_config() -> cfg.Config:
    import sys

    mod = sys.modules.get("pprobe.session")
    s = mod.Session.active if mod is not None else None
    if s is not None:
        return s.config  # type: ignore[no-any-return]
    try:
        return cfg.load()
    except ConfigError:
        return cfg.Config()


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (tuple, list)):
        return ",".join("-".join(map(str, x)) if isinstance(x, (tuple, list)) else str(x)
                        for x in v)  # fmt: skip
    return str(v)


def own_rows(conf: dict[str, Any], sources: dict[str, str]) -> list[dict[str, Any]]:
    """Rows of pprobe's own settings from a resolved config (as meta.json's ``config``)."""
    out = []
    for s in cfg.SETTINGS:
        out.append({
            "name": s.field,
            "value": _text(conf.get(s.field, s.default)),
            "default": _text(s.default),
            "type": type(s.default).__name__,
            "source": sources.get(s.field, "default"),
            "description": s.help,
            "env": s.env,
        })  # fmt: skip
    return out


def registered_rows() -> list[dict[str, Any]]:
    with _lock:
        regs = list(registry.values())
    return [
        {"name": r.name, "value": _text(r.value), "default": _text(r.default),
         "type": r.type_name, "source": r.source, "description": r.help,
         "env": env_name(r.name)}
        for r in regs
    ]  # fmt: skip


def rows() -> list[dict[str, Any]]:
    """Every setting of this process, pprobe's own first."""
    c = _own_config()
    return own_rows(c.to_json(), dict(c.sources)) + registered_rows()


def _persist() -> None:
    """The registered settings, as the run's ``settings`` snapshot (queried after the run)."""
    from . import tables

    tables.write_settings(registered_rows())
