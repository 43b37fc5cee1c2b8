"""The one guarded, idempotent start-up every entry point calls.

Callers: bootstrap/sitecustomize.py and bootstrap/usercustomize.py (``PYTHONPATH=bootstrap``
or ``pprobe run``), the ``.pth`` line of ``pprobe install --site``, and ``import pprobe.auto``.
It runs once per process whoever calls it first, imports neither numpy nor torch, and never
lets an exception out: a bad setting prints one clear line and the program runs unprobed
(PPROBE_STRICT=1 makes that fatal: exit status 2).
"""

from __future__ import annotations

import os
import sys
from typing import Any

_done = False
#: Programs never probed: package managers and pprobe's own command line.
EXCLUDED_PROGRAMS = frozenset(
    {"pip", "pip3", "pprobe", "ensurepip", "uv", "virtualenv", "venv", "pipx"}
)


def initialize(source: str = "api") -> bool:
    """Start probing this process if the settings ask for it. Returns whether it started.

    ``source`` is "bootstrap", "pth" or "api": a bootstrap on PYTHONPATH (or pprobe.auto)
    means the user asked for the probe, so it is on unless PPROBE=0 or a config file says
    ``enabled = false``; a site-wide .pth stays dormant unless PPROBE=1 or a config file says
    ``enabled = true``.
    """
    global _done
    if _done:
        return False
    _done = True
    try:
        return _initialize(source)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - start-up must never break the program
        from . import _report

        # No run holds it when start-up failed before the session started.
        session = sys.modules.get("pprobe.session")
        started = session is not None and session.Session.active is not None
        outcome = (
            "The program goes on; this is recorded in the run's metadata."
            if started
            else "The program runs without pprobe."
        )
        _report.internal_error("start-up", e, outcome)
        return False


def killed() -> bool:
    """``PPROBE=0`` (false, no, off): the kill switch, which wins over everything, enable()
    included."""
    flag = os.environ.get("PPROBE")
    return flag is not None and flag.strip().lower() in ("0", "false", "no", "off")


def _initialize(source: str) -> bool:
    if killed():
        return False
    if excluded_program():
        return False
    from . import config as cfgmod

    try:
        defaults = {} if source == "pth" else {"enabled": True}
        cfg = _load(cfgmod, defaults)
    except cfgmod.ConfigError as e:
        strict = cfgmod.strict_requested()
        if strict:
            sys.stderr.write(f"pprobe: configuration error: {e}. {strict}: stopping.\n")
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            # Not SystemExit: raised while ``site`` imports sitecustomize it becomes "Fatal
            # Python error: init_import_site" with a traceback and exit status 1.
            os._exit(2)
        sys.stderr.write(
            f"pprobe: configuration error: {e}. The program runs without pprobe "
            "(PPROBE_STRICT=1 or strict = true makes this fatal).\n"
        )
        return False
    if not cfg.enabled:
        return False
    missing = missing_dependencies()
    if missing:
        skip(f"{', '.join(missing)} cannot be imported by {sys.executable} (pprobe needs them)")
        return False
    from .session import Session

    try:
        Session.start(cfg)
    except cfgmod.ConfigError as e:  # a [[hooks]] entry under PPROBE_STRICT (pprobe.hooks.config)
        why = cfgmod.strict_requested() or "strict"
        sys.stderr.write(f"pprobe: configuration error: {e}. {why}: stopping.\n")
        sys.stderr.flush()
        os._exit(2)
    except OSError as e:  # the run folder cannot be made: say so in one line, run unprobed
        sys.stderr.write(
            f"pprobe: cannot write the run folder under {os.path.abspath(cfg.output)!r} "
            f"(PPROBE_OUTPUT): {e.strerror or e}. The program runs without pprobe.\n"
        )
        return False
    return True


#: What a session needs as soon as it starts (numpy, torch: only if the program imports them).
REQUIRED = ("wrapt", "pyarrow")


def missing_dependencies() -> list[str]:
    import importlib.util

    missing = []
    for name in REQUIRED:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def skip(reason: str) -> None:
    """This process cannot run pprobe. A child of a probed run (PPROBE_RESOLVED) starts
    silently unprobed and leaves ``skipped/{host}-{pid}.json`` in the run folder (the run's
    meta.json lists them); any other process says so in one line. bootstrap/_pprobe_boot.py
    writes the same record on Pythons that cannot import pprobe."""
    import json

    resolved = os.environ.get("PPROBE_RESOLVED")
    if not resolved:
        sys.stderr.write(f"pprobe: {reason}; the program runs without pprobe.\n")
        return
    try:
        import socket
        import time

        from . import safefs

        host = socket.gethostname()
        run = safefs.RunDir.open(json.loads(resolved)["run_dir"])
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "host": host,
            "executable": sys.executable,
            "python": sys.version.split()[0],
            "argv": list(getattr(sys, "argv", None) or []),
            "time": time.time(),
            "reason": reason,
        }
        # never through a symlink: the run folder's descriptor, O_EXCL|O_NOFOLLOW, then rename
        folder = run.subdir("skipped")
        try:
            data = json.dumps(record, indent=2).encode()
            folder.replace_atomic(f"{host}-{os.getpid()}.json", data)
        finally:
            folder.close()
            run.close()
    except Exception:  # silent: a child never prints pprobe's troubles
        pass


def _load(cfgmod: Any, defaults: dict[str, Any]) -> Any:
    import json

    inherited = os.environ.get("PPROBE_RESOLVED")
    if inherited:  # a child process: take the parent's resolved settings, no re-guess
        return cfgmod.Config.from_json(json.loads(inherited)["config"])
    cfg = cfgmod.load()
    if "enabled" not in cfg.sources and defaults.get("enabled"):
        import dataclasses

        cfg = dataclasses.replace(cfg, enabled=True)
    return cfg


def excluded_program() -> bool:
    """pip, pprobe's own CLI and friends are never probed (by script name or ``-m``)."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if not argv:
        return False

    def stem(p: str) -> str:
        return os.path.basename(p).lower().split(".")[0]

    if stem(argv[0]) in EXCLUDED_PROGRAMS:
        return True
    args = iter(argv[1:])
    for a in args:
        if a in ("-W", "-X", "-Q"):
            next(args, None)
        elif a == "-m":
            return stem(next(args, "")) in EXCLUDED_PROGRAMS
        elif a.startswith("-m"):
            return stem(a[2:]) in EXCLUDED_PROGRAMS
        elif a == "-c" or a == "-":
            return False
        elif not a.startswith("-"):
            return stem(a) in EXCLUDED_PROGRAMS
    return False
