"""Training lifecycle hooks: ``BaseHook``, ``HookRegistry`` and the points they fire at.

A hook is an object with any of the methods named in :data:`POINTS`. ``add(hook)`` (or a
``[[hooks]]`` entry in pprobe.toml) makes it live; :func:`emit` calls it at each boundary, from
zero-code detection (optimizer steps, the training DataLoader) or from a framework integration
that ``claim()``\\ s the boundaries (Lightning, transformers, Accelerate).

Nothing here is imported into the probed program unless hooks are configured or the user
imports it.
"""

from __future__ import annotations

from . import builtin as _builtin  # noqa: F401  (registers the built-in hook types)
from .base import BaseHook, HookRegistry
from .dispatch import (
    POINTS,
    add,
    claim,
    claimed_by,
    emit,
    get_service,
    hooks,
    register_service,
    remove,
)

__all__ = [
    "POINTS",
    "BaseHook",
    "HookRegistry",
    "add",
    "claim",
    "claimed_by",
    "emit",
    "get_service",
    "hooks",
    "register_service",
    "remove",
]
