"""pprobe: see every NumPy and PyTorch operation a program runs, without changing it.

Zero-code use: ``PYTHONPATH=bootstrap python train.py`` or ``pprobe run -- python train.py``.
In code: ``pprobe.enable(mode="stats")`` ... ``pprobe.disable()``, or ``with pprobe.probe():``.

This module stays light: it is imported at interpreter start-up by the bootstrap, so it imports
neither numpy, torch, pyarrow nor duckdb.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["enable", "disable", "probe", "step", "load", "active_run_dir", "__version__"]


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


def load(path: str, torch: bool | None = None) -> Any:
    """Load a dump written by pprobe as the array it was (see docs/output.md).

    A dump of a dtype NumPy lacks (``op_..._{pid}-{seq}.bfloat16.npy``: raw bits, the true
    dtype in the name) comes back as the identical torch tensor. ``torch=True`` returns a
    torch tensor for any dump, ``torch=False`` the NumPy array as stored.
    """
    import os

    import numpy as np

    arr = np.load(path, allow_pickle=False)
    stem = os.path.basename(path)
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
