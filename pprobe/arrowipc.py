"""A minimal Arrow IPC *stream* encoder: the log's shards written without pyarrow.

Importing pyarrow costs the probed process ~40-45 ms of CPU, and its first use (kernels,
string dictionaries) as much again: on a short program that alone makes log mode x1.4. The
log's schemas use six types only (:mod:`pprobe.logschema`), so this module writes Arrow's
columnar IPC format for exactly those, from NumPy buffers, with no dependency but NumPy:

* ``utf8``, ``int32``, ``int64``, ``float64``, ``bool`` and ``list<int64>``, each with a
  validity bitmap (left out where a column has no null), every field nullable;
* the *encapsulated message format*: the continuation marker 0xFFFFFFFF, the metadata's
  length (int32), a ``Message`` flatbuffer (MetadataVersion V5) padded to 8 bytes, then the
  body, each buffer padded to 8 bytes, uncompressed, except the buffers of a column with one
  value in every row of a batch (:class:`Const`): those are LZ4 frames of one match that
  repeats the value (:func:`lz4_periodic`, Arrow's ``LZ4_FRAME`` body compression; the
  batch's other buffers are marked as left uncompressed);
* the *streaming format*: one ``Schema`` message (with the schema's custom_metadata), then a
  ``RecordBatch`` message per batch; the end-of-stream marker (0xFFFFFFFF 0x00000000) is
  written by :meth:`StreamWriter.close` only, so a writer killed (kill -9) leaves a stream that
  readers read up to its last complete batch.

The flatbuffers are hand-encoded by :class:`_Builder`, a back-to-front builder as in the
flatbuffers library, enough for Arrow's ``Schema.fbs`` / ``Message.fbs`` tables (no vtable
sharing). Columns are :class:`Column` s (buffers in IPC order); :func:`to_pyarrow` turns a batch
into a ``pyarrow.RecordBatch`` from the same buffers, for the writers that need one (the
collector's tap, ``PPROBE_LOG_WRITER=pyarrow``).

Spec: https://arrow.apache.org/docs/format/Columnar.html ("Serialization and Interprocess
Communication"); format/Schema.fbs and format/Message.fbs in apache/arrow.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

#: The types this encoder writes (pprobe.logschema names them the same way). ``dict<utf8>`` is
#: a utf8 field dictionary-encoded with int32 indices: every such field of a stream shares
#: one dictionary (:data:`DICT_ID`), the strings of :class:`Batch`'s ``dictionary``.
UTF8, INT32, INT64, FLOAT64, BOOL, LIST_INT64, DICT_UTF8 = (
    "utf8", "int32", "int64", "float64", "bool", "list<int64>", "dict<utf8>",
)  # fmt: skip
TYPES = (UTF8, INT32, INT64, FLOAT64, BOOL, LIST_INT64, DICT_UTF8)
#: The id of a stream's one dictionary (Schema.fbs DictionaryEncoding.id).
DICT_ID = 0

CONTINUATION = b"\xff\xff\xff\xff"
#: The end-of-stream marker: a continuation and a metadata length of 0.
EOS = CONTINUATION + b"\x00\x00\x00\x00"

# Message.fbs / Schema.fbs constants
_V5 = 4  # MetadataVersion.V5
_HEADER_SCHEMA, _HEADER_DICTIONARY_BATCH, _HEADER_RECORD_BATCH = 1, 2, 3  # union MessageHeader
_T_INT, _T_FLOAT, _T_UTF8, _T_BOOL, _T_LIST = 2, 3, 5, 6, 12  # union Type
_DOUBLE = 2  # Precision.DOUBLE

_PAD = bytes(8)


# ---------------------------------------------------------------------- flatbuffers
class _Builder:
    """A back-to-front flatbuffer builder. Objects are written before the objects that point to
    them (a uoffset points forward); positions are kept as offsets from the buffer's end, so
    prepending never moves them. Scalars are aligned to their size from the end, and the
    finished buffer's size is a multiple of 8: aligned from its start as well."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def _prep(self, align: int, extra: int) -> None:
        """Pad so that ``extra`` bytes prepended next leave the buffer aligned to ``align``."""
        pad = -(len(self.buf) + extra) % align
        if pad:
            self.buf[0:0] = bytes(pad)

    def _put(self, data: bytes, align: int) -> int:
        self._prep(align, len(data))
        self.buf[0:0] = data
        return len(self.buf)

    def string(self, s: str) -> int:
        data = s.encode("utf-8", "replace")
        self._prep(4, len(data) + 1)
        self.buf[0:0] = data + b"\x00"
        return self._put(struct.pack("<I", len(data)), 4)

    def offsets(self, targets: Sequence[int]) -> int:
        """A vector of uoffsets to objects already written."""
        self._prep(4, 4 * (len(targets) + 1))
        for t in reversed(targets):  # each offset is relative to its own position
            self.buf[0:0] = struct.pack("<I", len(self.buf) + 4 - t)
        return self._put(struct.pack("<I", len(targets)), 4)

    def structs(self, data: bytes, count: int) -> int:
        """A vector of 16-byte structs (two int64s each), given as their bytes."""
        self._prep(8, len(data))
        self.buf[0:0] = data
        return self._put(struct.pack("<I", count), 4)

    def table(self, fields: Sequence[tuple[int, str, Any]]) -> int:
        """A table of ``(slot, struct code or "off", value)`` fields (absent fields take
        their default). Wider scalars first, so little padding is needed."""
        start = len(self.buf)
        where: dict[int, int] = {}
        size = {"q": 8, "off": 4, "i": 4, "h": 2, "B": 1, "?": 1}
        for slot, code, value in sorted(fields, key=lambda f: -size[f[1]]):
            if code == "off":
                self._prep(4, 4)
                self.buf[0:0] = struct.pack("<I", len(self.buf) + 4 - value)
            else:
                self._put(struct.pack("<" + code, value), size[code])
            where[slot] = len(self.buf)
        self._prep(4, 4)
        self.buf[0:0] = bytes(4)  # the soffset to the vtable, set below
        pos = len(self.buf)
        n = max(where) + 1 if where else 0
        vt = [4 + 2 * n, pos - start] + [pos - where[s] if s in where else 0 for s in range(n)]
        vtable = struct.pack(f"<{len(vt)}H", *vt)
        self.buf[0:0] = vtable  # right before the table: 2-aligned, as the table is 4-aligned
        struct.pack_into("<i", self.buf, len(vtable), len(vtable))  # vtable = table - soffset
        return pos

    def finish(self, root: int) -> bytes:
        self._prep(8, 4)
        self.buf[0:0] = struct.pack("<I", len(self.buf) + 4 - root)
        return bytes(self.buf)


def _message(b: _Builder, header_type: int, header: int, body_length: int) -> bytes:
    """The encapsulated message's prefix: continuation, length, the Message flatbuffer
    (padded to 8 bytes: the body that follows starts 8-aligned)."""
    msg = b.table([(0, "h", _V5), (1, "B", header_type), (2, "off", header),
                   (3, "q", body_length)])  # fmt: skip
    meta = b.finish(msg)
    meta += bytes(-len(meta) % 8)
    return CONTINUATION + struct.pack("<i", len(meta)) + meta


def _field(b: _Builder, name: str, tp: str) -> int:
    children: list[int] = []
    if tp == LIST_INT64:
        children = [_field(b, "item", INT64)]
    if tp in (INT32, INT64):
        t_type, t = _T_INT, b.table([(0, "i", 32 if tp == INT32 else 64), (1, "?", True)])
    elif tp == FLOAT64:
        t_type, t = _T_FLOAT, b.table([(0, "h", _DOUBLE)])
    elif tp in (UTF8, DICT_UTF8):
        t_type, t = _T_UTF8, b.table([])
    elif tp == BOOL:
        t_type, t = _T_BOOL, b.table([])
    elif tp == LIST_INT64:
        t_type, t = _T_LIST, b.table([])
    else:
        raise ValueError(f"arrowipc: no encoding for type {tp!r}")
    fields = [(2, "B", t_type), (3, "off", t)]
    if tp == DICT_UTF8:  # DictionaryEncoding: id, indexType Int(32, signed); not ordered
        index = b.table([(0, "i", 32), (1, "?", True)])
        fields.append((4, "off", b.table([(0, "q", DICT_ID), (1, "off", index)])))
    kids = b.offsets(children)
    nm = b.string(name)
    return b.table([(0, "off", nm), (1, "?", True), *fields, (5, "off", kids)])


_core: Any = None  # pprobe.core, once imported (the engine is read from it at every call)


def _native() -> Any:
    """The native core (its ``ipc_*`` functions write the same bytes as this module's Python
    code, without a Python call per buffer), or None where the Python engine runs."""
    global _core
    c = _core
    if c is None:
        from . import core as c

        _core = c
    return c.native


def schema_message(fields: Sequence[tuple[str, str]], metadata: dict[str, str]) -> bytes:
    """The stream's first message: the schema (``(name, type)`` fields, all nullable) and its
    custom_metadata, in the order given."""
    native = _native()
    if native is not None:
        return native.ipc_schema_message(fields, metadata)  # type: ignore[no-any-return]
    return py_schema_message(fields, metadata)


def py_schema_message(fields: Sequence[tuple[str, str]], metadata: dict[str, str]) -> bytes:
    """:func:`schema_message` in Python (the native core's ipc_schema_message is its twin)."""
    b = _Builder()
    kv = []
    for k, v in metadata.items():
        vs, ks = b.string(v), b.string(k)
        kv.append(b.table([(0, "off", ks), (1, "off", vs)]))
    kvs = b.offsets(kv)
    fs = b.offsets([_field(b, name, tp) for name, tp in fields])
    sch = b.table([(1, "off", fs), (2, "off", kvs)])
    return _message(b, _HEADER_SCHEMA, sch, 0)


# ---------------------------------------------------------------------- columns
class Column:
    """One column's Arrow data: ``buffers`` in IPC order (validity first; None: no validity
    bitmap, the column has no null), a list's values in ``child``. A buffer is anything with
    the buffer protocol (NumPy arrays, bytes)."""

    __slots__ = ("length", "null_count", "buffers", "child")

    def __init__(self, length: int, null_count: int, buffers: list, child: Column | None = None):
        self.length = length
        self.null_count = null_count
        self.buffers = buffers
        self.child = child


def _validity(np: Any, valid: Any) -> tuple[int, Any]:
    """(null count, bitmap or None) of a bool mask (LSB first, as Arrow's bitmaps)."""
    n = len(valid)
    ok = int(np.count_nonzero(valid))
    if ok == n:
        return 0, None
    return n - ok, np.packbits(valid, bitorder="little")


class Const:
    """A buffer of ``size`` bytes that repeat ``pattern`` (cut at ``size``): the data of a
    column with one value in every row (``run_id``, ``pid``, all-null columns). The writer
    never makes its bytes; :func:`batch_message` writes it as a few dozen bytes of LZ4
    (:func:`lz4_periodic`), and ``bytes(c)`` gives them where a reader needs them."""

    __slots__ = ("pattern", "size")

    def __init__(self, pattern: bytes, size: int) -> None:
        if not pattern and size:
            raise ValueError("arrowipc: an empty pattern for a non-empty buffer")
        self.pattern = pattern
        self.size = size

    def __bytes__(self) -> bytes:
        if not self.size:
            return b""
        return (self.pattern * -(-self.size // len(self.pattern)))[: self.size]

    def __len__(self) -> int:
        return self.size


def _zeros(size: int) -> Const:
    return Const(b"\0", size)


def nulls(np: Any, tp: str, n: int) -> Column:
    """n nulls of type ``tp``: zeroed buffers of the right sizes (:class:`Const`)."""
    bitmap = _zeros((n + 7) // 8)
    if tp == DICT_UTF8:  # the indices' layout
        tp = INT32
    if tp == UTF8:
        return Column(n, n, [bitmap, _zeros(4 * (n + 1)), b""])
    if tp == LIST_INT64:
        return Column(n, n, [bitmap, _zeros(4 * (n + 1))], Column(0, 0, [None, b""]))
    width = {INT32: 4, INT64: 8, FLOAT64: 8}.get(tp)
    return Column(n, n, [bitmap, bitmap if width is None else _zeros(width * n)])


def const_ints(np: Any, value: int | None, tp: str, n: int) -> Column:
    """An int32/int64 column of one value in each of ``n`` rows (None: nulls)."""
    if value is None:
        return nulls(np, tp, n)
    pattern = struct.pack("<i" if tp == INT32 else "<q", value)
    return Column(n, 0, [None, Const(pattern, len(pattern) * n)])


def ints(np: Any, values: Any, tp: str, valid: Any = None) -> Column:
    """An int32/int64 column of ``values`` (NumPy), null where ``valid`` is False."""
    dt = np.int32 if tp == INT32 else np.int64
    if valid is None:
        values = np.ascontiguousarray(values, dtype=dt)
        return Column(len(values), 0, [None, values])
    n = len(valid)
    k, bitmap = _validity(np, valid)
    if k == n and n:  # (no copy of the values)
        return nulls(np, tp, n)
    return Column(n, k, [bitmap, np.ascontiguousarray(values, dtype=dt)])


def floats(np: Any, values: Any, valid: Any) -> Column:
    values = np.ascontiguousarray(values, dtype=np.float64)
    k, bitmap = _validity(np, valid)
    return Column(len(values), k, [bitmap, values])


def bools(np: Any, values: Any, valid: Any) -> Column:
    k, bitmap = _validity(np, valid)
    n = len(valid)
    if k == n and n:
        return nulls(np, BOOL, n)
    data = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    return Column(len(valid), k, [bitmap, data])


def strings(np: Any, offsets: Any, data: Any, valid: Any = None) -> Column:
    """A utf8 column from its int32 offsets (n + 1) and UTF-8 bytes."""
    n = len(offsets) - 1
    if valid is None:
        return Column(n, 0, [None, offsets, data])
    k, bitmap = _validity(np, valid)
    return Column(n, k, [bitmap, offsets, data])


def repeat_bytes(np: Any, data: bytes, n: int) -> Column:
    """A utf8 column of one value (UTF-8 ``data``) n times."""
    if len(data) * n >= 1 << 31:
        raise ValueError("arrowipc: a string column of 2 GiB or more in one batch")
    return strings(
        np, np.arange(n + 1, dtype=np.int32) * np.int32(len(data)), Const(data, len(data) * n)
    )


def repeat(np: Any, s: str, n: int) -> Column:
    """A utf8 column of one string n times (run_id, host)."""
    return repeat_bytes(np, s.encode("utf-8", "replace"), n)


def texts(np: Any, vals: list) -> Column:
    """A utf8 column of Python values (str or None): the columns of per-call objects (args,
    dump paths, notes), the only ones looked at one by one."""
    n = len(vals)
    if vals.count(None) == n:
        return nulls(np, UTF8, n)
    v0 = vals[0]
    if type(v0) is str and vals.count(v0) == n:  # one value repeated
        return repeat(np, v0, n)
    enc = [b"" if v is None else v.encode("utf-8", "replace") for v in vals]
    data = b"".join(enc)
    if len(data) >= 1 << 31:
        raise ValueError("arrowipc: a string column of 2 GiB or more in one batch")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, enc), dtype=np.int64, count=n), out=offsets[1:])
    valid = np.fromiter((v is not None for v in vals), dtype=bool, count=n)
    return strings(np, offsets, data, valid)


def dict_indices(np: Any, ids: Any) -> Column:
    """A ``dict<utf8>`` column: the int32 indices ``ids + 1`` into the stream's dictionary
    (:class:`Batch`'s ``dictionary``, whose entry 0 is the empty string that null rows point
    to), null where an id is -1. One index in every row (an op, a status, a thread) is a
    :class:`Const`: a few bytes of LZ4 a batch instead of 4 bytes a row."""
    n = len(ids)
    if not n:
        return Column(0, 0, [None, b""])
    native = _native()
    if native is not None:  # one pass in C (the same buffers)
        got = native.dict_indices(ids)
        if got.__class__ is not int:
            k, bitmap, idx = got
            return Column(n, k, [bitmap, idx])
        lo = hi = got
    else:
        lo, hi = int(ids.min()), int(ids.max())
    if lo == hi:
        return one_index(np, lo, n)
    if hi + 1 >= 1 << 31:
        raise ValueError("arrowipc: a dictionary of 2**31 strings or more")
    idx = np.add(ids, 1, dtype=np.int32, casting="unsafe")
    if lo >= 0:
        return Column(n, 0, [None, idx])
    np.maximum(idx, 0, out=idx)  # a null row's index: 0 (the C twin's bytes)
    k, bitmap = _validity(np, ids >= 0)
    return Column(n, k, [bitmap, idx])


def one_index(np: Any, sid: int, n: int) -> Column:
    """A dict<utf8> column whose ``n`` rows are all string id ``sid`` (< 0: null)."""
    if sid + 1 >= 1 << 31:
        raise ValueError("arrowipc: a dictionary of 2**31 strings or more")
    if sid < 0:
        return nulls(np, INT32, n)
    return Column(n, 0, [None, Const(struct.pack("<i", sid + 1), 4 * n)])


def dict_take(np: Any, table: Any, idx: Any, inner: Any = None) -> Column:
    """:func:`dict_indices` of ``table[idx]`` (``table[inner[idx]]`` with ``inner``), null
    where an index is negative: the native core's one pass (dict_take), or NumPy's fancy
    indexing. ``idx`` may be a record buffer's field as it is (strided)."""
    native = _native()
    if native is not None and len(idx):
        got = native.dict_take(table, idx, inner)
        if got.__class__ is not int:
            k, bitmap, ix = got
            return Column(len(idx), k, [bitmap, ix])
        return one_index(np, got, len(idx))
    j = np.asarray(idx, dtype=np.int64)
    if inner is not None:
        j = np.where(j >= 0, np.asarray(inner, dtype=np.int64)[np.maximum(j, 0)], -1)
    ids = np.where(j >= 0, np.asarray(table, dtype=np.int64)[np.maximum(j, 0)], -1)
    return dict_indices(np, ids)


def int64_lists(np: Any, offsets: Any, values: Any) -> Column:
    """A list<int64> column (no null list) from int32 offsets (n + 1) and its values."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    child = Column(len(values), 0, [None, values])
    return Column(len(offsets) - 1, 0, [None, np.ascontiguousarray(offsets, np.int32)], child)


# ---------------------------------------------------------------------- batches
class Batch:
    """A record batch: ``n`` rows of ``columns`` in the schema ``fields`` (name, type).

    ``dictionary``: the UTF-8 strings (a list of ``bytes``, entry 0 ``b""``) that the
    batch's ``dict<utf8>`` columns index; it only grows from one batch of a stream to the
    next (:class:`StreamWriter` writes the new entries as a delta before the batch)."""

    __slots__ = ("fields", "num_rows", "columns", "dictionary")

    def __init__(
        self,
        fields: Sequence[tuple[str, str]],
        n: int,
        columns: list[Column],
        dictionary: Sequence[bytes] | None = None,
    ):
        if len(columns) != len(fields):
            raise ValueError(f"arrowipc: {len(columns)} columns for {len(fields)} fields")
        if dictionary is None and any(tp == DICT_UTF8 for _, tp in fields):
            raise ValueError("arrowipc: dict<utf8> columns without a dictionary")
        self.fields = fields
        self.num_rows = n
        self.columns = columns
        self.dictionary = dictionary


def bytes_column(np: Any, items: Sequence[bytes]) -> Column:
    """A utf8 column (no null) of UTF-8 ``bytes`` items: a dictionary's strings. The native
    core's utf8_column (one pass in C, no NumPy call), or NumPy's cumulative sum."""
    n = len(items)
    native = _native()
    if native is not None:
        _, _, offs, data = native.utf8_column(items if items.__class__ is list else list(items))
        return Column(n, 0, [None, offs, data])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise ValueError("arrowipc: a string column of 2 GiB or more in one batch")
    return Column(n, 0, [None, offsets.astype(np.int32), b"".join(items)])


#: (items, start, end, the message) of the last dictionary message made: a flush writes the
#: same new strings to each of its shards (ops, tensors, stacks), from one list of strings.
#: One tuple, replaced whole: a reader never sees the fields of two messages.
_last_dict: tuple = (None, 0, 0, None)


def dictionary_message(items: Sequence[bytes], start: int, end: int | None = None) -> list:
    """The DictionaryBatch message of the stream's dictionary entries ``items[start:end]``:
    the whole dictionary (``start`` 0), or a delta appended to what the stream has. The last
    message made is given again for the same entries of the same list (a list of strings
    only ever grows; the message's buffers are never written to)."""
    import numpy as np

    global _last_dict
    end = len(items) if end is None else end
    last = _last_dict
    if last[0] is items and last[1] == start and last[2] == end:
        return list(last[3])
    col = bytes_column(np, items[start:end])
    native = _native()
    if native is not None:
        out = native.ipc_batch_message(col.length, [col], Const, DICT_ID, start > 0)
    else:
        out = py_batch_message(Batch((("", UTF8),), col.length, [col]), DICT_ID, start > 0)
    _last_dict = (items, start, end, out)  # (holds the list: its id is not reused meanwhile)
    return list(out)


def _nbytes(buf: Any) -> int:
    if buf is None:
        return 0
    if buf.__class__ is Const:
        return buf.size  # type: ignore[no-any-return]
    return memoryview(buf).nbytes


# LZ4 frames (https://github.com/lz4/lz4/blob/dev/doc/lz4_Frame_format.md): magic; FLG 0x60
# (version 01, independent blocks, no checksums, no content size); BD 0x70 (blocks of up to
# 4 MiB); HC, the second byte of xxh32(FLG BD): a constant, as the descriptor is.
_LZ4_HEAD = b"\x04\x22\x4d\x18\x60\x70\x73"
_LZ4_BLOCK = 4 << 20
_LZ4_END = bytes(4)
#: A Const buffer shorter than this is written as its bytes: its frame would not be smaller.
CONST_MIN = 64


def _lz4_extra(n: int) -> bytes:
    """An LZ4 length's bytes after the token's 15: 255s, then the rest."""
    n -= 15
    return b"\xff" * (n // 255) + bytes((n % 255,))


def _lz4_block(pattern: bytes, size: int) -> bytes:
    """One LZ4 block (size field first) of ``size`` bytes repeating ``pattern``: the pattern
    as literals, one match at offset len(pattern) that copies it over the rest (an
    overlapping copy repeats it), and the last 5 bytes as literals (the block format's end
    rules: the last 5 bytes are literals, the last match starts 12 or more bytes before
    the end). Too short for that: the bytes, stored (the size field's high bit)."""
    p = len(pattern)
    if size < p + 12 or p > 0xFFFF:
        raw = bytes(Const(pattern, size))
        return struct.pack("<I", size | 0x80000000) + raw
    match = size - p - 5
    lit_tok, ml_tok = min(p, 15), min(match - 4, 15)
    tail = bytes(Const(pattern[(size - 5) % p :] + pattern[: (size - 5) % p], 5))
    block = b"".join((
        bytes(((lit_tok << 4) | ml_tok,)),
        _lz4_extra(p) if p >= 15 else b"",
        pattern,
        struct.pack("<H", p),
        _lz4_extra(match - 4) if match - 4 >= 15 else b"",
        b"\x50",  # the last sequence: 5 literals, no match
        tail,
    ))  # fmt: skip
    return struct.pack("<I", len(block)) + block


def lz4_periodic(pattern: bytes, size: int) -> bytes:
    """An LZ4 frame of ``size`` bytes repeating ``pattern`` (what Arrow's LZ4_FRAME codec
    reads): a block per 4 MiB, each starting where the pattern is at that byte. (The native
    core's ipc_lz4_periodic is its twin.)"""
    p = len(pattern)
    out = [_LZ4_HEAD]
    pos = 0
    while pos < size:
        k = min(_LZ4_BLOCK, size - pos)
        ph = pos % p
        out.append(_lz4_block(pattern[ph:] + pattern[:ph], k))
        pos += k
    out.append(_LZ4_END)
    return b"".join(out)


def _columns_have_const(batch: Batch) -> bool:
    todo = list(batch.columns)
    while todo:
        c = todo.pop()
        for buf in c.buffers:
            if buf.__class__ is Const and buf.size >= CONST_MIN:
                return True
        if c.child is not None:
            todo.append(c.child)
    return False


def batch_message(batch: Batch) -> list:
    """The RecordBatch message of ``batch``: its pieces (metadata, then each body buffer and
    its padding), to be written in one go (``b"".join``): the native core's
    ipc_batch_message where it runs, else :func:`py_batch_message`, the same bytes."""
    native = _native()
    if native is not None:
        return native.ipc_batch_message(batch.num_rows, list(batch.columns), Const)  # type: ignore[no-any-return]
    return py_batch_message(batch)


def py_batch_message(batch: Batch, dict_id: int | None = None, delta: bool = False) -> list:
    """:func:`batch_message` in Python; with ``dict_id``, the batch is a dictionary's values
    (a DictionaryBatch message around it; ``delta``: appended to the dictionary).

    A batch with a :class:`Const` buffer is written with Arrow's body compression (LZ4_FRAME,
    per buffer): each buffer is its uncompressed length (int64) and an LZ4 frame that
    repeats its pattern, or -1 and its bytes as they are (the format's way to leave a buffer
    uncompressed); the other buffers are the latter. A column with one value in every row
    then costs a few dozen bytes a batch instead of its bytes in every row. A buffer object
    that several columns hold is written once, and each of its Buffer entries points there:
    the format describes a buffer by offset and length only."""
    compress = _columns_have_const(batch)
    nodes: list[int] = []
    spans: list[int] = []
    body: list = []
    placed: dict[Any, tuple[int, int]] = {}  # a shared buffer's key -> its (offset, size)
    pos = 0
    todo = list(reversed(batch.columns))
    while todo:  # pre-order: a list's node and buffers, then its child's
        c = todo.pop()
        nodes += (c.length, c.null_count)
        for buf in c.buffers:
            size = _nbytes(buf)
            if not size:
                spans += (pos, 0)
                continue
            const = buf.__class__ is Const
            # the same bytes object, or the same pattern and size (the zeros of every
            # all-null column of this length): placed once
            key = (buf.pattern, size) if const else id(buf) if buf.__class__ is bytes else None
            got = placed.get(key) if key is not None else None
            if got is not None:
                spans += got
                continue
            if const:
                if compress and size >= CONST_MIN:
                    pieces = [struct.pack("<q", size), lz4_periodic(buf.pattern, size)]
                else:
                    pieces = [bytes(buf)]
            else:
                pieces = [buf]
            if compress and len(pieces) == 1:
                pieces.insert(0, _RAW)
            length = sum(map(_nbytes, pieces))
            if key is not None:
                placed[key] = (pos, length)
            spans += (pos, length)
            body += pieces
            pad = -length % 8
            if pad:
                body.append(_PAD[:pad])
            pos += length + pad
        if c.child is not None:
            todo.append(c.child)
    b = _Builder()
    bufs = b.structs(struct.pack(f"<{len(spans)}q", *spans), len(spans) // 2)
    nds = b.structs(struct.pack(f"<{len(nodes)}q", *nodes), len(nodes) // 2)
    fields = [(0, "q", batch.num_rows), (1, "off", nds), (2, "off", bufs)]
    if compress:  # BodyCompression: codec LZ4_FRAME (0), method BUFFER (0): the defaults
        fields.append((3, "off", b.table([(0, "B", 0), (1, "B", 0)])))
    rb = b.table(fields)
    if dict_id is not None:  # DictionaryBatch: id, data, isDelta
        db = b.table([(0, "q", dict_id), (1, "off", rb), (2, "?", delta)])
        return [_message(b, _HEADER_DICTIONARY_BATCH, db, pos), *body]
    return [_message(b, _HEADER_RECORD_BATCH, rb, pos), *body]


#: the length prefix of a buffer left uncompressed in a compressed body
_RAW = struct.pack("<q", -1)


class StreamWriter:
    """One stream file: the schema message, a message per batch, each written with one
    ``os.writev`` loop (a reader never sees half a batch as whole), EOS at close. The schema
    goes out with the first batch, in its writev (one write fewer per shard; a reader takes
    an empty shard for one cut short, as it takes a batch still being written), or at close
    when no batch came."""

    def __init__(self, fd: int, fields: Sequence[tuple[str, str]], metadata: dict[str, str]):
        self.fd = fd
        self.fields = tuple(fields)
        self.has_dict = DICT_UTF8 in (tp for _, tp in self.fields)
        self.dict_sent = 0  # the dictionary entries the stream has
        self._schema: bytes | None = schema_message(self.fields, metadata)  # not yet written

    def _write(self, data: bytes) -> None:
        from .safefs import write_all

        write_all(self.fd, data)

    def write_batch(self, batch: Batch) -> None:
        if tuple(batch.fields) != self.fields:
            raise ValueError("arrowipc: a batch of another schema than the stream's")
        pieces = batch_message(batch)  # the buffers as they are: no joined copy
        sent = self.dict_sent
        if self.has_dict:  # the new strings first, in the same writev
            d = batch.dictionary or ()
            sent = len(d)  # (once: the list may grow while the pieces are written)
            if sent < self.dict_sent:
                raise ValueError("arrowipc: a dictionary shorter than the stream's")
            if sent > self.dict_sent:
                pieces = dictionary_message(d, self.dict_sent, sent) + pieces
        if self._schema is not None:
            pieces = [self._schema, *pieces]
        native = _native()
        if native is not None:
            native.ipc_writev(self.fd, pieces)  # (the GIL released while it writes)
        else:
            from .safefs import write_all_v

            write_all_v(self.fd, pieces)
        self._schema = None
        self.dict_sent = sent

    def close(self) -> None:
        """The end-of-stream marker (after the schema, when no batch came), then the file
        closed."""
        if self.fd < 0:
            return
        try:
            self._write(EOS if self._schema is None else self._schema + EOS)
            self._schema = None
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close the file without ending the stream (a forked child's copy of the parent's)."""
        import os

        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


# ---------------------------------------------------------------------- pyarrow
def pa_type(pa: Any, tp: str) -> Any:
    """The pyarrow type of a column of type ``tp`` once converted (:func:`to_pyarrow`): a
    ``dict<utf8>`` column becomes plain strings."""
    return {
        UTF8: pa.string(),
        DICT_UTF8: pa.string(),
        INT32: pa.int32(),
        INT64: pa.int64(),
        FLOAT64: pa.float64(),
        BOOL: pa.bool_(),
        LIST_INT64: pa.list_(pa.int64()),
    }[tp]


def pa_schema(
    pa: Any, fields: Sequence[tuple[str, str]], metadata: dict[str, str] | None = None
) -> Any:
    return pa.schema([(name, pa_type(pa, tp)) for name, tp in fields], metadata=metadata)


def _pa_array(pa: Any, tp: Any, c: Column) -> Any:
    bufs = [
        None if b is None else pa.py_buffer(bytes(b) if b.__class__ is Const else b)
        for b in c.buffers
    ]
    children = None if c.child is None else [_pa_array(pa, tp.value_type, c.child)]
    return pa.Array.from_buffers(tp, c.length, bufs, null_count=c.null_count, children=children)


def to_pyarrow(batch: Batch, metadata: dict[str, str] | None = None) -> Any:
    """The batch as a ``pyarrow.RecordBatch`` made from the same buffers (no copy), its
    ``dict<utf8>`` columns as plain strings taken from the batch's dictionary."""
    import pyarrow as pa

    sch = pa_schema(pa, batch.fields, metadata)
    arrays = []
    items: Any = None
    for (_, tp), f, c in zip(batch.fields, sch, batch.columns):
        if tp == DICT_UTF8:
            if items is None:  # (once a batch)
                items = _Items(batch.dictionary or [b""])
            c = _decoded(c, items)
        arrays.append(_pa_array(pa, f.type, c))
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


class _Items:
    """A batch's dictionary for :func:`_decoded`: its strings as a list, and their lengths
    (made once a batch, not once a column)."""

    def __init__(self, items: Sequence[bytes]) -> None:
        import numpy as np

        self.list = list(items)
        self.lens = np.fromiter(map(len, self.list), dtype=np.int64, count=len(self.list))


def _decoded(c: Column, items: _Items) -> Column:
    """A ``dict<utf8>`` column as a plain utf8 column of the same rows (NumPy and
    ``bytes.join``: no pyarrow compute kernel, which may be loaded at the program's exit)."""
    import numpy as np

    bitmap, idx = c.buffers
    idx = np.frombuffer(bytes(idx) if idx.__class__ is Const else idx, dtype=np.int32)
    native = _native()
    if native is not None:  # the rows' strings joined in C (ids: idx - 1, null below 0)
        k, bitmap, offsets, data = native.utf8_column(items.list, idx - np.int32(1))
        return Column(c.length, k, [bitmap, offsets, data])
    offsets, data = taken(np, items.list, items.lens, idx)
    return Column(c.length, c.null_count, [bitmap, offsets, data])


def taken(np: Any, items: Sequence[bytes], lens: Any, idx: Any) -> tuple[Any, bytes]:
    """The int32 offsets and the bytes of a utf8 column whose row k is ``items[idx[k]]``
    (``lens``: the items' lengths, an int64 array; entry 0 is b"", what null rows take):
    NumPy and ``bytes.join``, C loops over the rows (the twin of the native utf8_column)."""
    offsets = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens[idx], out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise ValueError("arrowipc: a string column of 2 GiB or more in one batch")
    return offsets.astype(np.int32), b"".join(list(map(items.__getitem__, idx.tolist())))
