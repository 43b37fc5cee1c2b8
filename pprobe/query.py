"""Where SQL is run: DuckDB over every shard of a run, as the views ``ops`` and ``tensors``.

Shards are Arrow IPC streams; a shard whose writer was killed is read up to its last complete
batch (the truncated tail raises, and is ignored). Every batch is validated in full before
use (:func:`_checked`): a damaged batch, or a foreign file among the shards, ends that shard's
readable part, with a :class:`DamagedShardWarning` naming the shard and the rows kept (once
per query, from the cache too). DuckDB's extension auto-install and
auto-load are off: a query never reaches the network.

The Parquet cache. Decoding every shard on every query costs seconds and gigabytes for a large
run, so each shard is converted once, batch by batch, to Parquet in ``<run>/log/.cache/``, and
the views read those files with DuckDB's built-in ``read_parquet`` (projection pushdown,
parallel scans, nothing held in memory). A cache file is named after what it covers::

    {shard}.{tag}.{start}-{end}.{size}-{mtime_ns}.{crc}.parquet

``tag``: the cache version and a hash of ``schema.py``; ``start``-``end``: the bytes of the
shard whose batches it holds (``start`` is the first batch, after the schema message); ``size``
and ``mtime_ns``: the shard's ``os.stat`` when it was last brought up to date; ``crc``: the
CRC-32 of the shard's 4 KiB before ``end``.

- A shard whose size and mtime match its newest part is read from the cache, unopened.
- A new shard is cut at batch boundaries into segments of :data:`SEGMENT_BYTES`, converted in
  parallel (one thread per core), one file each. Older-schema batches are conformed
  (:func:`_conform`) first: every file has the current schema.
- A shard that changed (its run is live) is read on from its newest part's ``end``, once the
  bytes before ``end`` are found unchanged (else it is converted again whole); the small parts
  that this leaves are merged into the next once there are :data:`MAX_SMALL_PARTS` of them.
- Files are written under a temporary name and renamed: a query sees whole files only.
- A run folder that cannot be written (or whose path DuckDB would read as a glob) puts its
  cache in ``$TMPDIR/pprobe-cache-{uid}/{hash of the log folder}/``; where neither can be
  written, the shard is read into memory. Cache folders are 0700 and their files 0600.

pyarrow (and pprobe.schema, which imports it) is imported only to convert or to read shards
into memory: a query that the cache answers does without it (a third of the start-up).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import stat
import tempfile
import time
import uuid
import warnings
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import duckdb

from . import state
from .run import resolve_run_dir

if TYPE_CHECKING:
    import pyarrow as pa

#: The views, as in ``schema.TABLES`` (named here so that pprobe.schema need not be imported).
VIEWS = ("ops", "tensors", "stacks")
#: Bump when the cache's layout or the conversion changes: older parts are then ignored.
CACHE_VERSION = "1"
#: Shard bytes per cache file: a large shard is converted in parallel, one file per segment.
SEGMENT_BYTES = 64 << 20
#: Cache files of a shard smaller than a segment (a live run's increments) before they are
#: merged into the next one.
MAX_SMALL_PARTS = 4
#: Rows per Parquet row group (DuckDB scans row groups in parallel).
ROW_GROUP_ROWS = 256 * 1024
#: Bytes before a part's end whose CRC-32 shows the shard was appended to, not rewritten.
CHECK_BYTES = 4096
#: A temporary file older than this was left by a killed conversion.
STALE_TMP_S = 3600.0
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1

_CONFIG: dict[str, Any] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
_PART = re.compile(
    r"^(?P<shard>.+\.arrows)\.(?P<tag>[A-Za-z0-9]+)\.(?P<start>\d+)-(?P<end>\d+)"
    r"\.(?P<size>\d+)-(?P<mtime>\d+)\.(?P<crc>[0-9a-f]{8})\.parquet$"
)
_DAMAGE = re.compile(
    r"^(?P<shard>.+\.arrows)\.(?P<tag>[A-Za-z0-9]+)\.(?P<size>\d+)-(?P<mtime>\d+)"
    r"\.damaged\.(?P<at>\d+)\.(?P<rows>\d+)$"
)
_GLOB_CHARS = re.compile(r"[*?\[\]{}]")  # DuckDB globs these, even in a list of file names


class QueryError(Exception):
    """Bad SQL: DuckDB's message, then the views and their columns."""


# ------------------------------------------------------------------ reading shards
class DamagedShardWarning(UserWarning):
    """A shard holds a batch that cannot be read or fails validation: the shard's readable
    part ends before it (``pprobe query`` prints it as one line)."""


#: What reading a shard's batches can raise when its bytes are damaged or foreign.
_BAD = (OSError, ValueError, TypeError, KeyError, IndexError, NotImplementedError)


def _checked(b: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    """The batch, validated in full (offsets, lengths, UTF-8: a damaged batch handed on
    unvalidated can crash the Parquet writer), in schema ``sch``. Raises if it is damaged.

    A dictionary-encoded column (pprobe's writer: every name column of a shard shares one
    dictionary, which grows from batch to batch) has its indices checked against its
    dictionary; the dictionary itself is validated once (:func:`_valid_dictionary`), not
    once per column of every batch."""
    import pyarrow as pa

    if not any(pa.types.is_dictionary(t) for t in b.schema.types):
        b.validate(full=True)
        return _conformed(b, sch)
    b.validate()
    for col in b.columns:
        if not pa.types.is_dictionary(col.type):
            col.validate(full=True)
            continue
        d = _valid_dictionary(col.dictionary)
        idx = col.indices
        idx.validate(full=True)
        if idx.null_count < len(idx):
            import pyarrow.compute as pc

            lo, hi = pc.min_max(idx).values()
            if lo.as_py() < 0 or hi.as_py() >= len(d):
                raise pa.ArrowInvalid("a dictionary index past its dictionary")
    return _conformed(b, sch)


#: Dictionaries validated in full, by their buffers' addresses and length; each is kept (its
#: memory cannot be reused for another one) until the cache is full and starts over.
_VALID_DICTS: dict[tuple, pa.Array] = {}


def _valid_dictionary(d: pa.Array) -> pa.Array:
    key = (*(0 if buf is None else buf.address for buf in d.buffers()), len(d), d.offset)
    if key not in _VALID_DICTS:
        d.validate(full=True)
        if len(_VALID_DICTS) >= 8:
            _VALID_DICTS.clear()  # (no iteration: conversion jobs run on several threads)
        _VALID_DICTS[key] = d
    return d


def _cut_short(f: pa.NativeFile, pos: int, size: int) -> bool:
    """Whether the shard's bytes from ``pos`` (a message boundary) are one message cut short
    (a writer killed, or still writing, mid-batch), or the end-of-stream marker: not damage.
    A message whose header or body runs past the end of the file is cut short; anything
    else that cannot be read there is damage."""
    import pyarrow as pa

    while True:  # whole dictionary messages (written with the batch after them) skipped
        left = size - pos
        if left < 8:
            return True
        head = f.read_at(8, pos)
        cont, length = (
            int.from_bytes(head[:4], "little"),
            int.from_bytes(head[4:], "little", signed=True),
        )
        if cont != 0xFFFFFFFF or length < 0:
            return False
        if length == 0 or 8 + length > left:
            return True
        try:
            f.seek(pos)
            msg = pa.ipc.MessageReader.open_stream(f).read_next_message()
        except StopIteration:
            return True
        except (OSError, pa.ArrowException) as e:
            return isinstance(e, OSError) and "for message body" in str(e)
        if msg.type != "dictionary":
            return False  # a whole message that could not be decoded
        pos = f.tell()


def _damaged(path: str, at: int, size: int, rows: int) -> None:
    warnings.warn(
        f"{path} is damaged at byte {at} of {size}: the {rows} rows before it are read, "
        "the rest of this shard is not",
        DamagedShardWarning,
        stacklevel=2,
    )


def read_shard(path: str, sch: pa.Schema | None = None) -> tuple[list[pa.RecordBatch], bool]:
    """Complete, valid batches of one stream file (in schema ``sch``, default the shard's
    own), and whether it ended early: a truncated tail, or damage (then also a
    :class:`DamagedShardWarning`)."""
    import pyarrow as pa

    batches: list[pa.RecordBatch] = []
    end = 0
    try:
        with pa.OSFile(path, "rb") as f:
            size = f.size()
            try:
                reader = pa.ipc.open_stream(f)
                end = f.tell()
                while True:
                    try:
                        b = reader.read_next_batch()
                    except StopIteration:
                        return batches, False
                    batches.append(_checked(b, sch or b.schema))
                    end = f.tell()
            except (*_BAD, pa.ArrowException):
                if not _cut_short(f, end, size):
                    _damaged(path, end, size, sum(b.num_rows for b in batches))
                return batches, True
    except OSError:
        return batches, True


def load_tables(run_dir: str) -> dict[str, pa.Table]:
    """Every shard of the run decoded into memory (no cache): one Arrow table per view."""
    import pyarrow as pa

    from . import schema

    out = {}
    for name, sch in schema.TABLES.items():
        batches: list[pa.RecordBatch] = []
        for path in _shards(run_dir, name):
            got, _ended_early = read_shard(path, sch)
            batches.extend(got)
        out[name] = pa.Table.from_batches(batches, schema=sch)
    return out


def _shards(run_dir: str, name: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(run_dir), "log", f"{name}-*.arrows")))


def _conformed(b: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    """The batch in schema ``sch`` (without the shard's metadata)."""
    import pyarrow as pa

    if b.schema.remove_metadata() != sch:
        return _conform(b, sch)
    return pa.RecordBatch.from_arrays(b.columns, schema=sch)


def _conform(b: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    """A shard of another schema version: keep known columns, fill missing ones with nulls."""
    import pyarrow as pa

    cols = []
    for f in sch:
        i = b.schema.get_field_index(f.name)
        cols.append(b.column(i).cast(f.type) if i >= 0 else pa.nulls(b.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=sch)


def _schemas() -> dict[str, pa.Schema]:
    from . import schema

    return schema.TABLES


# ------------------------------------------------------------------ the Parquet cache
@dataclass(frozen=True)
class Part:
    """One cache file: the batches of bytes [start, end) of a shard."""

    path: str
    start: int
    end: int
    size: int
    mtime_ns: int
    crc: int


@cache
def _tag() -> str:
    """The cache version and a hash of schema.py: any schema change makes new cache files."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.py"), "rb") as f:
            key = hashlib.sha256(f.read()).hexdigest()[:10]
    except OSError:  # not installed as source files
        from . import schema

        key = "v" + re.sub(r"[^A-Za-z0-9]", "x", schema.SCHEMA_VERSION)
    return f"c{CACHE_VERSION}{key}"


def _placed(cache_dir: str, shard: str, p: Part) -> Part:
    """The part with its path: its file name says what it holds (see the module's docstring)."""
    name = f"{shard}.{_tag()}.{p.start}-{p.end}.{p.size}-{p.mtime_ns}.{p.crc:08x}.parquet"
    return dataclasses.replace(p, path=os.path.join(cache_dir, name))


def cache_dirs(run_dir: str) -> list[str]:
    """Where a run's cache may live: ``<run>/log/.cache``, then a per-user temporary folder.

    A folder whose path DuckDB would read as a glob pattern is left out.
    """
    log_dir = os.path.join(os.path.abspath(run_dir), "log")
    key = hashlib.sha256(os.path.realpath(log_dir).encode()).hexdigest()[:16]
    dirs = [os.path.join(log_dir, ".cache"), os.path.join(_temp_root(), key)]
    return [d for d in dirs if not _GLOB_CHARS.search(d)]


def _temp_root() -> str:
    """This user's private folder of caches in the temporary folder."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"pprobe-cache-{user}")


def _list_parts(cache_dir: str) -> dict[str, list[Part]]:
    """This cache folder's parts of the current tag, by shard file name."""
    out: dict[str, list[Part]] = {}
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return out
    tag = _tag()
    for n in names:
        m = _PART.match(n)
        if m is None or m["tag"] != tag:
            continue
        out.setdefault(m["shard"], []).append(
            Part(
                os.path.join(cache_dir, n),
                int(m["start"]),
                int(m["end"]),
                int(m["size"]),
                int(m["mtime"]),
                int(m["crc"], 16),
            )
        )
    return out


def _chain(parts: Iterable[Part]) -> list[Part]:
    """Parts that follow each other from the shard's first batch; the longest at each step.

    Two queries that converted the same tail at once may leave overlapping parts: one of them
    is left out here (and deleted by the next conversion).
    """
    by_start: dict[int, list[Part]] = {}
    for p in parts:
        by_start.setdefault(p.start, []).append(p)
    if not by_start:
        return []
    pos = min(by_start)
    out: list[Part] = []
    while pos in by_start:
        best = max(by_start.pop(pos), key=lambda p: (p.end, p.size, p.mtime_ns))
        out.append(best)
        if best.end <= pos:
            break
        pos = best.end
    return out


def _crc_before(f: pa.NativeFile, end: int) -> int:
    n = min(CHECK_BYTES, end)
    return zlib.crc32(f.read_at(n, end - n)) if n else 0


def _first_batch(path: str) -> int | None:
    """The offset of the shard's first batch: the end of its schema message (the 8-byte
    prefix, the continuation marker and the metadata's length, then the metadata; a schema
    message has no body). None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        head = os.pread(fd, 8, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(head) < 8 or head[:4] != b"\xff\xff\xff\xff":
        return None
    return 8 + int.from_bytes(head[4:], "little", signed=True)


def _read_schema(f: pa.NativeFile) -> tuple[pa.Schema, int] | None:
    """The stream's schema and the offset of its first batch; None while it has no schema."""
    import pyarrow as pa

    try:
        msg = pa.ipc.MessageReader.open_stream(f).read_next_message()
        if msg.type != "schema":
            return None
        return pa.ipc.read_schema(msg), f.tell()
    except (StopIteration, OSError, pa.ArrowException):
        return None


def _scan(path: str, start: int) -> tuple[list[int], int | None]:
    """End offsets of the complete batches from ``start`` (a batch boundary) on, and the
    offset of damage found (None: none).

    Memory-mapped: message bodies are skipped unread (20 ms for a 600 MB shard). Stops at a
    truncated tail, a batch still being written, the end-of-stream marker, or damage.
    """
    import pyarrow as pa

    ends: list[int] = []
    with pa.memory_map(path) as m:
        pos = start
        m.seek(start)
        reader = pa.ipc.MessageReader.open_stream(m)
        while True:
            try:
                msg = reader.read_next_message()
            except StopIteration:
                return ends, None
            except (OSError, pa.ArrowException):
                return ends, None if _cut_short(m, pos, m.size()) else pos
            if msg.type == "dictionary":  # a delta of the strings the next batch uses
                continue
            if msg.type != "record batch":
                return ends, pos
            pos = m.tell()
            ends.append(pos)


def _dict_range(
    path: str, sch: pa.Schema, start: int, end: int, damage: list[int]
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """:func:`_range` for a shard with dictionary-encoded columns: its batches in bytes
    [start, end) read as a stream of the schema message, every dictionary message before
    ``start`` (found from the messages' headers, the bodies of the batches between left
    unread) and the bytes of the range."""
    import pyarrow as pa

    with pa.memory_map(path) as m:
        try:
            reader = pa.ipc.MessageReader.open_stream(m)
            prefix = [reader.read_next_message().serialize()]  # the schema
            while m.tell() < start:
                msg = reader.read_next_message()
                if msg.type == "dictionary":
                    prefix.append(msg.serialize())
        except StopIteration:  # shorter than when it was planned: rewritten since
            damage.append(start)
            return
        if m.tell() != start:
            damage.append(start)
            return
        head = sum(len(p) for p in prefix)
        buf = pa.BufferReader(pa.py_buffer(b"".join([*prefix, m.read_at(end - start, start)])))
    pos = start
    try:
        stream = pa.ipc.open_stream(buf)
        while pos < end:
            try:
                batch = _checked(stream.read_next_batch(), sch)
            except StopIteration:
                return
            pos = buf.tell() - head + start
            yield batch, pos
    except (*_BAD, pa.ArrowException):
        damage.append(pos)


def _range(
    f: pa.NativeFile, src: pa.Schema, sch: pa.Schema, start: int, end: int, damage: list[int]
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The valid batches in bytes [start, end) (whole messages, found by :func:`_scan`);
    the offset of the first that cannot be decoded or validated is appended to ``damage``."""
    import pyarrow as pa

    f.seek(start)
    reader = pa.ipc.MessageReader.open_stream(f)
    pos = start
    while pos < end:
        try:
            msg = reader.read_next_message()
            if msg.type != "record batch":
                raise pa.ArrowInvalid(f"a {msg.type} message at byte {pos}")
            batch = _checked(pa.ipc.read_record_batch(msg, src), sch)
        except (StopIteration, *_BAD, pa.ArrowException):
            damage.append(pos)
            return
        pos = f.tell()
        yield batch, pos


class _PartWriter:
    """A Parquet file written under a temporary name, renamed into place by :meth:`commit`.

    Batches are conformed to the current schema and gathered into row groups of
    :data:`ROW_GROUP_ROWS` rows: memory stays at about one row group.
    """

    def __init__(self, cache_dir: str, shard: str, sch: pa.Schema, meta: dict[str, str]) -> None:
        self.cache_dir = cache_dir
        self.shard = shard
        self.tmp = os.path.join(cache_dir, f".{shard}.{uuid.uuid4().hex}.tmp")
        self.sch = sch
        self.meta = meta
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.writer: Any = None

    def add(self, b: pa.RecordBatch) -> None:
        self.pending.append(_conformed(b, self.sch))
        self.pending_rows += b.num_rows
        if self.pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self.writer is None:
            import pyarrow.parquet as pq

            os.close(_create(self.tmp))  # 0600 (pyarrow would make it 0666 less the umask)

            strings = [f.name for f in self.sch if pa.types.is_string(f.type)]
            self.writer = pq.ParquetWriter(
                self.tmp,
                self.sch.with_metadata(self.meta),
                compression=COMPRESSION,
                compression_level=COMPRESSION_LEVEL,
                # Dictionaries for the strings only, min/max for the other columns only (seq,
                # ts_ns, step: filters skip row groups): the rest costs conversion time.
                use_dictionary=strings,
                write_statistics=[n for n in self.sch.names if n not in strings],
            )
        if self.pending:
            t = pa.Table.from_batches(self.pending, schema=self.sch)
            self.writer.write_table(t, row_group_size=t.num_rows)
            self.pending = []
            self.pending_rows = 0

    def commit(self, start: int, end: int, st: os.stat_result | None, crc: int) -> Part:
        """Close the file and give it its name: bytes [start, end) of the shard; ``st``: the
        shard's stat, for the last part of a conversion only (the others get 0-0)."""
        self._flush()
        self.writer.close()
        self.writer = None
        size, mtime_ns = (st.st_size, st.st_mtime_ns) if st is not None else (0, 0)
        part = Part("", start, end, size, mtime_ns, crc)
        part = _placed(self.cache_dir, self.shard, part)
        os.replace(self.tmp, part.path)
        return part

    def abort(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                pass
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.writer = None


@dataclass
class _Job:
    """Convert bytes [start, end) of a shard, after the parts in ``merge``, into one part.

    ``last``: the conversion's last part, the only one named with the shard's (size, mtime): a
    chain is up to date only when it ends with it, whatever other job failed or was killed.
    """

    path: str
    cache_dir: str
    sch: pa.Schema
    src: pa.Schema
    start: int
    end: int
    merge: list[Part]
    stat: os.stat_result
    last: bool = True
    #: Where the job found a damaged batch (its part ends there), set by :func:`_run_job`.
    damage: int | None = None


def _run_job(job: _Job) -> Part | None:
    """The new part; None when it could not be written (the shard is then read into memory)."""
    import pyarrow as pa

    shard = os.path.basename(job.path)
    meta = {k.decode(): v.decode() for k, v in (job.src.metadata or {}).items()}
    meta.update({"pprobe.cache.source": shard, "pprobe.cache.version": CACHE_VERSION})
    w = _PartWriter(job.cache_dir, shard, job.sch, meta)
    try:
        if job.merge:
            import pyarrow.parquet as pq

            for p in job.merge:
                for b in pq.ParquetFile(p.path).iter_batches(batch_size=65536):
                    w.add(b)
        with pa.OSFile(job.path, "rb") as f:
            end = job.start
            damage: list[int] = []
            if any(pa.types.is_dictionary(t.type) for t in job.src):
                it = _dict_range(job.path, job.sch, job.start, job.end, damage)
            else:
                it = _range(f, job.src, job.sch, job.start, job.end, damage)
            for b, end in it:  # noqa: B007 (the last end is the part's)
                w.add(b)
            job.damage = damage[0] if damage else None
            crc = _crc_before(f, end)
        start = job.merge[0].start if job.merge else job.start
        return w.commit(start, end, job.stat if job.last else None, crc)
    except (OSError, pa.ArrowException):
        return None
    finally:
        w.abort()  # after a commit: nothing left to remove


@dataclass
class _Plan:
    """What one shard needs: ``keep`` (parts still valid), then the parts ``jobs`` will write."""

    path: str
    cache_dir: str
    listed: list[Part]
    keep: list[Part] = field(default_factory=list)
    jobs: list[_Job] = field(default_factory=list)
    stat: os.stat_result | None = None
    #: Where :func:`_scan` (or the schema) found damage, before any job ran.
    damage: int | None = None


def _plan(path: str, sch: pa.Schema, cache_dir: str, listed: list[Part], rebuild: bool) -> _Plan:
    """Split what is new in the shard into jobs of about :data:`SEGMENT_BYTES` each.

    The chain of ``listed`` parts is read on from its end when the shard was only appended to
    (its bytes before that end unchanged); its trailing small parts are merged into the new
    one once there are :data:`MAX_SMALL_PARTS` of them.
    """
    import pyarrow as pa

    plan = _Plan(path, cache_dir, listed)
    with pa.OSFile(path, "rb") as f:
        st = plan.stat = os.fstat(f.fileno())
        head = _read_schema(f)
        if head is None:  # just created, no schema yet: no rows; or no schema at all
            plan.damage = None if _cut_short(f, 0, st.st_size) else 0
            return plan
        src, first = head
        old = [] if rebuild else _chain(listed)
        if not (
            old
            and old[0].start == first
            and old[-1].end <= st.st_size
            and _crc_before(f, old[-1].end) == old[-1].crc
        ):
            old = []  # new, or rewritten since
    start = old[-1].end if old else first
    ends, plan.damage = _scan(path, start)
    if old and not ends:
        plan.keep = old  # nothing new: the newest part is renamed (see _finish)
        return plan
    ranges: list[tuple[int, int]] = []
    for e in ends:
        if ranges and ranges[-1][1] - ranges[-1][0] < SEGMENT_BYTES:
            ranges[-1] = (ranges[-1][0], e)
        else:
            ranges.append((ranges[-1][1] if ranges else start, e))
    if not ranges:
        ranges = [(start, start)]  # a part with no rows records the shard's (size, mtime)
    small = 0
    while small < len(old) and old[-1 - small].end - old[-1 - small].start < SEGMENT_BYTES:
        small += 1
    merge = old[len(old) - small :] if small >= MAX_SMALL_PARTS else []
    plan.keep = old[: len(old) - len(merge)]
    plan.jobs = [
        _Job(path, cache_dir, sch, src, a, b, merge if i == 0 else [], st, i == len(ranges) - 1)
        for i, (a, b) in enumerate(ranges)
    ]
    return plan


def _finish(plan: _Plan, made: list[Part | None]) -> list[str] | None:
    """The shard's files once its jobs ran; None when a job failed.

    Damage found by a job ends the shard's readable part there: the parts of later segments
    are removed, and a marker remembers the damage for the queries that read the cache
    unopened (:func:`_list_damage`): each says so again."""
    if any(p is None for p in made):
        return None
    shard = os.path.basename(plan.path)
    parts = [p for p in made if p is not None]
    damage = plan.damage
    for i, job in enumerate(plan.jobs):
        if job.damage is not None:
            damage = job.damage
            for p in parts[i + 1 :]:
                _unlink(p.path)
            parts = parts[: i + 1]
            break
    chain = plan.keep + parts
    st = plan.stat
    if (
        chain
        and st is not None
        and (chain[-1].size, chain[-1].mtime_ns) != (st.st_size, st.st_mtime_ns)
    ):
        # Nothing new (a batch still being written, or the end-of-stream marker), or damage
        # ended the conversion early: the newest part is renamed to the shard's (size, mtime).
        old = chain[-1]
        new = dataclasses.replace(old, size=st.st_size, mtime_ns=st.st_mtime_ns)
        new = _placed(plan.cache_dir, shard, new)
        try:
            os.replace(old.path, new.path)
        except FileNotFoundError:
            if not os.path.exists(new.path):  # else renamed by a concurrent query
                return None
        chain[-1] = new
    _remove_stale(plan.cache_dir, shard, plan.listed, chain, st)
    if damage is not None and st is not None:
        import pyarrow.parquet as pq

        rows = sum(pq.read_metadata(p.path).num_rows for p in chain)
        if chain:
            name = f"{shard}.{_tag()}.{st.st_size}-{st.st_mtime_ns}.damaged.{damage}.{rows}"
            try:
                os.close(_create(os.path.join(plan.cache_dir, name)))
            except OSError:
                pass  # made by a concurrent query, or not at all: the next one warns again
        _damaged(plan.path, damage, st.st_size, rows)
    return [p.path for p in chain]


def _list_damage(cache_dir: str) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(shard, size, mtime_ns) -> (byte of the damage, rows before it), from the markers
    :func:`_finish` leaves."""
    out = {}
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return {}
    tag = _tag()
    for n in names:
        m = _DAMAGE.match(n)
        if m is not None and m["tag"] == tag:
            out[(m["shard"], int(m["size"]), int(m["mtime"]))] = (int(m["at"]), int(m["rows"]))
    return out


def _create(path: str) -> int:
    """A new private file (0600), never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o600)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_stale(
    cache_dir: str, shard: str, parts: list[Part], chain: list[Part], st: os.stat_result | None
) -> None:
    """Delete the shard's listed parts left out of its chain, its parts of another tag, its
    damage markers of another version of it, and temporary files of killed conversions.

    Best effort: another query may be reading them (it runs again, see :func:`run_sql`).
    """
    keep = {p.path for p in chain}
    listed = {p.path for p in parts}
    tag = _tag()
    now = time.time()
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return
    for n in names:
        path = os.path.join(cache_dir, n)
        m = _PART.match(n)
        if m is not None and m["shard"] == shard:
            stale = path not in keep and (m["tag"] != tag or path in listed)
        elif (d := _DAMAGE.match(n)) is not None and d["shard"] == shard:
            stale = st is None or (int(d["size"]), int(d["mtime"])) != (st.st_size, st.st_mtime_ns)
        elif n.startswith(f".{shard}.") and n.endswith(".tmp"):
            try:
                stale = now - os.stat(path).st_mtime > STALE_TMP_S
            except OSError:
                continue
        else:
            continue
        if stale:
            try:
                os.unlink(path)
            except OSError:
                pass


def _writable(d: str) -> bool:
    """Whether cache files can be written in ``d``, made 0700 if needed. In the temporary
    folder, its parent ``pprobe-cache-{uid}`` must be this user's folder, and is made 0700."""
    try:
        parent = os.path.dirname(d)
        if parent == _temp_root():
            os.makedirs(parent, mode=0o700, exist_ok=True)
            st = os.lstat(parent)
            if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
                return False
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(parent, 0o700)  # made wider by an older pprobe
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK)


@dataclass
class Sources:
    """What a view reads: Parquet files, and shards that could only be read into memory."""

    files: list[str] = field(default_factory=list)
    memory: list[pa.Table] = field(default_factory=list)
    #: A cache file of this view, even a stale one: its columns for an unfilled view.
    sample: str | None = None


def table_sources(
    run_dir: str, views: Iterable[str] | None = None, rebuild: bool = False
) -> dict[str, Sources]:
    """Each view's Parquet files, converting the shards that are new or changed since.

    Only the views in ``views`` (default: all) are brought up to date; the others get a
    ``sample`` only. Conversion jobs (every shard, :data:`SEGMENT_BYTES` each) run in parallel,
    one thread per core. ``rebuild``: convert every shard again and take no sample (a cache
    file DuckDB could not read).
    """
    wanted = VIEWS if views is None else tuple(v for v in VIEWS if v in set(views))
    dirs = cache_dirs(run_dir)
    listings = [_list_parts(d) for d in dirs]
    damages = [_list_damage(d) for d in dirs]
    out = {v: Sources() for v in VIEWS}
    for listing in [] if rebuild else listings:
        for shard, parts in listing.items():
            v = shard.split("-", 1)[0]
            if v in out and out[v].sample is None and parts:
                out[v].sample = parts[0].path
    target: int | None = -1  # index of the folder new parts go to; None: none can be written
    plans: list[tuple[str, str, _Plan | None]] = []
    for view in wanted:
        for path in _shards(run_dir, view):
            shard = os.path.basename(path)
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone since it was listed
            fresh = None
            first: int | None = -1  # the offset of the shard's first batch, read when needed
            for listing, damage in [] if rebuild else zip(listings, damages):
                chain = _chain(listing.get(shard, ()))
                if chain and (chain[-1].size, chain[-1].mtime_ns) == (st.st_size, st.st_mtime_ns):
                    if first == -1:
                        first = _first_batch(path)
                    if chain[0].start != first:
                        # a listing taken while another query replaced the shard's first
                        # parts (merging small ones): not the whole shard
                        continue
                    fresh = chain
                    known = damage.get((shard, st.st_size, st.st_mtime_ns))
                    if known is not None:
                        _damaged(path, known[0], st.st_size, known[1])
                    break
            if fresh is not None:
                out[view].files.extend(p.path for p in fresh)
                continue
            if target == -1:
                target = next((i for i, d in enumerate(dirs) if _writable(d)), None)
            plan = None
            if target is not None:
                listed = listings[target].get(shard, [])
                try:
                    plan = _plan(path, _schemas()[view], dirs[target], listed, rebuild)
                except OSError:
                    pass  # read into memory
            plans.append((view, path, plan))
    jobs = [j for _, _, plan in plans if plan is not None for j in plan.jobs]
    workers = min(len(jobs), state.cores())
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="pprobe-cache") as pool:
            made = dict(zip(map(id, jobs), pool.map(_run_job, jobs)))
    else:
        made = {id(j): _run_job(j) for j in jobs}
    for view, path, plan in plans:
        files = None if plan is None else _finish(plan, [made[id(j)] for j in plan.jobs])
        if files is not None:
            out[view].files.extend(files)
        else:  # no cache folder can be written: this shard is read into memory
            import pyarrow as pa

            sch = _schemas()[view]
            got, _ended_early = read_shard(path, sch)
            out[view].memory.append(pa.Table.from_batches(got, schema=sch))
    return out


# ------------------------------------------------------------------ DuckDB
def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _read_parquet(files: list[str]) -> str:
    listed = ", ".join(_quote(p) for p in files)
    return f"read_parquet([{listed}], hive_partitioning = false, union_by_name = false)"


def _register(
    con: duckdb.DuckDBPyConnection, view: str, src: Sources, fill: bool, name: str = ""
) -> None:
    """Define the view over its Parquet files and in-memory shards; empty unless ``fill``.
    ``name``: the name to give it (default the view's)."""
    name = name or view
    selects = []
    if fill and src.files:
        selects.append(f"SELECT * FROM {_read_parquet(src.files)}")
    if fill and src.memory:
        import pyarrow as pa

        mem = f"_pprobe_{view}_memory"
        con.register(mem, pa.concat_tables(src.memory))
        selects.append(f"SELECT * FROM {mem}")
    if not selects:
        if src.sample is not None:  # the columns, without pyarrow
            selects.append(f"SELECT * FROM {_read_parquet([src.sample])} LIMIT 0")
        else:
            con.register(name, _schemas()[view].empty_table())
            return
    con.execute(f"CREATE VIEW {name} AS " + " UNION ALL ".join(selects))


def named_tables(sql: str) -> set[str]:
    """The views a query may read: every view whose name appears in it as a word."""
    return {v for v in VIEWS if re.search(rf"\b{v}\b", sql, re.IGNORECASE)}


def connect(
    run: str | None = None,
    extra_tables: dict[str, Any] | None = None,
    *,
    tables: Iterable[str] | None = None,
    cache: bool = True,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the run's views registered (latest run by default).

    ``tables``: the views to fill (default all); the others have their columns and no rows.
    ``cache=False``: every shard decoded into memory (:func:`load_tables`), no Parquet cache.
    """
    con = _open(resolve_run_dir(run), tables, "cache" if cache else "memory")
    try:
        for name, table in (extra_tables or {}).items():
            con.register(name, table)
    except BaseException:
        con.close()
        raise
    return con


def _open(
    run_dir: str, tables: Iterable[str] | None, how: str, sql: str | None = None
) -> duckdb.DuckDBPyConnection:
    """``how``: "cache", "rebuild" (the cache converted again) or "memory"."""
    from . import dumpkeep

    con = duckdb.connect(config=_CONFIG)
    try:
        # Dumps a ring deleted (pprobe.dumpkeep): ``tensors`` shows them as dropped.
        dropped = dumpkeep.dropped_files(run_dir)
        raw = {"tensors": "_pprobe_tensors_raw"} if dropped else {}
        if how == "memory":
            for name, table in load_tables(run_dir).items():
                con.register(raw.get(name, name), table)
        else:
            fill = set(VIEWS if tables is None else tables)
            for view, src in table_sources(run_dir, fill, how == "rebuild").items():
                _register(con, view, src, view in fill, raw.get(view, ""))
        if dropped:
            dumpkeep.register_view(con, raw["tensors"], dropped)
        _register_compare(con, run_dir)
        from .ext import sqlviews  # schema python: the user tables (pprobe.ext)

        sqlviews.register(con, run_dir, sql=sql)
    except BaseException:
        con.close()
        raise
    return con


def _register_compare(con: duckdb.DuckDBPyConnection, run_dir: str) -> None:
    """A folder saved by ``pprobe compare --save`` holds compare.parquet: the view
    ``compare`` (pprobe.compare_cli)."""
    path = os.path.join(run_dir, "compare.parquet")
    if os.path.isfile(path) and not _GLOB_CHARS.search(path):
        con.execute(f"CREATE VIEW compare AS SELECT * FROM {_read_parquet([path])}")


def describe_views(con: duckdb.DuckDBPyConnection) -> str:
    lines = ["Views and their columns:"]
    names = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()]
    for name in sorted(set(VIEWS) | ({"compare"} & set(names))):
        cols = con.execute(f"DESCRIBE {name}").fetchall()
        lines.append(f"  {name}(" + ", ".join(f"{c[0]} {c[1]}" for c in cols) + ")")
    return "\n".join(lines)


def run_sql(sql: str, run: str | None = None) -> tuple[list[str], list[tuple]]:
    """Run one query; returns (column names, rows). Raises :class:`QueryError` on bad SQL.

    Only the views the SQL names are filled (a GROUP BY over ``ops`` converts no tensors
    shard). An error about a cache file is a file deleted under the query by a concurrent
    conversion, or a damaged file (deleted here): the query runs again, over new files; at the
    third try, over a cache converted again whole.
    """
    from .ext.sqlviews import rewrite

    run_dir = resolve_run_dir(run)
    sql = rewrite(sql)  # information_schema.df_settings (pprobe.ext.sqlviews)
    tables = named_tables(sql)
    dirs = cache_dirs(run_dir)
    for how in ("cache", "cache", "rebuild"):
        try:
            con = _open(run_dir, tables, how, sql)
        except duckdb.Error as e:  # defining a view reads a file's footer
            if how != "rebuild" and _drop_named(e, dirs):
                continue
            raise QueryError(str(e)) from None
        try:
            cur = con.execute(sql)
            if cur.description is None:
                return [], []
            return [d[0] for d in cur.description], cur.fetchall()
        except duckdb.Error as e:
            if how != "rebuild" and _drop_named(e, dirs):
                continue
            raise QueryError(f"{e}\n\n{describe_views(con)}") from None
        finally:
            con.close()
    raise AssertionError("unreachable")


def _drop_named(e: duckdb.Error, dirs: list[str]) -> bool:
    """Whether DuckDB's error is about a cache file (its first line names one); such a file
    that still exists cannot be read, and is deleted."""
    first = str(e).split("\n", 1)[0]
    if not any(d in first for d in dirs):
        return False
    for p in re.findall(r"""['"]([^'"]+\.parquet)['"]""", first):
        if os.path.dirname(p) in dirs and _PART.match(os.path.basename(p)):
            try:
                os.unlink(p)
            except OSError:
                pass
    return True
