"""Which dumps are kept: the dump ring (PPROBE_DUMP_KEEP=steps:K) and PPROBE_ON_NAN=dump.

The :class:`pprobe.dumps.Dumper` files each dump under the step it was made in (``state.step``;
a deferred device dump under the step of its call). Dumps of one step, in one stretch of time,
form a *group*; each process has its own ring of groups.

- ``PPROBE_DUMP_KEEP=steps:K``: when a group is K groups old, its files are deleted and their
  bytes go back to the budget (the budget counts only what is kept), so a long run keeps
  dumping in its last steps instead of spending the budget on its first.
- ``PPROBE_ON_NAN=dump``: a dump that the budget refuses is *held* (written outside the
  budget) and its whole call's files are released (deleted) once its group is K+1 groups old,
  unless the first NaN origin came first: then the groups of that step and of the K steps
  before it are pinned, kept whatever the budget did. Holding goes on until the NaN's step ends.

A deleted file's rows cannot be rewritten (the log is append-only), so each process appends the
seq ranges it dropped to ``dropped/{host}-{pid}.csv`` (``pid,step,lo,hi,why,k``), and the
``tensors`` view of :mod:`pprobe.query` shows those rows with ``dump_path`` NULL and a note
saying why (:func:`register_view`).

Hard links (repeated contents) share an inode: bytes go back to the budget when the last name
of that content is deleted, and later links point to the newest name, which lives longest.
"""

from __future__ import annotations

import glob
import os
import re
from collections import deque
from typing import Any

from . import state

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DROPPED_DIR = "dropped"
#: The note of a deferred dump whose step's group was already dropped when it came.
LATE_NOTE = "dump dropped: its step is no longer kept (PPROBE_DUMP_KEEP)"


class _Group:
    """The dumps of one step (one stretch of it) in this process."""

    __slots__ = ("step", "names", "held_seqs", "ticket", "age_done", "pinned")

    def __init__(self, step: int) -> None:
        self.step = step
        self.names: list[tuple[str, int, int]] = []  # (file name, seq, inode id or -1)
        self.held_seqs: set[int] = set()  # calls with a dump outside the budget
        self.ticket = 0  # the dump queue's ticket after the group's last dump
        self.age_done = 0  # 1: its kept files are deleted (keep); 2: done
        self.pinned = False


class Ring:
    """One process's groups of dumps, and what leaves them. Called under the Dumper's lock."""

    def __init__(self, dumper: Any, keep: int, hold: int, host: str) -> None:
        self.d = dumper
        self.keep = keep  # K of PPROBE_DUMP_KEEP=steps:K; 0: every kept dump stays
        self.hold = hold  # groups that hold dumps past the budget (PPROBE_ON_NAN=dump), or 0
        self.host = re.sub(r"[^A-Za-z0-9._-]", "_", host)
        self._init()

    def _init(self) -> None:
        self.groups: deque[_Group] = deque()
        self.by_step: dict[int, _Group] = {}
        # inode id -> [names alive, bytes, held, dedup key]
        self.inodes: dict[int, list] = {}
        self.inode_of: dict[str, int] = {}  # file name -> inode id, for names in the ring
        self.group_of: dict[str, _Group] = {}  # file name -> its group, for names in the ring
        self.next_inode = 0
        self.fd = -1
        self.nan_step: int | None = None
        self.pinned: list[int] = []  # steps kept for the NaN
        self.dropped_files = 0
        self.dropped_bytes = 0
        self.held_bytes = 0

    def after_fork(self) -> None:
        """A forked child has its own ring: its parent's groups are the parent's."""
        self._init()

    # ------------------------------------------------------------------ state
    @property
    def holding(self) -> bool:
        """Whether a dump the budget refuses is held (PPROBE_ON_NAN=dump, before the NaN's
        step has ended)."""
        if not self.hold:
            return False
        return self.nan_step is None or self.nan_step == state.step

    def group(self, step: int) -> _Group | None:
        """The group a dump of ``step`` goes to (a new step opens one and ages the others);
        None when that step's group has already left the ring (a late deferred dump)."""
        g = self.groups[-1] if self.groups else None
        if g is not None and g.step == step:
            return g
        if step != state.step:  # a deferred dump of an earlier step
            return self.by_step.get(step)
        if self.nan_step is not None:
            g = self.by_step.get(step)
            if step == self.nan_step and self.hold:  # the NaN's step goes on: kept for good
                if g is None or not g.pinned:
                    g = self.by_step[step] = _Group(step)
                    g.pinned = True
                return g
            self.hold = 0  # the NaN's step ended: later dumps go by the budget alone
        g = _Group(step)
        self.groups.append(g)
        self.by_step[step] = g
        self._age()
        return g

    def add(self, g: _Group, name: str, seq: int, key: Any, nbytes: int, held: bool,
            link: str | None) -> None:  # fmt: skip
        """A dump queued: ``nbytes`` taken from the budget (0 for a link or a held dump)."""
        if link is not None:
            ino = self.inode_of.get(link, -1)
            rec = self.inodes.get(ino)
            if rec is None:  # a file kept for good: the link frees nothing when it goes
                ino = -1
            else:
                rec[0] += 1
                self.inode_of[name] = ino
                if key is not None and self.d.seen.get(key) == link:
                    self.d.seen[key] = name  # the newest name lives longest
        else:
            ino = self.next_inode
            self.next_inode += 1
            self.inodes[ino] = [1, nbytes, held, key]
            self.inode_of[name] = ino
            if held:
                self.held_bytes += nbytes
        g.names.append((name, seq, ino))
        if held:
            g.held_seqs.add(seq)
        t = self.d.io.ticket()  # this dump's job included
        g.ticket = t
        if link is not None:
            # the file linked to must outlive the queued link job: its group waits for it
            tg = self.group_of.get(link)
            if tg is not None and tg.ticket < t:
                tg.ticket = t
        self.group_of[name] = g

    def nan_origin(self) -> list[int]:
        """The first NaN origin: the groups in the ring now (its step and the ones before
        it) are kept for good. Returns their steps."""
        self.nan_step = state.step
        for g in self.groups:
            g.pinned = True
        self.pinned = [g.step for g in self.groups]
        if not self.pinned:
            self.pinned = [state.step]
        self.groups = deque(g for g in self.groups if not g.pinned)
        return self.pinned

    # ------------------------------------------------------------------ leaving
    def _age(self) -> None:
        n = len(self.groups)
        # Until the NaN came, the ring keeps the K steps before the current one too.
        keep = max(self.keep, self.hold) if self.keep and self.hold else self.keep
        for i, g in enumerate(self.groups):
            age = n - 1 - i  # groups newer than g
            if keep and age >= keep and g.age_done < 1:
                self._drop(g, None, "keep", keep)
                g.age_done = 2
            elif self.hold and age >= self.hold and g.age_done < 2:
                if g.held_seqs:
                    self._drop(g, g.held_seqs, "nan", self.hold - 1)
                g.age_done = 2
            elif not self.keep and not self.hold:
                g.age_done = 2
        while self.groups and self.groups[0].age_done >= 2:
            g = self.groups.popleft()
            if self.by_step.get(g.step) is g:
                del self.by_step[g.step]
            for name, _seq, ino in g.names:  # files kept for good: no longer tracked
                self.inode_of.pop(name, None)
                self.group_of.pop(name, None)
                self.inodes.pop(ino, None)

    def _drop(self, g: _Group, seqs: set[int] | None, why: str, k: int) -> None:
        """Delete the group's files (only those of the calls in ``seqs`` when given)."""
        d = self.d
        if not d.io.wait(g.ticket, 60.0):
            return  # the writer is stuck: deleting now could race its write
        gone: list[int] = []
        for name, seq, ino in g.names:
            if seqs is not None and seq not in seqs:
                continue
            gone.append(seq)
            try:
                os.unlink(name, dir_fd=d.dirfd)
                self.dropped_files += 1
            except OSError:
                pass  # never written (a failure the row already tells)
            self.inode_of.pop(name, None)
            self.group_of.pop(name, None)
            rec = self.inodes.get(ino)
            if rec is None:
                continue
            rec[0] -= 1
            if rec[0] <= 0:
                del self.inodes[ino]
                self.dropped_bytes += rec[1]
                if rec[2]:
                    self.held_bytes -= rec[1]
                else:
                    d.used -= rec[1]  # back to the budget
                if rec[3] is not None and d.seen.get(rec[3]) == name:
                    del d.seen[rec[3]]
        g.names = [t for t in g.names if seqs is not None and t[1] not in seqs]
        self._note(g.step, gone, why, k)

    def _note(self, step: int, seqs: list[int], why: str, k: int) -> None:
        """Append the dropped seqs, as ranges, to dropped/{host}-{pid}.csv."""
        if not seqs:
            return
        s = sorted(set(seqs))
        lines = []
        lo = prev = s[0]
        for q in s[1:]:
            if q != prev + 1:
                lines.append(f"{os.getpid()},{step},{lo},{prev},{why},{k}\n")
                lo = q
            prev = q
        lines.append(f"{os.getpid()},{step},{lo},{prev},{why},{k}\n")
        try:
            if self.fd < 0:
                try:
                    os.mkdir(DROPPED_DIR, 0o700, dir_fd=self.d.dirfd)
                except FileExistsError:
                    pass
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _O_NOFOLLOW | _O_CLOEXEC
                name = f"{DROPPED_DIR}/{self.host}-{os.getpid()}.csv"
                self.fd = os.open(name, flags, 0o600, dir_fd=self.d.dirfd)
            os.write(self.fd, "".join(lines).encode())
        except OSError as e:
            from . import _report

            _report.internal_error("noting dropped dumps", e)

    def close(self) -> None:
        """At the end: no NaN came, so the dumps still held past the budget are released."""
        if self.hold and self.nan_step is None:
            for g in self.groups:
                if g.held_seqs and g.age_done < 2:
                    self._drop(g, g.held_seqs, "nan", self.hold - 1)
                    g.age_done = 2
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def summary(self) -> dict[str, Any]:
        return {
            "keep_steps": self.keep,
            "dropped_files": self.dropped_files,
            "dropped_bytes": self.dropped_bytes,
            "held_bytes": self.held_bytes,
            "nan_steps_kept": self.pinned,
        }


# ---------------------------------------------------------------------- reading it back
_NOTE_SQL = (
    "CASE d.why WHEN 'keep' THEN 'dump dropped: step ' || d.step || ' left the last ' || d.k "
    "|| ' steps kept (PPROBE_DUMP_KEEP)' ELSE 'dump dropped: held past the budget for "
    "PPROBE_ON_NAN=dump, released as no NaN came within ' || d.k || ' steps' END"
)


def dropped_files(run_dir: str) -> list[str]:
    """The run's dropped/*.csv files (none unless a ring dropped dumps)."""
    return sorted(glob.glob(os.path.join(glob.escape(run_dir), DROPPED_DIR, "*.csv")))


def register_view(con: Any, raw: str, files: list[str]) -> None:
    """``tensors``: the rows of ``raw`` with the dumps a ring dropped shown as dropped."""
    listed = ", ".join("'" + p.replace("'", "''") + "'" for p in files)
    con.execute(
        "CREATE TEMP TABLE _pprobe_dropped AS SELECT * FROM read_csv(["
        + listed
        + "], header = false, ignore_errors = true, columns = {'pid': 'BIGINT', "
        "'step': 'BIGINT', 'lo': 'BIGINT', 'hi': 'BIGINT', 'why': 'VARCHAR', 'k': 'BIGINT'}) "
        "WHERE hi IS NOT NULL AND k IS NOT NULL"
    )
    hit = "(d.hi IS NOT NULL AND t.seq <= d.hi AND t.dump_path IS NOT NULL)"
    con.execute(
        f"CREATE VIEW tensors AS SELECT t.* REPLACE ("
        f"CASE WHEN {hit} THEN NULL ELSE t.dump_path END AS dump_path, "
        f"CASE WHEN {hit} THEN {_NOTE_SQL} ELSE t.note END AS note) "
        f"FROM {raw} t ASOF LEFT JOIN _pprobe_dropped d ON t.pid = d.pid AND t.seq >= d.lo"
    )
