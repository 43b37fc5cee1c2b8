"""pprobe: see every NumPy and PyTorch operation a program runs, without changing it.

Zero-code use: ``PYTHONPATH=bootstrap python train.py`` or ``pprobe run -- python train.py``.
In code: ``pprobe.enable(mode="stats")`` ... ``pprobe.disable()``, or ``with pprobe.probe():``.

This module stays light: it is imported at interpreter start-up by the bootstrap, so it imports
neither numpy, torch, pyarrow nor duckdb.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "enable",
    "disable",
    "probe",
    "step",
    "epoch",
    "load",
    "show",
    "summary",
    "active_run_dir",
    "nan_origins",
    "__version__",
    "table",
    "register_table",
    "metric",
    "record",
    "record_custom_data",
    "register_hook",
    "hook_function",
    "Plugin",
    "load_plugin",
    "unload_plugin",
    "sql",
    "config",
]

#: The extension API (docs/extending.md), loaded on first use: ``import pprobe`` at start-up
#: must not import it (module ``__getattr__``, PEP 562).
_LAZY = {
    "table": "pprobe.ext.tables",
    "register_table": "pprobe.ext.tables",
    "metric": "pprobe.ext.tables",
    "record": "pprobe.ext.tables",
    "record_custom_data": "pprobe.ext.tables",
    "register_hook": "pprobe.ext.hooks",
    "hook_function": "pprobe.ext.hooks",
    "Plugin": "pprobe.ext.plugins",
    "load_plugin": "pprobe.ext.plugins",
    "unload_plugin": "pprobe.ext.plugins",
    "sql": "pprobe.ext.live",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        if name == "config":
            import importlib

            return importlib.import_module("pprobe.config")
        raise AttributeError(f"module 'pprobe' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def enable(**settings: Any) -> str | None:
    """Start probing this process (settings as in the README table, e.g. ``mode="stats"``).

    Explicit arguments win over environment variables and config files. Returns the run folder,
    or None when ``PPROBE=0`` (the kill switch wins over this call too: nothing is started).
    Raises :class:`pprobe.config.ConfigError` for a bad setting (nothing is started then).
    """
    from . import _startup, config

    _startup._done = True  # a later bootstrap call must not start a second session
    if _startup.killed():
        return None
    from .session import Session

    cfg = config.load(overrides={"enabled": True, **settings})
    return Session.start(cfg).run.dir


def disable() -> None:
    """Stop probing: restore every patched object, flush the log, finish the run's metadata."""
    from .session import Session

    if Session.active is not None:
        Session.active.stop()


class probe:
    """``with pprobe.probe(mode="log") as run_dir:`` probes the block only (run_dir is None
    when ``PPROBE=0``)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def __enter__(self) -> str | None:
        return enable(**self.settings)

    def __exit__(self, *exc: object) -> None:
        disable()


def step(n: int | None = None) -> int:
    """Advance the training step (or set it to ``n``); rows carry the step they ran in."""
    from . import recorder, state

    # The program counts its steps: optimizer hooks (torch) stop counting, and what they
    # counted before this first call is dropped.
    first = not state.manual_step
    state.manual_step = True
    recorder.set_step(((0 if first else state.step) + 1) if n is None else int(n))
    return state.step


def epoch(n: int | None = None) -> int:
    """Start the next training epoch (or epoch ``n``); lifecycle hooks see ``after_epoch`` of
    the open one and ``before_epoch`` of this one. DataLoader epochs stop being counted."""
    import sys

    lc = sys.modules.get("pprobe.hooks.lifecycle")
    if lc is None or not lc._active:
        global _epoch
        _epoch = (_epoch + 1 if _epoch is not None else 0) if n is None else int(n)
        return _epoch
    nxt = (lc.epoch + 1 if lc.epochs_started else 0) if n is None else int(n)
    lc.set_epoch(nxt)
    return nxt


_epoch: int | None = None  # pprobe.epoch() without hooks: only counted


def load(
    what: Any,
    run: str | None = None,
    torch: bool | None = None,
    *,
    role: str = "output",
    idx: str | int | None = None,
    pid: int | None = None,
) -> Any:
    """Load a dump written by pprobe as the array it was (see docs/output.md).

    ``what``: the dump's path; a ``tensors`` row (a dict, named tuple or pandas Series with
    ``dump_path``); or a call's seq (``17``) or dump prefix (``"4242-17"``), whose first output
    is loaded (``role="input", idx=1`` picks another array). ``run``: the run folder (default:
    the latest run), for rows, seqs and prefixes.
    """
    if isinstance(run, bool):  # load(path, True): the former signature load(path, torch)
        run, torch = None, run
    if not isinstance(what, str) or not (
        what.endswith(".npy") or ".npy." in what or "/" in what or _isfile(what)
    ):
        from . import callview as _show

        return _show.load(what, run, role=role, idx=idx, pid=pid, torch=torch)
    return _load_file(what, torch)


def show(key: Any, run: str | None = None, pid: int | None = None, values: bool = False) -> Any:
    """One recorded call (seq, dump prefix ``"4242-17"`` or dump file name) of a run (default:
    the latest): its row, caller, source line and arrays. Prints as text; Jupyter shows an HTML
    table. ``.load(role, idx)`` loads one of its dumps."""
    from . import callview as _show

    return _show.show(key, run, pid, values)


def summary(run: str | None = None, top: int = 10) -> Any:
    """What ``pprobe summary`` shows about a run (default: this process's run while the
    probe is on, after flushing it; else the latest): prints as text, Jupyter shows HTML
    tables, ``.data`` is the plain data (``--format json``)."""
    from . import runsummary as _summary
    from .textout import Shown

    if run is None:
        run = _flushed_run_dir()
    data = _summary.summarize(run, top)
    return Shown(_summary.render(data), data)


def _flushed_run_dir() -> str | None:
    """This process's run folder, its buffered rows written first; None when the probe is
    off."""
    from .session import Session

    s = Session.active
    if s is None:
        return None
    try:
        s.writer.flush()
    except Exception:
        pass
    return s.run.dir


def _isfile(path: str) -> bool:
    import os

    return os.path.isfile(path)


def _load_file(path: str, torch: bool | None = None) -> Any:
    """A dump file as the array it was: see :func:`load`.

    A dump of a dtype NumPy lacks (``op_..._{pid}-{seq}.bfloat16.npy``: raw bits, the true
    dtype in the name) comes back as the identical torch tensor. ``torch=True`` returns a
    torch tensor for any dump, ``torch=False`` the NumPy array as stored.
    """
    import os

    from .codecs import load as _load_dump  # a .npy file, or another codec's (its header says)

    arr = _load_dump(path)
    stem = os.path.basename(path)
    if ".npy." in stem:  # op_..._{pid}-{seq}.npy.zstd: stored with a codec (docs/codecs.md)
        stem = stem[: stem.rindex(".npy.") + 4]
    stem = stem[:-4] if stem.endswith(".npy") else stem
    head, _, tag = stem.rpartition(".")
    tagged = bool(head) and tag.replace("_", "").isalnum() and "-" in head.rsplit("_", 1)[-1]
    if torch is False or (torch is None and not tagged):
        return arr
    import torch as _torch

    t = _torch.from_numpy(arr)
    if tagged:
        dt = getattr(_torch, tag, None)
        if isinstance(dt, _torch.dtype):
            t = t.view(dt)
    return t


def active_run_dir() -> str | None:
    """The folder this process records into, or None when the probe is off."""
    from .session import Session

    return Session.active.run.dir if Session.active is not None else None


def nan_origins(run: str | None = None, **options: Any) -> dict[str, Any]:
    """Where a run's NaNs and infs were born, as plain data (what ``pprobe nan`` prints).

    ``run``: a run folder, output folder or run name (default: the latest run). Options:
    ``inf=False`` counts NaN only, ``allow=[patterns]`` extends the allowlist,
    ``default_allow=False`` drops the built-in one. See :func:`pprobe.nan.nan_origins` and
    docs/nan.md. Imported on demand: nothing of it is loaded into a probed program.
    """
    from .nan import nan_origins as find

    return find(run, **options)
