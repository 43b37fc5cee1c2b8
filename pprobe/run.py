"""Run folders, the ``latest`` pointer, meta.json and handing a run to child processes.

Layout (docs/output.md)::

    np_op_dumps/
      latest -> 20261121-120501-4242        (symlink; LATEST text file where links fail)
      20261121-120501-4242/
        meta.json                           the run: argv, versions, config, exit, coverage
        procs/{host}-{pid}.json             one per process (children, ranks, workers)
        log/ops-{host}-{pid}.arrows         Arrow IPC streams, one shard per process
        log/tensors-{host}-{pid}.arrows
        op_numpy.add_input0_4242-17.npy     dumps

The first probed process of a run creates the folder and exports ``PPROBE_RESOLVED`` (the
resolved config and the folder, as JSON); every child process inherits it and joins the run
instead of creating a new one.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

from . import __version__, _report, core
from .config import Config

RESOLVED_ENV = "PPROBE_RESOLVED"


class Run:
    def __init__(self, config: Config, run_dir: str, run_id: str, root: bool) -> None:
        self.config = config
        self.dir = run_dir
        self.id = run_id
        self.root = root  # this process created the run
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.start = time.time()
        self.end: float | None = None
        self.exit: dict[str, Any] = {"status": "running"}
        self.coverage: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    # ------------------------------------------------------------------ creation
    @classmethod
    def create_or_join(cls, config: Config) -> Run:
        inherited = os.environ.get(RESOLVED_ENV)
        d = json.loads(inherited) if inherited else None
        # Join only as a child process. In the process that made the run (pprobe.enable()
        # again after disable()), joining would reopen and truncate this pid's log shard.
        if d is not None and d.get("root_pid") != os.getpid():
            run = cls(Config.from_json(d["config"]), d["run_dir"], d["run_id"], root=False)
            os.makedirs(os.path.join(run.dir, "procs"), exist_ok=True)
            return run
        base = os.path.abspath(config.output)
        os.makedirs(base, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-{os.getpid()}"
        for i in range(1000):
            rid = run_id if i == 0 else f"{run_id}-{i}"
            try:
                os.mkdir(os.path.join(base, rid))
                run_id = rid
                break
            except FileExistsError:
                continue
        run = cls(config, os.path.join(base, run_id), run_id, root=True)
        os.makedirs(os.path.join(run.dir, "procs"), exist_ok=True)
        _point_latest(base, run_id)
        os.environ[RESOLVED_ENV] = json.dumps(
            {
                "config": config.to_json(),
                "run_dir": run.dir,
                "run_id": run_id,
                "root_pid": os.getpid(),
            }
        )
        return run

    def after_fork(self) -> None:
        self.root = False
        self.pid = os.getpid()
        self.start = time.time()
        self.exit = {"status": "running"}

    # ------------------------------------------------------------------ metadata
    def process_meta(self, dumper: Any = None, writer: Any = None) -> dict[str, Any]:
        from . import state

        return {
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": self.host,
            "rank": state.rank,
            "world_size": state.world_size,
            "argv": list(sys.argv) if hasattr(sys, "argv") else [],
            "executable": sys.executable,
            "start": self.start,
            "end": self.end,
            "exit": self.exit,
            "coverage": self.coverage,
            "core": core.facts(),
            "dumps": dumper.summary() if dumper is not None else None,
            "rows_written": writer.rows_written if writer is not None else 0,
            "errors": [dict(e) for e in _report.errors],
            "warnings": list(_report.warnings),
            **self.extra,
        }

    def write_meta(self, dumper: Any = None, writer: Any = None) -> None:
        """Write procs/{host}-{pid}.json, and meta.json when this process started the run."""
        proc = self.process_meta(dumper, writer)
        _atomic_json(os.path.join(self.dir, "procs", f"{self.host}-{self.pid}.json"), proc)
        if self.root:
            meta = {
                "pprobe_version": __version__,
                "run_id": self.id,
                "run_dir": self.dir,
                "argv": proc["argv"],
                "orig_argv": list(getattr(sys, "orig_argv", [])),
                "cwd": os.getcwd(),
                "host": self.host,
                "pid": self.pid,
                "rank": proc["rank"],
                "versions": versions(),
                "config": self.config.to_json(),
                "config_sources": self.config.sources,
                "start": self.start,
                "end": self.end,
                "exit": self.exit,
                "coverage": self.coverage,
                "core": proc["core"],
                "dumps": proc["dumps"],
                "errors": proc["errors"],
                "warnings": proc["warnings"],
                **self.extra,
            }
            _atomic_json(os.path.join(self.dir, "meta.json"), meta)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "pprobe": __version__}
    for name in ("numpy", "torch", "pyarrow"):
        m = sys.modules.get(name)
        out[name] = getattr(m, "__version__", None) if m is not None else None
    return out


def _atomic_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
    os.replace(tmp, path)


def _point_latest(base: str, run_id: str) -> None:
    """Atomically point ``latest`` at the new run (a text file LATEST where symlinks fail)."""
    link = os.path.join(base, "latest")
    tmp = os.path.join(base, f".latest.{os.getpid()}")
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(run_id, tmp)
        os.replace(tmp, link)
    except OSError:
        pass
    with open(os.path.join(base, "LATEST"), "w") as f:
        f.write(run_id + "\n")


def resolve_run_dir(path: str | None, output: str = "np_op_dumps") -> str:
    """A run folder from a user's --run argument: a run folder, or an output folder (latest).

    Without one: the latest run under $PPROBE_OUTPUT, else under ./np_op_dumps."""
    p = os.path.abspath(path or os.environ.get("PPROBE_OUTPUT") or output)
    if os.path.isfile(os.path.join(p, "meta.json")) or os.path.isdir(os.path.join(p, "log")):
        return p
    latest = os.path.join(p, "latest")
    if os.path.isdir(latest):
        return os.path.realpath(latest)
    marker = os.path.join(p, "LATEST")
    if os.path.isfile(marker):
        with open(marker) as f:
            return os.path.join(p, f.read().strip())
    raise FileNotFoundError(
        f"no pprobe run found at {p} (expected a run folder or an output "
        "folder with a `latest` run)"
    )
