"""Writing .npy dumps of op inputs and outputs within the run's byte budget.

Names: ``op_{op}_input{i}_{prefix}.npy`` / ``op_{op}_output{j}_{prefix}.npy`` (``output`` alone
when the op has one output), ``prefix`` = ``{pid}-{seq}``: unique per call and process.

Every file is written under a hidden temporary name and renamed into place, so no half-written
.npy is ever visible. Nothing is pickled: ``allow_pickle=False``.

The budget is shared by all processes of a run without a server: the budget is cut into
chunks, and a process takes a chunk by creating ``.budget/{k}`` with O_EXCL (atomic on POSIX
file systems). Once a dump does not fit in what a process holds and no chunk is left, dumping
stops for good in that process, and ``.budget/exhausted`` tells the others.
"""

from __future__ import annotations

import os
import re
from typing import Any

from . import _report

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
HEADER_BYTES = 128  # .npy header, counted against the budget


def safe_name(op: str) -> str:
    return _UNSAFE.sub("_", op)[:120] or "op"


class Dumper:
    def __init__(self, run_dir: str, budget: int) -> None:
        self.run_dir = run_dir
        self.budget = budget
        self.budget_dir = os.path.join(run_dir, ".budget")
        n_chunks = max(1, min(1024, budget // (1 << 20))) if budget > 0 else 0
        self.n_chunks = n_chunks
        self.chunk = budget // n_chunks if n_chunks else 0
        self.held = 0  # bytes this process has reserved
        self.used = 0  # bytes this process has written
        self.files = 0
        self.next_k = 0
        self.exhausted = budget <= 0
        self.failed = False
        self._format: Any = None

    def after_fork(self) -> None:
        """A forked child starts with no reserved bytes of its own."""
        self.held = self.used = self.files = 0

    # ------------------------------------------------------------------ budget
    def _reserve(self, nbytes: int) -> bool:
        try:
            os.makedirs(self.budget_dir, exist_ok=True)
            if os.path.exists(os.path.join(self.budget_dir, "exhausted")):
                return False
            while self.used + nbytes > self.held:
                if self.next_k >= self.n_chunks:
                    return False
                path = os.path.join(self.budget_dir, str(self.next_k))
                self.next_k += 1
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                self.held += self.chunk
            return True
        except OSError as e:
            _report.internal_error("dump budget", e)
            return False

    def _exhaust(self, nbytes: int) -> None:
        self.exhausted = True
        try:
            with open(os.path.join(self.budget_dir, "exhausted"), "w") as f:
                f.write(f"{os.getpid()} needed {nbytes} bytes\n")
        except OSError:
            pass
        _report.warn_once(
            "budget",
            f"dump budget of {self.budget} bytes is used up (PPROBE_BUDGET); dumping stops, "
            "logging goes on.",
        )

    # ------------------------------------------------------------------ writing
    def dump(self, arr: Any, op: str, which: str, prefix: str) -> tuple[str | None, str | None]:
        """Save ``arr`` (a numpy array); return (file name, note)."""
        if self.exhausted:
            return None, "not dumped: dump budget exhausted"
        if self.failed:
            return None, "not dumped: dump writing failed earlier (see meta.json)"
        nbytes = int(arr.nbytes) + HEADER_BYTES
        if not self._reserve(nbytes):
            self._exhaust(nbytes)
            return None, "not dumped: dump budget exhausted"
        name = f"op_{safe_name(op)}_{which}_{prefix}.npy"
        path = os.path.join(self.run_dir, name)
        tmp = os.path.join(self.run_dir, "." + name + ".tmp")
        try:
            if self._format is None:
                from numpy.lib import format as npformat

                self._format = npformat
            with open(tmp, "wb") as f:
                self._format.write_array(f, arr, allow_pickle=False)
            os.replace(tmp, path)
        except Exception as e:  # disk full, unwritable dir, odd dtype
            self.failed = True
            try:
                os.unlink(tmp)
            except OSError:
                pass
            _report.internal_error("writing dumps", e)
            return None, f"not dumped: {type(e).__name__}: {e}"[:200]
        self.used += nbytes
        self.files += 1
        return name, None

    def summary(self) -> dict[str, Any]:
        # The budget is the run's: another process of the run may have used it up.
        exhausted = self.exhausted or os.path.exists(os.path.join(self.budget_dir, "exhausted"))
        return {
            "budget": self.budget,
            "bytes_written": self.used,
            "files": self.files,
            "exhausted": exhausted,
            "failed": self.failed,
        }
