"""Reading what a run folder says about its run: ended, still running, or died.

meta.json says ``exit: {"status": "running"}`` from the start of a run until its process
writes the final status at exit. A process killed by a signal it could not catch
(``kill -9``, the OOM killer, a power cut) never writes it, so "running" alone does not
tell a live run from a dead one. :func:`status` tells them apart the way lock files are
checked: meta.json records the ``host`` and ``pid`` of the process that made the run; on
that host, the run is live while that pid is alive and is the same process (it started no
later than the run). Commands that list or read runs use this module.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

#: What :func:`status` can say.
ENDED, RUNNING, DIED, UNKNOWN = "ended", "running", "died", "unknown"


@dataclass(frozen=True)
class RunStatus:
    """``state``: ended (meta.json has the final exit status), running (its process is alive
    on this host), died (its process is gone without writing one), or unknown (it runs on
    another host, or meta.json cannot be read). ``exit``: meta.json's exit field."""

    state: str
    exit: dict[str, Any] = field(default_factory=dict)
    host: str | None = None
    pid: int | None = None
    reason: str = ""


def read_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's meta.json as a dict; {} when it is missing, unreadable or not an object."""
    try:
        with open(os.path.join(os.fspath(run_dir), "meta.json"), "rb") as f:
            m = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def status(run_dir: str | os.PathLike[str]) -> RunStatus:
    """The state of the run in ``run_dir`` (see :class:`RunStatus`)."""
    try:
        with open(os.path.join(os.fspath(run_dir), "meta.json"), "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as e:
        return RunStatus(UNKNOWN, reason=f"meta.json cannot be read: {e}")
    exit_ = meta.get("exit") if isinstance(meta.get("exit"), dict) else {}
    host, pid = meta.get("host"), meta.get("pid")
    if exit_.get("status") != "running":
        return RunStatus(ENDED, exit_, host, pid)
    if host != socket.gethostname() or not isinstance(pid, int):
        return RunStatus(UNKNOWN, exit_, host, pid, f"it runs on another host ({host})")
    if pid_alive(pid, meta.get("start")):
        return RunStatus(RUNNING, exit_, host, pid)
    return RunStatus(DIED, exit_, host, pid, f"process {pid} ended without a final status")


def pid_alive(pid: int, started_by: float | None = None) -> bool:
    """Whether process ``pid`` of this host is alive (a zombie is not) and, where /proc
    says when it started, started no later than ``started_by`` (else the pid was reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    except OSError:
        return False
    started = _proc_start(pid)
    if started is None:
        return True
    state, t0 = started
    if state in ("Z", "X"):
        return False
    return started_by is None or t0 is None or t0 <= float(started_by) + 1.0


def _proc_start(pid: int) -> tuple[str, float | None] | None:
    """(state, start time in seconds since the epoch) from Linux's /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold ")"
    state = fields[0] if fields else "?"
    try:
        ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(x.split()[1]) for x in f if x.startswith("btime "))
        return state, btime + ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError, StopIteration):
        return state, None
