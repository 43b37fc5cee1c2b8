"""The spool: a bounded local folder where batches wait while the collector is unreachable.

Each waiting batch is one Arrow IPC *file* (``{client}-{batch id}-{stream}.arrow``), written
under a temporary name and renamed (:meth:`pprobe.safefs.RunDir.replace_atomic`), so a file
in the spool is always whole. Its schema metadata ``pprobe.collect`` holds the batch's header
(run id, host, pid, rank, stream, client instance, batch id): a spooled batch is sent later,
by this process or by ``pprobe collect --resend``, with the same id, and the collector
keeps it once whoever sends it and however often.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from .. import safefs

SUFFIX = ".arrow"
HEADER_KEY = b"pprobe.collect"


def encode(header: dict[str, Any], batch: Any) -> bytes:
    """One batch and its header as the bytes of an Arrow IPC file."""
    import pyarrow as pa

    meta = dict(batch.schema.metadata or {})
    meta[HEADER_KEY] = json.dumps(header, sort_keys=True).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema.with_metadata(meta)) as w:
        w.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode(data: Any) -> tuple[dict[str, Any], Any]:
    """(header, batch) of a spool file's bytes; the batch without the header metadata."""
    import pyarrow as pa

    r = pa.ipc.open_file(pa.py_buffer(data) if isinstance(data, bytes) else data)
    meta = dict(r.schema.metadata or {})
    header = json.loads(meta.pop(HEADER_KEY))
    batch = r.get_batch(0)
    return header, batch.replace_schema_metadata(meta or None)


def file_name(header: dict[str, Any]) -> str:
    stream = re.sub(r"[^A-Za-z0-9._]", "_", str(header["stream"]))
    return f"{header['client']}-{int(header['batch']):012d}-{stream}{SUFFIX}"


class Spool:
    """A process's spool folder, bounded to ``limit`` bytes."""

    def __init__(self, folder: safefs.RunDir, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self.lock = threading.Lock()
        self.used = 0
        self.rows_dropped = 0
        self.batches_dropped = 0
        self._sizes: dict[str, int] = {}
        for name in self.names():
            st = folder.lstat(name)
            self._sizes[name] = st.st_size if st else 0
        self.used = sum(self._sizes.values())

    @classmethod
    def open(cls, path: str, name: str, limit: int, permissions: str = "private") -> Spool:
        """The spool ``path/name`` (``path`` made if missing, ``name`` never a symlink)."""
        base = safefs.open_base(path, permissions)
        try:
            return cls(base.subdir(name), limit)
        finally:
            base.close()

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.folder.path) if n.endswith(SUFFIX))
        except OSError:
            return []

    def put(self, header: dict[str, Any], batch: Any) -> bool:
        """Keep a batch; False (and counted as dropped) when the spool has no room for it."""
        data = encode(header, batch)
        name = file_name(header)
        with self.lock:
            if self.used + len(data) > self.limit:
                self.rows_dropped += batch.num_rows if header["stream"] != "dumps" else 0
                self.batches_dropped += 1
                return False
            self.folder.replace_atomic(name, data)
            self.used += len(data) - self._sizes.get(name, 0)
            self._sizes[name] = len(data)
        return True

    def get(self, name: str) -> tuple[dict[str, Any], Any]:
        with open(os.path.join(self.folder.path, name), "rb") as f:
            return decode(f.read())

    def remove(self, name: str) -> None:
        with self.lock:
            self.folder.unlink(name)
            self.used -= self._sizes.pop(name, 0)

    def set_aside(self, name: str) -> None:
        """A file that cannot be read: renamed ``*.bad`` (kept for a look, never resent)."""
        with self.lock:
            try:
                self.folder.rename(name, name + ".bad")
            except OSError:
                self.folder.unlink(name)
            self.used -= self._sizes.pop(name, 0)

    def __len__(self) -> int:
        return len(self._sizes)

    def close(self) -> None:
        self.folder.close()


def walk(root: str) -> Iterator[str]:
    """Every spool file under ``root`` (a process's spool or a folder of them), sorted."""
    if os.path.isfile(root):
        yield root
        return
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(SUFFIX) and not f.startswith("."):
                yield os.path.join(d, f)
