"""Run folders, the ``latest`` pointer, meta.json and handing a run to child processes.

Layout (docs/output.md)::

    np_op_dumps/
      LATEST                                the newest run's name (the source of truth)
      latest -> 20261121-120501-4242        a symlink to it, where symlinks can be made
      20261121-120501-4242/
        meta.json                           the run: argv, versions, config, exit, coverage
        procs/{host}-{pid}.json             one per process (children, ranks, workers)
        log/ops-{host}-{pid}.arrows         Arrow IPC streams, one shard per process
        log/tensors-{host}-{pid}.arrows
        log/stacks-{host}-{pid}.arrows      call stacks (PPROBE_STACK_DEPTH)
        op_numpy.add_input0_4242-17.npy     dumps

The first probed process of a run creates the folder and exports ``PPROBE_RESOLVED`` (the
resolved config and the folder, as JSON); every child process inherits it and joins the run
instead of creating a new one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from typing import Any

from . import __version__, _report, core, safefs
from .config import Config

RESOLVED_ENV = "PPROBE_RESOLVED"
#: Disk set aside in each run folder for its final meta.json (``.reserve``, given back at the
#: end of the run, or on a full disk to write meta.json).
RESERVE = ".reserve"
RESERVE_BYTES = 256 << 10


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
        self.folder: safefs.RunDir = None  # type: ignore[assignment]  # set by create_or_join
        self.procs: safefs.RunDir | None = None
        self.previous_latest: str | None = None

    # ------------------------------------------------------------------ creation
    @classmethod
    def create_or_join(cls, config: Config) -> Run:
        """Join the run of the parent process, or make a new run folder (pprobe.safefs: made
        and written relative to descriptors, never through a symlink).

        A new run writes its meta.json before ``latest`` points at it: a run that cannot be
        written (a full disk) is removed again and leaves the pointers as they were."""
        inherited = os.environ.get(RESOLVED_ENV)
        d = json.loads(inherited) if inherited else None
        # Join only as a child process. In the process that made the run (pprobe.enable()
        # again after disable()), joining would reopen and truncate this pid's log shard.
        if d is not None and d.get("root_pid") != os.getpid():
            config = Config.from_json(d["config"])
            run = cls(config, d["run_dir"], d["run_id"], root=False)
            run.folder = safefs.RunDir.open(run.dir, config.permissions)
            run.procs = run.folder.subdir("procs")
            return run
        base_path = os.path.abspath(config.output)
        made_base = not os.path.isdir(base_path)
        base = safefs.open_base(base_path, config.permissions)
        try:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_id = f"{stamp}-{os.getpid()}"
            for i in range(1000):
                rid = run_id if i == 0 else f"{run_id}-{i}"
                try:
                    folder = safefs.RunDir.make(base, rid)
                    run_id = rid
                    break
                except FileExistsError:
                    continue
            else:
                raise FileExistsError(errno.EEXIST, f"no free run name {run_id}-N")
            run = cls(config, folder.path, run_id, root=True)
            run.folder = folder
            try:
                run.procs = folder.subdir("procs")
                run.write_meta()
            except BaseException:
                run._unmake(base)
                if made_base:  # what a full disk let us make: nothing is left
                    base.close()
                    try:
                        os.rmdir(base_path)
                    except OSError:
                        pass
                raise
            run._reserve()
            run.previous_latest = latest_name(base_path)  # given back if nothing is recorded
            _point_latest(base, run_id)
        finally:
            base.close()
        os.environ[RESOLVED_ENV] = json.dumps(
            {
                "config": config.to_json(),
                "run_dir": run.dir,
                "run_id": run_id,
                "root_pid": os.getpid(),
            }
        )
        return run

    def _reserve(self) -> None:
        """Set :data:`RESERVE_BYTES` of disk aside in the run folder (``.reserve``): on a
        full disk it is given back to write the final meta.json (:meth:`_write_json`)."""
        try:
            fd = self.folder.create(RESERVE)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except (OSError, AttributeError):  # no space, or no fallocate here: no reserve
            self.folder.unlink(RESERVE)
        finally:
            os.close(fd)

    def _write_json(self, folder: safefs.RunDir, name: str, data: dict[str, Any]) -> None:
        """Write ``name`` atomically; on a full disk, once more after giving the reserve back."""
        try:
            folder.replace_atomic(name, _json(data))
        except OSError as e:
            if e.errno != errno.ENOSPC or not self.folder.unlink(RESERVE):
                raise
            folder.replace_atomic(name, _json(data))

    def _unmake(self, base: safefs.RunDir) -> None:
        """Remove what :meth:`create_or_join` made of a run that could not start."""
        if self.procs is not None:
            self.procs.unlink(f"{self.host}-{self.pid}.json")
            self.procs.close()
        self.folder.unlink("meta.json")
        self.folder.rmdir("procs")
        self.folder.close()
        base.rmdir(self.id)

    def close(self) -> None:
        """Give the reserve back (the process that made the run, at its end) and close the
        run's folder descriptors (a stopped session; later writes use paths)."""
        if self.root:
            self.folder.unlink(RESERVE)
        for d in (self.procs, self.folder):
            if d is not None:
                d.close()

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
            # the engines, and who encodes the log (pprobe.writer.Writer.log_writer)
            "core": {**core.facts(), **(writer.facts() if writer is not None else {})},
            "dumps": dumper.summary() if dumper is not None else None,
            "rows_written": writer.rows_written if writer is not None else 0,
            "rows_dropped": writer.rows_dropped if writer is not None else 0,
            "errors": [dict(e) for e in _report.errors],
            "warnings": list(_report.warnings),
            **self.extra,
        }

    def write_meta(self, dumper: Any = None, writer: Any = None) -> None:
        """Write procs/{host}-{pid}.json, and meta.json when this process started the run."""
        proc = self.process_meta(dumper, writer)
        procs = self.procs if self.procs is not None else self.folder.subdir("procs")
        self._write_json(procs, f"{self.host}-{self.pid}.json", proc)
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
                "rows_written": proc["rows_written"],
                "rows_dropped": proc["rows_dropped"],
                "errors": proc["errors"],
                "warnings": proc["warnings"],
                "skipped": skipped(self.dir),
                **self.extra,
            }
            self._write_json(self.folder, "meta.json", meta)


def skipped(run_dir: str) -> list[dict[str, Any]]:
    """Child processes that could not run pprobe (``skipped/*.json``, written by
    :func:`pprobe._startup.skip` or the bootstrap): pid, executable, python and why."""
    out = []
    try:
        names = sorted(os.listdir(os.path.join(run_dir, "skipped")))
    except OSError:
        return []
    for name in names:
        if name.endswith(".json"):
            try:
                with open(os.path.join(run_dir, "skipped", name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "pprobe": __version__}
    for name in ("numpy", "torch", "pyarrow"):
        m = sys.modules.get(name)
        out[name] = getattr(m, "__version__", None) if m is not None else None
    return out


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, default=str).encode()


def _point_latest(base: safefs.RunDir, run_id: str) -> None:
    """Point ``LATEST`` (the source of truth) and then the ``latest`` symlink at the new run.

    Both are replaced atomically (a temporary name renamed over the old), under an exclusive
    lock of the output folder, so two runs starting at once leave both naming the same run.
    A ``latest`` that is not a symlink (a folder of the user's) is left alone, and said once.
    """
    with _locked(base.fd):
        base.replace_atomic("LATEST", (run_id + "\n").encode())
        st = base.lstat("latest")
        if st is not None and not stat.S_ISLNK(st.st_mode):
            _report.warn_once(
                "latest",
                f"{os.path.join(base.path, 'latest')} is not a symlink, so it does not point "
                f"at this run; LATEST names it ({run_id}). Remove it to get `latest` back.",
            )
            return
        try:
            base.symlink_atomic(run_id, "latest")
        except OSError:
            pass  # no symlinks here (some file systems): LATEST alone


@contextlib.contextmanager
def _locked(fd: int | None) -> Iterator[None]:
    """flock(LOCK_EX) on a folder's descriptor for the block; no lock where flock fails."""
    try:
        import fcntl

        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)


def resolve_run_dir(path: str | None, output: str = "np_op_dumps") -> str:
    """A run folder from a user's --run argument: a run folder, or an output folder (latest).

    Without one: the latest run under $PPROBE_OUTPUT, else under ./np_op_dumps."""
    p = os.path.abspath(path or os.environ.get("PPROBE_OUTPUT") or output)
    if os.path.isfile(os.path.join(p, "meta.json")) or os.path.isdir(os.path.join(p, "log")):
        return p
    name = latest_name(p)
    if name is not None:
        return os.path.join(p, name)
    raise FileNotFoundError(
        f"no pprobe run found at {p} (expected a run folder or an output "
        "folder with a `latest` run)"
    )


def latest_name(output: str) -> str | None:
    """The newest run's folder name under the output folder: ``LATEST`` (the source of
    truth), else the ``latest`` symlink of output folders made before it existed."""
    try:
        with open(os.path.join(output, "LATEST")) as f:
            name = f.read().strip()
    except OSError:
        name = ""
    if not name:
        link = os.path.join(output, "latest")
        name = os.readlink(link) if os.path.islink(link) else ""
    if (
        not name
        or "/" in name
        or name in (".", "..")
        or not os.path.isdir(os.path.join(output, name))
    ):
        return None
    return name
