"""Failures inside pprobe: reported once on stderr and kept for the run's metadata.

pprobe never raises into the user's program; every guarded path ends here instead.
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

errors: list[dict[str, Any]] = []
warnings: list[str] = []
_seen: set[tuple[str, str]] = set()
_listeners: list[Any] = []  # called after a new error (the run re-writes its metadata)


def internal_error(
    where: str,
    exc: BaseException,
    outcome: str = "The program goes on; this is recorded in the run's metadata.",
) -> None:
    """Record a failure inside pprobe; print it the first time this kind of failure happens."""
    key = (where, type(exc).__name__)
    if key in _seen:
        for e in errors:
            if (e["where"], e["type"]) == key:
                e["count"] += 1
        return
    _seen.add(key)
    errors.append(
        {
            "where": where,
            "type": type(exc).__name__,
            "message": str(exc)[:500],
            "traceback": "".join(traceback.format_exception(exc))[-4000:],
            "time": time.time(),
            "count": 1,
        }
    )
    _emit(f"pprobe: internal error in {where}: {type(exc).__name__}: {exc}. {outcome}")
    for fn in list(_listeners):
        try:
            fn()
        except Exception:
            pass


def warn_once(key: str, message: str) -> None:
    if ("warn", key) in _seen:
        return
    _seen.add(("warn", key))
    warnings.append(message)
    _emit("pprobe: " + message)


def _emit(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def reset() -> None:
    errors.clear()
    warnings.clear()
    _seen.clear()
