"""Which recording engine runs: the native core (pprobe/_native.c) or its pure-Python twin.

Decided once per process, when pprobe's state is first imported, from ``PPROBE_CORE``:

* ``auto`` (default): the native core where it is built and supported, else Python;
* ``native``: the same, and a failure to get it is said on stderr;
* ``python``: the pure-Python engine (pprobe/recorder.py), always.

Where ``auto`` or ``native`` falls back (no compiler at install time, an interpreter the core
does not support, a free-threaded build, a failed check), the Python engine runs and the
session prints one line saying why. ``meta.json`` records the engine and the reason
(``core``). Both engines append the same records (:mod:`pprobe.records`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import ModuleType
from typing import Any

CORES = ("auto", "native", "python")
#: The interface version this Python side expects of pprobe/_native.c (PPROBE_NATIVE_API).
API = 18

native: ModuleType | None = None
ENGINE = "python"
REASON = ""
FELL_BACK = False  # auto/native asked, Python runs: the session says so once


def _choose() -> tuple[ModuleType | None, str, bool]:
    want = os.environ.get("PPROBE_CORE", "auto").strip().lower() or "auto"
    if want == "python":
        return None, "PPROBE_CORE=python", False
    if want not in CORES:  # config.py reports the bad value; run the default meanwhile
        want = "auto"
    if sys.implementation.name != "cpython":
        return None, f"the native core needs CPython, not {sys.implementation.name}", True
    if not (3, 10) <= sys.version_info[:2] <= (3, 13):
        v = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return None, f"the native core supports CPython 3.10-3.13, not {v}", True
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None, "the native core needs the GIL (this is a free-threaded build)", True
    try:
        from . import _native
    except ImportError as e:
        return None, f"the native core is not built ({e}); reinstall with a C compiler", True
    from . import records

    if getattr(_native, "API", None) != API:
        return None, "the native core is out of date (rebuild it: pip install -e .)", True
    if _native.layout() != (records.OP_SIZE, records.DESC_SIZE):
        return None, "the native core's record layout differs from pprobe.records", True
    return _native, f"PPROBE_CORE={want}", False


native, REASON, FELL_BACK = _choose()
ENGINE = "native" if native is not None else "python"


def fall_back(reason: str) -> None:
    """The native core could not start after all: the Python engine records this process."""
    global native, ENGINE, REASON, FELL_BACK
    native, ENGINE, REASON, FELL_BACK = None, "python", reason, True


#: The interface version this Python side expects of pprobe/_dumpio.c (DUMPIO_API).
DUMPIO_API = 11
_dumpio_mod: Any = False  # not looked for yet


def dumpio() -> ModuleType | None:
    """The native dump writer and statistics (pprobe/_dumpio.c), or None: their Python twins.

    Looked for the first time dump or stats mode needs it; PPROBE_CORE=python means the twins.
    """
    global _dumpio_mod
    if _dumpio_mod is False:
        _dumpio_mod = None
        if os.environ.get("PPROBE_CORE", "auto").strip().lower() != "python":
            try:
                from . import _dumpio as mod

                if getattr(mod, "API", None) == DUMPIO_API:
                    _dumpio_mod = mod
            except ImportError:
                pass
    return _dumpio_mod  # type: ignore[no-any-return]


def facts() -> dict[str, Any]:
    """What meta.json says about the engines: the recording core, and the dump writer and
    statistics (``dumps``: native or python, once dump or stats mode has used them)."""
    out: dict[str, Any] = {"engine": ENGINE, "reason": REASON}
    if _dumpio_mod is not False:
        out["dumps"] = "native" if _dumpio_mod is not None else "python"
    return out
