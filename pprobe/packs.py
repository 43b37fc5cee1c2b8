"""Pack files: small dumps appended to one file per process instead of one file each.

Dump mode's cost on small arrays is the file system's, not the copy: every new file is a
create, a write and a rename (about 500 us of wall per file on a shared disk). Arrays whose
encoded size (the .npy header and data, or a codec's bytes) is at most ``PPROBE_DUMP_PACK``
bytes are appended by the dump writer thread to ``<run>/.packs/{host}-{pid}-{k}.npk`` instead
(owner-only, created with O_CREAT|O_EXCL|O_NOFOLLOW relative to the run folder's descriptor, one
append per dump, no fsync). Larger arrays stay individual files.

A pack is a sequence of entries; every entry is self-checking, so a pack cut short by kill -9
(or a crash) is readable up to its last complete entry::

    magic  b"PPKE"      4 bytes
    version             u8    1 or 2 (below)
    kind                u8    0: data (payload = the dump file's bytes), 1: alias
    name length         u16   (little-endian, like every field)
    payload length      u64
    crc32               u32   version 1: of the 16 bytes above, then the name, then the payload
    hlen                u32   version 1: 0; version 2: how many payload bytes the crc32 covers
    name                      the seed file name (``op_{op}_input{i}_{prefix}.npy``)
    digest              16    version 2 only: XXH3-128 (``xxhash.xxh3_128_digest``) of the
                              payload after its first hlen bytes
    payload                   data: exactly what the .npy (or codec) file would hold;
                              alias: the name of the earlier dump of the same content

Version 2 (data entries of arrays of 64 bytes and more, while the dumps' content hash is
XXH3-128) reuses the digest the program's thread already took of the array to find contents
seen before: its crc32 covers the 16 bytes above, hlen, the name, the digest and the first
hlen bytes of the payload (the .npy header), and the digest covers the array's bytes, which
the dump writer thread then writes without reading them once more (``python -m
bench.crc_cost``: the pack writer's CRC pass was ~7 % of a dump-mode run's CPU). The digest is
of the array as it was read on the program's thread, just before its bytes were copied: an
array that another thread writes during the call can fail the check, and then reads as a cut
pack (its dump has no defined values anyway).

Rows keep ``dump_path`` = the seed name the file would have had; :func:`read` (used by the
central loader, pprobe.codecs.load) finds a name that is not a file in its folder's packs. The
index of a pack is built by scanning it (no pickle) and cached per pack by inode, size and
mtime; a pack that grew is scanned from where the last scan stopped.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any

MAGIC = b"PPKE"
VERSION = 1
#: Entries whose array bytes are checked by their XXH3-128 digest (see above).
VERSION_DIGEST = 2
DIGEST_SIZE = 16
DATA, ALIAS = 0, 1
HEAD = struct.Struct("<4sBBHQII")  # magic, version, kind, name length, payload length, crc, hlen
HEAD_SIZE = HEAD.size  # 24
PACK_DIR = ".packs"
SUFFIX = ".npk"
#: A pack grows to about this size before the writer starts the process's next one.
PACK_MAX = 1 << 30


def entry_head(
    kind: int, name: bytes, payload: Any, digest: bytes | None = None, hlen: int = 0
) -> bytes:
    """The 24-byte header of an entry (the writers put the name, then ``digest`` if given,
    then the payload after it). ``digest``: the XXH3-128 digest of ``payload[hlen:]`` (a
    version 2 entry), or None (version 1: the crc32 covers the whole payload)."""
    if digest is None:
        first = struct.pack("<4sBBHQ", MAGIC, VERSION, kind, len(name), len(payload))
        crc = zlib.crc32(payload, zlib.crc32(name, zlib.crc32(first)))
        return first + struct.pack("<II", crc, 0)
    if len(digest) != DIGEST_SIZE or not 0 <= hlen <= len(payload):
        raise ValueError("a version 2 entry needs a 16-byte digest and hlen <= the payload")
    first = struct.pack("<4sBBHQ", MAGIC, VERSION_DIGEST, kind, len(name), len(payload))
    tail = struct.pack("<I", hlen)
    return first + struct.pack("<I", _crc_v2(first, tail, name, digest, payload)) + tail


def _crc_v2(first: bytes, tail: bytes, name: bytes, digest: bytes, payload: Any) -> int:
    """A version 2 entry's crc32: the head's first 16 bytes, hlen (``tail``), the name, the
    digest and the payload's first hlen bytes."""
    crc = zlib.crc32(first)
    for part in (tail, name, digest, memoryview(payload)[: struct.unpack("<I", tail)[0]]):
        crc = zlib.crc32(part, crc)
    return crc


def _xxh3_128() -> Any:
    """xxhash's XXH3-128 (a dependency of pprobe): version 2 entries are checked with it."""
    from xxhash import xxh3_128_digest

    return xxh3_128_digest


class Entry:
    __slots__ = ("pack", "offset", "length", "kind", "target")

    def __init__(self, pack: str, offset: int, length: int, kind: int, target: str) -> None:
        self.pack = pack  # path of the pack file
        self.offset = offset  # where the payload starts
        self.length = length
        self.kind = kind
        self.target = target  # alias: the earlier dump's name


class PackIndex:
    """The entries of one pack, as far as they are complete."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.key: tuple = ()
        self.end = 0  # where the last complete entry ends
        self.entries: dict[str, Entry] = {}
        self.bad_tail = False  # something after ``end`` that is not a complete entry

    def refresh(self) -> None:
        st = os.stat(self.path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key == self.key:
            return
        if self.key[:2] != key[:2] or st.st_size < self.end:  # another file: scan it anew
            self.end, self.entries = 0, {}
        self.key = key
        with open(self.path, "rb") as f:
            self._scan(f, st.st_size)

    def _scan(self, f: Any, size: int) -> None:
        f.seek(self.end)
        at = self.end
        self.bad_tail = False
        while at < size:
            head = f.read(HEAD_SIZE)
            if len(head) < HEAD_SIZE:
                break
            magic, version, kind, nlen, plen, crc, hlen = HEAD.unpack(head)
            if magic != MAGIC or version not in (VERSION, VERSION_DIGEST):
                break
            if kind not in (DATA, ALIAS) or not nlen:
                break
            dl = DIGEST_SIZE if version == VERSION_DIGEST else 0
            if at + HEAD_SIZE + nlen + dl + plen > size:
                break
            name = f.read(nlen)
            digest = f.read(dl)
            payload = f.read(plen)
            if len(payload) != plen or len(digest) != dl:
                break
            if dl:
                if hlen > plen:
                    break
                if _crc_v2(head[:16], head[20:24], name, digest, payload) != crc:
                    break
                if _xxh3_128()(memoryview(payload)[hlen:]) != digest:
                    break
            elif zlib.crc32(payload, zlib.crc32(name, zlib.crc32(head[:16]))) != crc:
                break
            try:
                text = name.decode("utf-8")
                target = payload.decode("utf-8") if kind == ALIAS else ""
            except UnicodeDecodeError:
                break
            self.entries[text] = Entry(self.path, at + HEAD_SIZE + nlen + dl, plen, kind, target)
            at += HEAD_SIZE + nlen + dl + plen
            self.end = at
        self.bad_tail = self.end < size


_indexes: dict[str, PackIndex] = {}


def pack_paths(folder: str) -> list[str]:
    """The pack files of a dumps folder (a run folder), sorted."""
    d = os.path.join(folder, PACK_DIR)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted(os.path.join(d, n) for n in names if n.endswith(SUFFIX) and not n.startswith("."))


def indexes(folder: str) -> list[PackIndex]:
    """The (refreshed) indexes of a folder's packs."""
    out = []
    for p in pack_paths(folder):
        ix = _indexes.get(p)
        if ix is None:
            if len(_indexes) > 4096:
                _indexes.clear()
            ix = _indexes[p] = PackIndex(p)
        try:
            ix.refresh()
        except OSError:
            continue
        out.append(ix)
    return out


def find(folder: str, name: str) -> Entry | None:
    """The data entry of ``name`` in ``folder``'s packs (aliases followed), or None."""
    ixs = indexes(folder)
    for _ in range(64):  # an alias names an earlier dump; no chain is that long
        e = None
        for ix in ixs:
            e = ix.entries.get(name)
            if e is not None:
                break
        if e is None or e.kind == DATA:
            return e
        name = e.target
    return None


def read(path: str | os.PathLike) -> bytes | None:
    """The bytes the dump file ``path`` would hold, from its folder's packs; None when no pack
    has it. An alias whose earlier dump is a plain file reads that file."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    folder = folder or "."
    ixs = indexes(folder)
    for _ in range(64):
        e = None
        for ix in ixs:
            e = ix.entries.get(name)
            if e is not None:
                break
        if e is None:
            return None
        if e.kind == ALIAS:
            name = e.target
            plain = os.path.join(folder, name)
            if os.path.isfile(plain):
                with open(plain, "rb") as f:
                    return f.read()
            continue
        with open(e.pack, "rb") as f:
            f.seek(e.offset)
            data = f.read(e.length)
        if len(data) != e.length:
            return None
        return data
    return None


def names(folder: str) -> dict[str, Entry]:
    """Every dump name the folder's packs hold (data entries and aliases)."""
    out: dict[str, Entry] = {}
    for ix in indexes(folder):
        out.update(ix.entries)
    return out


def stats(folder: str) -> dict[str, int]:
    """packs, entries (data), aliases and bytes of data payload in a folder's packs."""
    packs = entries = aliases = nbytes = 0
    for ix in indexes(folder):
        packs += 1
        for e in ix.entries.values():
            if e.kind == DATA:
                entries += 1
                nbytes += e.length
            else:
                aliases += 1
    return {"packs": packs, "entries": entries, "aliases": aliases, "bytes": nbytes}
