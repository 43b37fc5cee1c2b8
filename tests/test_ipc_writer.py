"""The log written by pprobe's own Arrow IPC encoder (pprobe.arrowipc), without pyarrow.

Unit layer: the encoder's messages decoded by pyarrow (every type, nulls, empty strings,
non-ASCII, empty lists, 0-row and big batches, streams cut short at every byte) and the two
schema descriptions (pprobe.logschema, pprobe.schema) compared. End-to-end: the same programs
run through the bootstrap with PPROBE_LOG_WRITER=pprobe and =pyarrow give the same tables.
"""

from __future__ import annotations

import errno
import io
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import BOOTSTRAP, clean_env, meta, ops, run_script, sql

from pprobe import arrowipc as A
from pprobe import logschema, schema

META = {"pprobe.schema_version": logschema.SCHEMA_VERSION, "run_id": "r1", "pid": "7",
        "host": "h\u00e9"}  # fmt: skip


# ---------------------------------------------------------------------- helpers
def _texts_and_values(rng: random.Random, n: int) -> list:
    pool = ["", "a", "ok", "h\u00e9llo", "\u65e5\u672c\u8a9e", "x" * 300, "\U0001f600 emoji",
            "nul\x00inside", None]  # fmt: skip
    return [rng.choice(pool) for _ in range(n)]


#: The dictionary of the test batches' dict<utf8> columns: entry 0 is b"" (null rows).
_POOL = ["", "a", "ok", "h\u00e9llo", "\u65e5\u672c\u8a9e", "x" * 300, "\U0001f600 emoji",
         "nul\x00inside"]  # fmt: skip
_DICT = [b"", *(t.encode() for t in _POOL)]


def _column(rng: random.Random, tp: str, n: int, k: int = len(_POOL)) -> tuple[A.Column, pa.Array]:
    """A column made with arrowipc's constructors and the same values as a pyarrow array
    built from Python objects (an independent reference); dict<utf8> ids are below ``k``."""
    valid = np.array([rng.random() < 0.7 for _ in range(n)], dtype=bool)
    if tp == A.DICT_UTF8:  # string ids (-1: null) into _POOL
        ids = [rng.randint(-1, k - 1) for _ in range(n)]
        ref = [None if i < 0 else _POOL[i] for i in ids]
        return A.dict_indices(np, np.array(ids, dtype=np.int64)), pa.array(ref, pa.string())
    if tp == A.UTF8:
        vals = _texts_and_values(rng, n)
        return A.texts(np, vals), pa.array(vals, pa.string())
    if tp in (A.INT32, A.INT64):
        v = np.array([rng.randint(-(2**31), 2**31 - 1) for _ in range(n)], dtype=np.int64)
        ref = [int(x) if ok else None for x, ok in zip(v, valid)]
        return A.ints(np, v, tp, valid), pa.array(ref, A.pa_type(pa, tp))
    if tp == A.FLOAT64:
        v = np.array([rng.uniform(-1e300, 1e300) for _ in range(n)])
        ref = [float(x) if ok else None for x, ok in zip(v, valid)]
        return A.floats(np, v, valid), pa.array(ref, pa.float64())
    if tp == A.BOOL:
        v = np.array([rng.random() < 0.5 for _ in range(n)], dtype=bool)
        ref = [bool(x) if ok else None for x, ok in zip(v, valid)]
        return A.bools(np, v, valid), pa.array(ref, pa.bool_())
    lists = [[rng.randint(-5, 2**40) for _ in range(rng.choice((0, 0, 1, 2, 4, 9)))]
             for _ in range(n)]  # fmt: skip
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = np.array([x for xs in lists for x in xs], dtype=np.int64)
    return A.int64_lists(np, offsets, flat), pa.array(lists, pa.list_(pa.int64()))


def _batch(
    rng: random.Random, fields: tuple, n: int, k: int = len(_POOL)
) -> tuple[A.Batch, pa.RecordBatch]:
    """A batch and its reference; its dictionary is the first ``k`` strings of _POOL."""
    made = [_column(rng, tp, n, k) for _, tp in fields]
    ref = pa.RecordBatch.from_arrays([r for _, r in made], schema=A.pa_schema(pa, fields))
    return A.Batch(fields, n, [c for c, _ in made], _DICT[: k + 1]), ref


def _message_pairs(fields: tuple, batches: list[A.Batch]) -> list[tuple[bytes, bytes]]:
    """Each batch's bytes as A.StreamWriter writes them: the dictionary's new entries (a
    DictionaryBatch message, b"" when there are none), then the batch."""
    sent, out = 0, []
    for b in batches:
        msg = b""
        if A.DICT_UTF8 in (tp for _, tp in fields) and len(b.dictionary or ()) > sent:
            msg = b"".join(A.dictionary_message(b.dictionary, sent))
            sent = len(b.dictionary)
        out.append((msg, b"".join(A.batch_message(b))))
    return out


def _messages(fields: tuple, batches: list[A.Batch]) -> list[bytes]:
    return [d + m for d, m in _message_pairs(fields, batches)]


def _stream(fields: tuple, batches: list[A.Batch], eos: bool = True) -> bytes:
    out = A.schema_message(fields, META) + b"".join(_messages(fields, batches))
    return out + (A.EOS if eos else b"")


def _plain_schema(sch: pa.Schema) -> pa.Schema:
    """The schema with its dictionary-encoded strings as plain strings (what readers see)."""
    return pa.schema(
        [pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
         for f in sch],
        metadata=sch.metadata,
    )  # fmt: skip


def _plain(b: pa.RecordBatch) -> pa.RecordBatch:
    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in b.columns]
    return pa.RecordBatch.from_arrays(cols, schema=_plain_schema(b.schema))


def _read(data: bytes) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """The stream's schema and batches, validated, dictionary columns decoded."""
    r = pa.ipc.open_stream(io.BytesIO(data))
    got = list(r)
    for b in got:
        b.validate(full=True)
    return _plain_schema(r.schema), [_plain(b) for b in got]


# ---------------------------------------------------------------------- unit
@pytest.mark.parametrize("table", sorted(logschema.TABLES))
def test_both_schema_descriptions_agree(table: str) -> None:
    assert A.pa_schema(pa, logschema.TABLES[table]) == schema.TABLES[table]
    assert [f.nullable for f in schema.TABLES[table]] == [True] * len(schema.TABLES[table])
    assert schema.SCHEMA_VERSION == logschema.SCHEMA_VERSION


@pytest.mark.parametrize("table", sorted(logschema.TABLES))
def test_schema_message_decodes_with_metadata(table: str) -> None:
    fields = logschema.TABLES[table]
    sch, batches = _read(A.schema_message(fields, META) + A.EOS)
    assert batches == []
    assert sch.remove_metadata() == schema.TABLES[table]
    assert sch.metadata == {k.encode(): v.encode() for k, v in META.items()}
    assert list(sch.metadata) == [k.encode() for k in META]  # order kept


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_batches_of_every_type_decode_to_the_same_values(n: int) -> None:
    rng = random.Random(n)
    fields = tuple((f"{tp}_{i}", tp) for i, tp in enumerate(A.TYPES * 2))
    ours, refs = zip(*(_batch(rng, fields, n) for _ in range(3)))
    sch, got = _read(_stream(fields, list(ours)))
    assert sch.remove_metadata() == A.pa_schema(pa, fields)
    assert len(got) == 3
    for g, ref in zip(got, refs):
        assert g.to_pylist() == ref.to_pylist()
        assert g.equals(ref)
    for b, ref in zip(ours, refs):  # the pyarrow twin of the same buffers
        pb = A.to_pyarrow(b, META)
        pb.validate(full=True)
        assert pb.equals(ref) and pb.schema.metadata == sch.metadata


def test_all_null_and_constant_columns() -> None:
    n = 13
    fields = tuple((tp, tp) for tp in A.TYPES)
    cols = [A.nulls(np, tp, n) for tp in A.TYPES]
    _, (got,) = _read(_stream(fields, [A.Batch(fields, n, cols, _DICT)]))
    assert all(c.null_count == n for c in got.columns)
    assert got.column(0).to_pylist() == [None] * n
    one = (("s", A.UTF8),)
    _, (got,) = _read(_stream(one, [A.Batch(one, 3, [A.texts(np, ["\u00e9"] * 3)])]))
    assert got.column(0).to_pylist() == ["\u00e9"] * 3
    none = A.ints(np, np.zeros(4), A.INT64, np.zeros(4, dtype=bool))
    _, (got,) = _read(_stream((("i", A.INT64),), [A.Batch((("i", A.INT64),), 4, [none])]))
    assert got.column(0).to_pylist() == [None] * 4


@pytest.mark.parametrize(
    "pattern",
    [
        b"\0",
        b"\xff",
        b"ok",
        b"20261205-015818-527",
        bytes(range(256)) * 3,
        b"x" * 70_000,
    ],  # fmt: skip
)
def test_lz4_frames_of_a_pattern_decode_to_the_pattern_repeated(pattern: bytes) -> None:
    p = len(pattern)
    # around the block format's end rules (p + 12), the 4 MiB block size, and several blocks
    sizes = {1, 5, 11, 12, 13, p, p + 1, p + 11, p + 12, p + 13, p + 300, 1000, 65_536,
             (4 << 20) - 1, 4 << 20, (4 << 20) + 7, 9_000_001}  # fmt: skip
    for size in sorted(sizes):
        frame = A.lz4_periodic(pattern, size)
        got = pa.decompress(frame, decompressed_size=size, codec="lz4").to_pybytes()
        want = (pattern * (size // p + 1))[:size]
        assert got == want == bytes(A.Const(pattern, size)), size
        if p <= 0xFFFF and size >= p + 12:  # the pattern, then a byte per 255 of its copies
            blocks = size // (4 << 20) + 1
            assert len(frame) <= 11 + blocks * (p + p // 255 + 30) + size // 255, size


def test_constant_columns_are_compressed_and_read_back_by_every_reader() -> None:
    """A batch with a column of one value (Const buffers: run_id, pid, all-null columns)
    is written with LZ4_FRAME body compression: those buffers as tiny frames, the others
    left as they are (length -1). pyarrow reads it (stream and message by message, as the
    query cache does), and so does DuckDB through it."""
    n = 50_000
    run_id = "20261205-015818-527 \u00e9"
    fields = (("run_id", A.UTF8), ("pid", A.INT64), ("rank", A.INT32), ("seq", A.INT64),
              ("min", A.FLOAT64), ("path", A.UTF8), ("shape", A.LIST_INT64),
              ("grad", A.BOOL), ("op", A.UTF8))  # fmt: skip
    ops = [f"op{i % 7}" for i in range(n)]
    cols = [A.repeat(np, run_id, n), A.const_ints(np, 527, A.INT64, n),
            A.const_ints(np, None, A.INT32, n), A.ints(np, np.arange(n), A.INT64),
            A.nulls(np, A.FLOAT64, n), A.nulls(np, A.UTF8, n), A.nulls(np, A.LIST_INT64, n),
            A.nulls(np, A.BOOL, n), A.texts(np, ops)]  # fmt: skip
    batch = A.Batch(fields, n, cols)
    data = _stream(fields, [batch, batch])
    sch, got = _read(data)
    want = {"run_id": [run_id] * n, "pid": [527] * n, "rank": [None] * n,
            "seq": list(range(n)), "min": [None] * n, "path": [None] * n,
            "shape": [None] * n, "grad": [None] * n, "op": ops}  # fmt: skip
    for b in got:
        assert b.to_pydict() == want
    # the constant columns cost a few bytes each: seq (8 B a row), run_id's offsets (4) and
    # the op column (its offsets and bytes) are what is left
    raw = sum(len(f"op{i % 7}") for i in range(n))
    assert len(data) < 2 * (n * (8 + 4 + 4 + 1) + raw + 4096)
    # message by message, as pprobe.query's cache reads a shard's byte ranges
    r = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    s = pa.ipc.read_schema(r.read_next_message())
    b = pa.ipc.read_record_batch(r.read_next_message(), s)
    assert b.to_pydict() == want
    duckdb = pytest.importorskip("duckdb")
    tbl = pa.Table.from_batches(got, sch)  # noqa: F841 (DuckDB's replacement scan)
    row = duckdb.sql("select count(*), min(pid), max(seq), count(min), any_value(run_id) "
                     "from tbl").fetchall()  # fmt: skip
    assert row == [(2 * n, 527, n - 1, 0, run_id)]
    # the same batch through pyarrow's own arrays (the collector's tap)
    assert A.to_pyarrow(batch).to_pydict() == want


def test_a_batch_without_constant_columns_is_not_compressed() -> None:
    fields = (("seq", A.INT64),)
    msg = b"".join(A.batch_message(A.Batch(fields, 3, [A.ints(np, np.arange(3), A.INT64)])))
    m = pa.ipc.read_message(pa.BufferReader(msg))
    assert m.body.size == 24  # three int64, no length prefix
    small = A.Batch(fields, 3, [A.const_ints(np, 5, A.INT64, 3)])  # 24 bytes: as they are
    m = pa.ipc.read_message(pa.BufferReader(b"".join(A.batch_message(small))))
    assert m.body.size == 24
    _, (got,) = _read(_stream(fields, [small]))
    assert got.column(0).to_pylist() == [5, 5, 5]


def test_big_batch() -> None:
    n = 300_000
    rng = np.random.default_rng(0)
    v = rng.integers(-(2**62), 2**62, n)
    valid = rng.random(n) < 0.5
    s = [None if i % 3 == 0 else f"row {i} \u00e9" for i in range(n)]
    fields = (("i", A.INT64), ("s", A.UTF8), ("f", A.FLOAT64))
    cols = [A.ints(np, v, A.INT64, valid), A.texts(np, s), A.floats(np, v / 3.0, valid)]
    _, (got,) = _read(_stream(fields, [A.Batch(fields, n, cols)]))
    assert got.num_rows == n
    i = got.column(0).to_numpy(zero_copy_only=False)
    assert np.array_equal(got.column(0).is_valid().to_numpy(zero_copy_only=False), valid)
    assert np.array_equal(i[valid], v[valid])
    assert got.column(1).to_pylist() == s


def test_messages_are_8_byte_aligned() -> None:
    rng = random.Random(3)
    fields = tuple((f"c{i}", tp) for i, tp in enumerate(A.TYPES))
    data = A.schema_message(fields, META)
    assert len(data) % 8 == 0 and data[:4] == A.CONTINUATION
    for n in (0, 1, 5, 17):
        b, _ = _batch(rng, fields, n)
        msg = b"".join(A.batch_message(b))
        assert len(msg) % 8 == 0 and msg[:4] == A.CONTINUATION
        meta_len = int.from_bytes(msg[4:8], "little")
        assert meta_len % 8 == 0


def test_a_stream_cut_anywhere_reads_up_to_its_last_complete_batch(tmp_path: Path) -> None:
    """What a writer killed mid-write leaves (no EOS): pprobe.query reads every complete
    batch, and calls the rest cut short, not damage."""
    from pprobe.query import DamagedShardWarning, read_shard

    rng = random.Random(5)
    fields = logschema.OPS
    # the dictionary grows: its whole before the first batch, deltas before the others
    ours = [_batch(rng, fields, n, k) for n, k in ((3, 2), (0, 5), (40, len(_POOL)))]
    head = A.schema_message(fields, META)
    pairs = _message_pairs(fields, [b for b, _ in ours])
    assert all(d for d, _ in pairs[:1] + pairs[2:])
    ends = [len(head)]  # where each batch ends
    bounds = set()  # where a dictionary message ends (a message boundary too)
    for d, m in pairs:
        bounds.add(ends[-1] + len(d))
        ends.append(ends[-1] + len(d) + len(m))
    whole = head + b"".join(d + m for d, m in pairs)
    path = tmp_path / "ops-h-7.arrows"
    near = {e + d for e in {*ends, *bounds} for d in (-9, -8, -5, -4, -1, 1, 3, 4, 8)}
    cuts = sorted(
        {*range(0, 16), *range(0, len(whole), 53), *ends, *near} & {*range(len(whole) + 1)}
    )
    for cut in cuts:
        path.write_bytes(whole[:cut])
        with warnings.catch_warnings():
            warnings.simplefilter("error", DamagedShardWarning)
            got, early = read_shard(str(path), schema.OPS)
        complete = sum(1 for e in ends[1:] if e <= cut)
        assert len(got) == complete, cut
        for g, (_, ref) in zip(got, ours):
            assert g.to_pylist() == ref.to_pylist()
        assert early or cut in ends or cut in bounds  # mid-message (a boundary: a plain end)
    path.write_bytes(whole + A.EOS)
    got, early = read_shard(str(path), schema.OPS)
    assert len(got) == 3 and not early


def test_stream_writer_writes_eos_at_close_only(tmp_path: Path) -> None:
    import os

    rng = random.Random(9)
    path = tmp_path / "s.arrows"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    w = A.StreamWriter(fd, logschema.STACKS, META)
    b, ref = _batch(rng, logschema.STACKS, 4)
    w.write_batch(b)
    assert not path.read_bytes().endswith(A.EOS)
    with pytest.raises(ValueError):
        w.write_batch(_batch(rng, logschema.OPS, 1)[0])
    with pytest.raises(ValueError, match="shorter"):  # the stream's dictionary only grows
        w.write_batch(A.Batch(b.fields, b.num_rows, b.columns, _DICT[:1]))
    w.close()
    w.close()  # idempotent
    data = path.read_bytes()
    assert data.endswith(A.EOS)
    _, (got,) = _read(data)
    assert got.to_pylist() == ref.to_pylist()


def test_stream_writer_sends_the_schema_with_the_first_batch(tmp_path: Path) -> None:
    """The schema goes out in the first batch's writev: before it the shard is empty (a
    reader's "cut short", not damage); a stream closed with no batch is schema and EOS."""
    import os

    from pprobe.query import read_shard

    rng = random.Random(11)
    path = tmp_path / "s.arrows"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    w = A.StreamWriter(fd, logschema.STACKS, META)
    assert path.read_bytes() == b""
    got, early = read_shard(str(path), schema.STACKS)
    assert got == [] and early
    b, ref = _batch(rng, logschema.STACKS, 3)
    w.write_batch(b)
    data = path.read_bytes()
    assert data.startswith(A.schema_message(logschema.STACKS, META))
    got, early = read_shard(str(path), schema.STACKS)
    assert len(got) == 1 and got[0].to_pylist() == ref.to_pylist()  # (no EOS yet)
    w.write_batch(b)
    assert path.read_bytes().count(A.schema_message(logschema.STACKS, META)) == 1
    w.close()

    empty = tmp_path / "e.arrows"
    w = A.StreamWriter(os.open(empty, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                       logschema.STACKS, META)  # fmt: skip
    w.close()
    assert empty.read_bytes() == A.schema_message(logschema.STACKS, META) + A.EOS
    got, early = read_shard(str(empty), schema.STACKS)
    assert got == [] and not early


# ---------------------------------------------------------------------- end to end
# A program with odd values: a non-ASCII file and function name, 0-d arrays (empty shapes),
# NaN and inf (statistics nulls in stats mode), args, a named thread, nested calls (parent),
# ops with no array (0-row tensors batches), and more rows than a batch holds.
PROG = """
import sys, threading
import numpy as np


def f\u00fcnf(a):
    return np.add(a, 1.5)


a = np.arange(12.0).reshape(3, 4)
a[0, 1] = np.nan
a[1, 2] = np.inf
for i in range(40):
    f\u00fcnf(a)
    a.sum(axis=1)
    np.add(np.float64(2.0), np.array(3.0))  # 0-d arrays: empty shapes
    np.zeros(())
    np.concatenate([a, a], axis=0)
    np.transpose(np.ones((1, 2, 3, 4, 5, 6, 7, 8, 9)))  # past the inline dimensions
np.isnan(a)
np.random.seed(0)  # no array in, none out
t = threading.Thread(target=lambda: [np.multiply(a, 2) for _ in range(5)], name="t\u00e9")
t.start(); t.join()
for _ in range(N_BIG):
    np.negative(a)
from pprobe.session import Session
Session.active.stop()  # every row written: the log side is done
print("PYARROW", "pyarrow" in sys.modules)
"""

SKIP = {"ts_ns", "dur_ns", "run_id", "pid"}  # per process


def _prog(n_big: int) -> str:
    return PROG.replace("N_BIG", str(n_big))


def _rows_sql(run_dir: Path, table: str) -> list[dict]:
    order = {"ops": "seq", "tensors": "seq, role, idx", "stacks": "stack_id, level"}[table]
    rows = sql(run_dir, f"SELECT * FROM {table} ORDER BY {order}")
    return [{k: v for k, v in r.items() if k not in SKIP} for r in rows]


def _rows_ipc(run_dir: Path, table: str) -> tuple[list[dict], dict]:
    """Every row of the run's shards of ``table`` read by pyarrow.ipc.open_stream alone (no
    pprobe code), sorted as _rows_sql sorts, and the shards' schema metadata."""
    rows: list[dict] = []
    meta: dict = {}
    for path in sorted((run_dir / "log").glob(f"{table}-*.arrows")):
        with pa.ipc.open_stream(pa.OSFile(str(path))) as r:
            meta = {k.decode(): v.decode() for k, v in (r.schema.metadata or {}).items()}
            assert _plain_schema(r.schema).remove_metadata() == schema.TABLES[table]
            dict_fields = [f.name for f in r.schema if pa.types.is_dictionary(f.type)]
            # pprobe's writer: the fields logschema says; pyarrow's: none
            assert dict_fields in (
                [],
                [n for n, tp in logschema.TABLES[table] if tp == A.DICT_UTF8],
            )
            for b in r:
                b.validate(full=True)
                rows += b.to_pylist()
    key = {
        "ops": lambda r: (r["seq"],),
        "tensors": lambda r: (r["seq"], r["role"], r["idx"]),
        "stacks": lambda r: (r["stack_id"], r["level"]),
    }[table]
    rows.sort(key=key)
    return [{k: v for k, v in r.items() if k not in SKIP} for r in rows], meta


def _run(tmp_path: Path, name: str, writer: str, mode: str, n_big: int = 0, **env: str):
    # the same script file for both writers (its path is in the caller column)
    env = {"PPROBE_MODE": mode, "PPROBE_LOG_WRITER": writer, **env}
    r = run_script(tmp_path, _prog(n_big), name="pr\u00f6g.py", output=tmp_path / name, env=env)
    r.check()
    return r, r.run_dir, meta(r.run_dir)


@pytest.mark.parametrize("mode", ["log", "stats"])
def test_both_writers_write_the_same_tables(tmp_path: Path, mode: str) -> None:
    n_big = 17000 if mode == "log" else 0  # past PPROBE_FLUSH_ROWS (16384): a big batch
    r1, d1, m1 = _run(tmp_path, "own", "pprobe", mode, n_big)
    r2, d2, m2 = _run(tmp_path, "pa", "pyarrow", mode, n_big)
    assert (m1["core"]["log_writer"], m2["core"]["log_writer"]) == ("pprobe", "pyarrow")
    for path in (d1 / "log").glob("*.arrows"):  # pprobe's shards: dictionary-encoded names
        with pa.ipc.open_stream(pa.OSFile(str(path))) as r:
            name = "role" if path.name.startswith("tensors") else "caller"
            assert pa.types.is_dictionary(r.schema.field(name).type)
    assert m1["core"]["engine"] == m2["core"]["engine"]
    assert "PYARROW False" in r1.out
    for table in ("ops", "tensors", "stacks"):
        own, meta1 = _rows_ipc(d1, table)
        theirs, meta2 = _rows_ipc(d2, table)
        assert own == theirs, table
        assert _rows_sql(d1, table) == _rows_sql(d2, table) == own, table
        for m, mt in ((m1, meta1), (m2, meta2)):
            want = {"run_id": m["run_id"], "pid": str(m["pid"]), "host": m["host"]}
            assert mt == {"pprobe.schema_version": logschema.SCHEMA_VERSION, **want}
    ops_rows, _ = _rows_ipc(d1, "ops")
    assert len(ops_rows) > n_big
    # independent checks of values the program made
    assert {r["thread"] for r in ops_rows} == {"MainThread", "t\u00e9"}
    assert any(r["caller_function"] == "f\u00fcnf" for r in ops_rows)
    assert all(r["caller"].startswith(str(tmp_path / "pr\u00f6g.py:"))
               for r in ops_rows if r["caller"] is not None)  # fmt: skip
    shapes = [r["shape"] for r in _rows_ipc(d1, "tensors")[0]]
    assert [] in shapes and [9, 8, 7, 6, 5, 4, 3, 2, 1] in shapes
    seqs = [r["seq"] for r in ops_rows]
    assert seqs == list(range(len(seqs)))
    if mode == "stats":
        t = [r for r in _rows_ipc(d1, "tensors")[0] if r["shape"] == [3, 4]]
        assert any(r["nan_count"] == 1 and r["inf_count"] == 1 for r in t)


def test_pyarrow_is_not_imported_to_write_the_log(tmp_path: Path) -> None:
    """log and stats modes, NumPy and torch programs, the default writer (auto): the probed
    process never imports pyarrow (checked in the program after the probe stopped)."""
    torch_prog = """
        import sys
        import torch
        x = torch.ones(4, 3, requires_grad=True)
        for _ in range(20):
            y = (x * 2 + 1).sum()
            y.backward()
        from pprobe.session import Session
        Session.active.stop()
        print("PYARROW", "pyarrow" in sys.modules)
        """
    for i, mode in enumerate(("log", "stats")):
        for j, prog in enumerate((_prog(0), torch_prog)):
            r = run_script(tmp_path / f"{i}{j}", prog, env={"PPROBE_MODE": mode}).check()
            assert "PYARROW False" in r.out, (mode, j, r.err)
            m = meta(r.run_dir)
            assert m["core"]["log_writer"] == "pprobe" and m["core"]["log_writer_reason"] == "auto"
            assert m["rows_written"] > 0 and not m["errors"]
            assert len(ops(r.run_dir)) == m["rows_written"]


def test_a_writer_killed_leaves_every_complete_batch_readable(tmp_path: Path) -> None:
    """kill -9 while the program runs and the writer flushes every 10 ms: no EOS in the
    shards, every complete batch read, no damage reported, the ops rows read are seq 0..N-1
    with their tensor rows."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pprobe.query import DamagedShardWarning

    prog = tmp_path / "loop.py"
    prog.write_text(
        "import numpy as np\na = np.ones(5)\nwhile True:\n    np.add(a, 1)\n    a.sum()\n"
    )
    out = tmp_path / "out"
    env = clean_env(PYTHONPATH=str(BOOTSTRAP), PPROBE_OUTPUT=str(out), PPROBE_MODE="log",
                    PPROBE_FLUSH_SECONDS="0.01")  # fmt: skip
    p = subprocess.Popen([sys.executable, str(prog)], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shards = list(out.glob("*/log/ops-*.arrows"))
            if shards and shards[0].stat().st_size > 200_000:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the log did not grow")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    run_dir = shards[0].parent.parent
    for path in (run_dir / "log").glob("*.arrows"):
        assert not path.read_bytes().endswith(A.EOS), path
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedShardWarning)
        rows = sql(run_dir, "SELECT seq FROM ops ORDER BY seq")
        missing = sql(run_dir, "SELECT count(*) AS n FROM ops o WHERE NOT EXISTS "
                      "(SELECT 1 FROM tensors t WHERE t.seq = o.seq)")  # fmt: skip
    seqs = [r["seq"] for r in rows]
    assert len(seqs) > 100 and seqs == list(range(len(seqs)))
    assert missing == [{"n": 0}]
    # pyarrow alone reads the same batches, up to the cut
    got, _ = _read_until_cut(next((run_dir / "log").glob("ops-*.arrows")))
    assert got == len(seqs)


def _read_until_cut(path: Path) -> tuple[int, bool]:
    rows = 0
    with pa.ipc.open_stream(pa.OSFile(str(path))) as r:
        while True:
            try:
                b = r.read_next_batch()
            except StopIteration:
                return rows, False
            except (OSError, pa.ArrowInvalid):
                return rows, True
            b.validate(full=True)
            rows += b.num_rows


def test_meta_says_which_writer_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    prog = "import numpy as np\nnp.add(np.ones(2), 1)\n"
    r = run_script(tmp_path / "a", prog, env={"PPROBE_MODE": "log",
                                              "PPROBE_LOG_WRITER": "pyarrow"}).check()  # fmt: skip
    core = meta(r.run_dir)["core"]
    assert core["log_writer"] == "pyarrow"
    assert core["log_writer_reason"] == "PPROBE_LOG_WRITER=pyarrow"
    assert core["engine"] in ("native", "python")
    assert list((r.run_dir / "log").glob("ops-*.arrows"))
    r = run_script(tmp_path / "b", prog, env={"PPROBE_LOG_WRITER": "arrow", "PPROBE_STRICT": "1"})
    assert r.rc != 0
    assert "PPROBE_LOG_WRITER='arrow' is not valid; allowed: auto, pprobe, pyarrow" in r.err


def test_all_null_columns_share_one_region_of_the_body() -> None:
    n = 1000
    fields = tuple((f"c{i}", A.FLOAT64) for i in range(8))
    cols = [A.nulls(np, A.FLOAT64, n) for _ in fields]
    msg = b"".join(A.batch_message(A.Batch(fields, n, cols)))
    assert len(msg) < 2 * 8 * n  # one zeroed region of 8n bytes, not eight
    _, (got,) = _read(_stream(fields, [A.Batch(fields, n, cols, _DICT)]))
    assert all(c.null_count == n for c in got.columns)


@pytest.mark.parametrize("engine", ["native", "python"])
def test_ops_are_named_only_when_a_batch_has_them(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer._op_table names the ops a batch's records point to, and no other: the native
    core's missing_ids over the records, or its NumPy twin."""
    from pprobe import recorder, records
    from pprobe.writer import Writer

    _use_engine(engine, monkeypatch)
    while len(recorder.ops_by_index) < 12:
        recorder.op(f"test.named{len(recorder.ops_by_index)}", "function", "numpy")
    op_dt, _ = records.numpy_dtypes()

    def heads(ops: list) -> tuple[bytes, np.ndarray]:
        recs = np.zeros(len(ops), dtype=op_dt)
        recs["op"] = ops
        return recs.tobytes(), recs

    w = Writer(str(tmp_path), "run1", "host", 100, 1.0)
    t = w._op_table(np, *heads([3, 7, 3]))
    named = np.flatnonzero(np.asarray(t[0]) != -2)
    assert named.tolist() == [3, 7]
    assert [records.strings[t[1][i]] for i in (3, 7)] == [
        recorder.ops_by_index[3].name,
        recorder.ops_by_index[7].name,
    ]
    assert records.strings[t[2][3]] == "function" and records.strings[t[0][7]] == "numpy"
    t = w._op_table(np, *heads([9, 3, -1]))  # (a negative index names nothing)
    assert np.flatnonzero(np.asarray(t[0]) != -2).tolist() == [3, 7, 9]
    t = w._op_table(np, *heads([]))
    assert np.flatnonzero(np.asarray(t[0]) != -2).tolist() == [3, 7, 9]


def test_a_few_new_stacks_walked_one_by_one_give_the_same_rows_as_the_bulk_walk() -> None:
    """writer._stack_rows_few (a few new stacks, chain by chain) against _stack_rows (every
    chain at once): the same (stack, level, site) rows, whatever the links, a cycle and links
    out of range included."""
    from array import array

    from pprobe.writer import _stack_rows, _stack_rows_few

    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(0, 12))
        inner = array("q", rng.integers(-2, n + 2, size=n).tolist())
        if trial % 3 == 0:  # interned stacks point to earlier ones only, as the recorder's do
            inner = array("q", [int(rng.integers(-1, i)) if i else -1 for i in range(n)])
        outer = array("q", rng.integers(-1, 50, size=n).tolist())
        k = int(rng.integers(0, n + 1))
        bulk = _stack_rows(np, inner, outer, k, n)
        few = _stack_rows_few(np, inner, outer, k, n)
        for a, b in zip(bulk, few):
            assert a.dtype == b.dtype == np.int64
            assert a.tolist() == b.tolist(), (inner, outer, k)
    chain = _stack_rows_few(np, array("q", [-1, 0, 1]), array("q", [10, 11, 12]), 2, 3)
    assert [c.tolist() for c in chain] == [[2, 2, 2], [0, 1, 2], [10, 11, 12]]


# ---------------------------------------------------------------------- the native twins
def _native_mod():  # type: ignore[no-untyped-def]
    """pprobe._native where it is built and loads (whatever PPROBE_CORE says: these tests
    compare its ipc_* functions with their Python twins directly)."""
    try:
        from pprobe import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "ipc_batch_message") else None


needs_native = pytest.mark.skipif(_native_mod() is None, reason="the native core is not built")


def _use_engine(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pprobe.core.native for this test: the native core ("native"; skipped where it is not
    built) or None (the NumPy twins)."""
    from pprobe import core

    if engine == "native" and _native_mod() is None:
        pytest.skip("the native core is not built")
    monkeypatch.setattr(core, "native", _native_mod() if engine == "native" else None)


def _joined(pieces: list) -> bytes:
    return b"".join(memoryview(p).cast("B").tobytes() for p in pieces)


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_native_batch_messages_are_the_python_encoders_bytes(seed: int) -> None:
    """ipc_batch_message writes the same bytes as py_batch_message: every type with nulls,
    constant columns (compressed or not: a batch with one Const of 64 bytes or more compresses
    every buffer), buffers that several columns share, list columns, 0-row batches."""
    nat = _native_mod()
    rng = random.Random(seed)
    n = rng.choice((0, 1, 3, 17, 200))
    shared = b"shared bytes"
    cols, fields = [], []
    for j in range(rng.randint(1, 14)):
        kind = rng.choice(("typed", "typed", "const", "nulls", "shared"))
        if kind == "typed":
            tp = rng.choice(A.TYPES)
            col, _ = _column(rng, tp, n)
        elif kind == "const":
            tp = A.UTF8
            col = A.repeat(np, rng.choice(("cpu", "h\u00e9", "x" * rng.randint(1, 40))), n)
        elif kind == "nulls":
            tp = rng.choice(A.TYPES[:5])
            col = A.nulls(np, tp, n)
        else:
            tp = A.UTF8
            col = A.Column(n, 0, [None, np.zeros(n + 1, dtype=np.int32), shared])
        cols.append(col)
        fields.append((f"c{j}", tp))
    batch = A.Batch(tuple(fields), n, cols, _DICT)
    want = _joined(A.py_batch_message(batch))
    assert _joined(nat.ipc_batch_message(n, cols, A.Const)) == want
    # the dictionary's messages: the whole of it, then a delta
    start = rng.randint(1, len(_DICT) - 1)
    for first, delta in ((0, False), (start, True)):
        d = A.bytes_column(np, _DICT[first:])
        py = _joined(A.py_batch_message(A.Batch((("", A.UTF8),), d.length, [d]), A.DICT_ID, delta))
        assert _joined(nat.ipc_batch_message(d.length, [d], A.Const, A.DICT_ID, delta)) == py
    dicts = b""
    if A.DICT_UTF8 in (tp for _, tp in fields):
        dicts = _joined(
            A.py_batch_message(
                A.Batch((("", A.UTF8),), len(_DICT), [A.bytes_column(np, _DICT)]), A.DICT_ID
            )
        )
    sch, got = _read(A.py_schema_message(batch.fields, META) + dicts + want + A.EOS)
    assert got[0].num_rows == n


@needs_native
def test_native_lz4_frames_and_schemas_are_the_python_encoders_bytes() -> None:
    nat = _native_mod()
    for pattern in (b"a", b"abc", b"x" * 15, b"y" * 16, bytes(range(256)) * 3, b"z" * 70_000):
        p = len(pattern)
        for size in (1, 11, p + 11, p + 12, p + 300, 65_536, 4 << 20, (4 << 20) + 7, 9_000_001):
            assert nat.ipc_lz4_periodic(pattern, size) == A.lz4_periodic(pattern, size)
    mixed = (("a", A.UTF8), ("l", A.LIST_INT64), ("b", A.BOOL), ("i", A.INT32),
             ("d", A.DICT_UTF8))  # fmt: skip
    for fields in (logschema.OPS, logschema.TENSORS, logschema.STACKS, mixed):
        for md in (META, {}):
            assert nat.ipc_schema_message(tuple(fields), md) == A.py_schema_message(fields, md)
    with pytest.raises(ValueError, match="no encoding"):
        nat.ipc_schema_message((("a", "decimal"),), {})


@needs_native
def test_native_writev_writes_every_piece_and_reports_a_full_disk(tmp_path: Path) -> None:
    nat = _native_mod()
    pieces = [b"head", np.arange(3000, dtype=np.int64), b"", memoryview(b"tail")] * 400
    f = tmp_path / "out"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        nat.ipc_writev(fd, pieces)  # 1,600 pieces: more than one writev (IOV_MAX)
    finally:
        os.close(fd)
    assert f.read_bytes() == _joined(pieces)
    if os.path.exists("/dev/full"):
        fd = os.open("/dev/full", os.O_WRONLY)
        try:
            with pytest.raises(OSError) as e:
                nat.ipc_writev(fd, [b"x" * 100])
            assert e.value.errno == errno.ENOSPC
        finally:
            os.close(fd)


@needs_native
def test_native_batch_message_refuses_what_is_not_a_column() -> None:
    """What the Python encoder would fail on makes the native one raise, never crash."""
    nat = _native_mod()
    good = A.Column(2, 0, [None, np.arange(2, dtype=np.int64)])
    for bad in (object(), A.Column(2, 0, (None, b"x" * 16)), A.Column(2, 0, [None, A.Const(3, 64)]),
                A.Column(2, 0, [None, np.arange(4.0)[::2]])):  # fmt: skip
        with pytest.raises((TypeError, AttributeError, BufferError, ValueError)):
            nat.ipc_batch_message(2, [good, bad], A.Const)
    with pytest.raises(TypeError):
        nat.ipc_batch_message(2, (good,), A.Const)  # a list of columns


@pytest.mark.parametrize("engine", ["native", "python"])
def test_dict_indices_of_every_kind_of_id_column(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """arrowipc.dict_indices (the native core's dict_indices, or its NumPy twin): ids + 1
    as int32, null where an id is -1, one id in every row as a Const; on int32 and int64 ids,
    strided as a field of the record buffer is."""

    _use_engine(engine, monkeypatch)
    rec = np.zeros(9, dtype=[("a", "<i4"), ("id", "<i8"), ("s", "<i4")])
    cases = [np.array([3, -1, 0, 5, 5], dtype=np.int64), np.array([2, 2, 2], dtype=np.int32),
             np.full(4, -1, dtype=np.int64), np.arange(-1, 700, dtype=np.int64)]  # fmt: skip
    rec["id"] = [4, -1, 4, 0, 1, 2, -1, 3, 4]
    rec["s"] = 7
    cases += [rec["id"], rec["s"]]  # strided fields
    for ids in cases:
        col = A.dict_indices(np, ids)
        n = len(ids)
        assert col.length == n and col.null_count == int((ids < 0).sum())
        bitmap, idx = col.buffers
        got = np.frombuffer(bytes(idx), dtype=np.int32)
        valid = ids >= 0
        assert np.array_equal(got[valid], ids[valid] + 1)
        assert isinstance(idx, A.Const) == bool((ids == ids[0]).all())
        if col.null_count:
            bits = np.unpackbits(np.frombuffer(bytes(bitmap), dtype=np.uint8), bitorder="little")
            assert np.array_equal(bits[:n].astype(bool), valid)
        else:
            assert bitmap is None
    with pytest.raises(ValueError, match="2\\*\\*31"):
        A.dict_indices(np, np.array([0, 2**31 - 1], dtype=np.int64))
    with pytest.raises(ValueError, match="2\\*\\*31"):
        A.dict_indices(np, np.array([2**31 - 1] * 3, dtype=np.int64))


@needs_native
def test_dict_indices_native_and_numpy_write_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twins agree byte for byte, null slots included (ids below -1 too: nulls)."""
    from pprobe import core

    rng = np.random.default_rng(1)
    cases = [rng.integers(-3, 50, 1000), rng.integers(-1, 3, 17).astype(np.int32),
             np.array([-2, -1, -2]), np.array([5, -1])]  # fmt: skip
    for ids in cases:
        got = []
        for nat in (_native_mod(), None):
            monkeypatch.setattr(core, "native", nat)
            col = A.dict_indices(np, ids)
            got.append(
                [col.length, col.null_count, [None if b is None else bytes(b) for b in col.buffers]]
            )
        assert got[0] == got[1], ids


@needs_native
def test_dict_take_is_dict_indices_of_the_gathered_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """arrowipc.dict_take(table, idx[, inner]): the native one pass and its NumPy twin give
    the bytes dict_indices gives for table[idx] (table[inner[idx]]), null where an index is
    negative (inner's too); on strided int32/int64 record fields, one id in every row as a
    Const, an index past a table an IndexError."""
    from pprobe import core

    rng = np.random.default_rng(5)
    table = rng.integers(0, 40, 30)
    inner = rng.integers(-1, 30, 20)
    rec = np.zeros(500, dtype=[("a", "<i4"), ("i", "<i4"), ("j", "<i8")])
    rec["i"] = rng.integers(-1, 30, 500)
    rec["j"] = rng.integers(-1, 20, 500)
    cases = [(table, rec["i"], None), (table, rec["j"], inner), (table, np.full(7, 3), None),
             (table, np.full(5, -1), None), (table, np.array([-1, 2, 0]), inner),
             (np.full(30, 9), rec["i"][rec["i"] >= 0], None)]  # fmt: skip
    for t, idx, inn in cases:
        j = idx.astype(np.int64)
        if inn is not None:
            j = np.where(j >= 0, inn[np.maximum(j, 0)], -1)
        want = A.dict_indices(np, np.where(j >= 0, t[np.maximum(j, 0)], -1))
        for nat in (_native_mod(), None):
            monkeypatch.setattr(core, "native", nat)
            col = A.dict_take(np, t, idx, inn)
            assert (col.length, col.null_count) == (want.length, want.null_count)
            assert [None if b is None else bytes(b) for b in col.buffers] == [
                None if b is None else bytes(b) for b in want.buffers
            ], (nat, idx[:5])
            assert isinstance(col.buffers[1], A.Const) == isinstance(want.buffers[1], A.Const)
    nat = _native_mod()
    with pytest.raises(IndexError):
        nat.dict_take(table, np.array([0, 30]))
    with pytest.raises(IndexError):
        nat.dict_take(table, np.array([0, 20]), inner)
    with pytest.raises(TypeError):
        nat.dict_take(table, np.array([0.0, 1.0]))


@needs_native
def test_field_ranges_and_missing_ids_agree_with_numpy() -> None:
    """The native core's field_ranges (min and max of record fields) and missing_ids (the
    distinct field values whose table entry is a marker) against NumPy over the same
    structured records: int32, int64 and uint64 fields, negatives, one record, none."""
    from pprobe import records

    nat = _native_mod()
    op_dt, desc_dt = records.numpy_dtypes()
    rng = np.random.default_rng(3)
    fields = (records.OP_AT["thread"], records.OP_AT["op"], records.OP_AT["t0"])
    for n in (0, 1, 2, 37, 1000):
        recs = np.zeros(n, dtype=op_dt)
        recs["thread"] = rng.integers(1, 4, n)
        recs["op"] = rng.integers(-1, 50, n)
        recs["t0"] = rng.integers(-(2**40), 2**40, n)
        got = nat.field_ranges(recs.tobytes(), op_dt.itemsize, fields)
        if not n:
            assert got is None
            assert (
                nat.missing_ids(
                    b"", op_dt.itemsize, *records.OP_AT["op"], np.zeros(1, np.int64), -2
                )
                == []
            )
            continue
        assert got == [(int(recs[f].min()), int(recs[f].max())) for f in ("thread", "op", "t0")]
        table = rng.choice(np.array([-2, 5, 9], dtype=np.int64), 50)
        got = nat.missing_ids(recs.tobytes(), op_dt.itemsize, *records.OP_AT["op"], table, -2)
        ops = recs["op"][recs["op"] >= 0]
        assert got == sorted({int(j) for j in ops if table[j] == -2})
        got32 = nat.missing_ids(
            recs, op_dt.itemsize, *records.OP_AT["op"], table.astype(np.int32), 9
        )
        assert got32 == sorted({int(j) for j in ops if table[j] == 9})
    descs = np.zeros(3, dtype=desc_dt)
    descs["stats"], descs["path"], descs["note"] = [-2, -1, -2], [-1, -1, 4], -1
    at = tuple(records.DESC_AT[f] for f in ("stats", "path", "note"))
    assert nat.field_ranges(descs.tobytes(), desc_dt.itemsize, at) == [(-2, -1), (-1, 4), (-1, -1)]
    recs = np.zeros(2, dtype=op_dt)
    recs["op"] = [1, 5]
    with pytest.raises(IndexError):
        nat.missing_ids(recs.tobytes(), op_dt.itemsize, *records.OP_AT["op"], np.full(5, -2), -2)
    with pytest.raises(ValueError, match="whole number"):
        nat.field_ranges(recs.tobytes()[:-1], op_dt.itemsize, fields)
    with pytest.raises(ValueError, match="outside the record"):
        nat.field_ranges(recs.tobytes(), op_dt.itemsize, ((op_dt.itemsize - 4, "q"),))
    with pytest.raises(TypeError):
        nat.field_ranges(recs.tobytes(), op_dt.itemsize, [records.OP_AT["op"]])  # not a tuple
    with pytest.raises(TypeError):
        nat.field_ranges(recs.tobytes(), op_dt.itemsize, ((0,),))


@needs_native
def test_a_few_new_stacks_native_records_give_the_numpy_paths_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer._stacks_batch for a few new stacks: the native path (_stack_records_few and
    record_columns) writes the bytes of the NumPy path (_stack_rows_few and the arrowipc
    columns), names included, a site past the call-site table a null."""
    import sys

    from pprobe import core, recorder
    from pprobe.writer import Writer, _stack_records_few, _stack_rows_few

    code = sys._getframe().f_code
    s = -1
    for line in range(1, 4):  # a stack three frames deep, and its inner stacks
        s = recorder._stack_id(s, recorder._site_id(code, 10_000 + line))
    n = len(recorder.stack_inner)
    k = max(0, n - 20)
    got = []
    for nat in (_native_mod(), None):
        monkeypatch.setattr(core, "native", nat)
        w = Writer(str(tmp_path), "run1", "host", 100, 1.0)
        w._stacks_done = k
        batch = w._stacks_batch()
        assert batch is not None and batch.num_rows >= 3
        got.append(b"".join(bytes(p) for p in A.batch_message(batch)))
        assert w._stacks_done == n
    assert got[0] == got[1]
    # a site outside the table: nulls, as the NumPy path's
    inner, outer = recorder.stack_inner, recorder.stack_outer
    callers = np.arange(5, dtype=np.int64) + 100
    recs = _stack_records_few(inner, outer, k, n, callers, callers + 50, 3)
    ids, levels, sites = _stack_rows_few(np, inner, outer, k, n)
    rows = np.frombuffer(recs.tobytes(), dtype=np.int64).reshape(-1, 4)
    assert rows[:, 0].tolist() == ids.tolist() and rows[:, 1].tolist() == levels.tolist()
    ok = (sites >= 0) & (sites < 3)
    assert rows[:, 2].tolist() == np.where(ok, callers[np.where(ok, sites, 0)], -1).tolist()
    assert rows[:, 3].tolist() == np.where(ok, callers[np.where(ok, sites, 0)] + 50, -1).tolist()


@needs_native
def test_bytes_column_native_and_numpy_give_the_same_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """arrowipc.bytes_column (a dictionary message's strings): the native core's
    utf8_column and the NumPy twin give the same offsets and data, no string included."""
    from pprobe import core

    cases: list[list[bytes]] = [[], [b""], [b"a", b"", "é".encode(), b"xyz" * 50], _DICT[3:]]
    for items in cases:
        got = []
        for nat in (_native_mod(), None):
            monkeypatch.setattr(core, "native", nat)
            col = A.bytes_column(np, items)
            assert (col.length, col.null_count, col.buffers[0]) == (len(items), 0, None)
            got.append([bytes(b) for b in col.buffers[1:]])
        assert got[0] == got[1], items
        assert got[0][1] == b"".join(items)


@needs_native
def test_desc_log_columns_are_the_record_columns_of_each_field() -> None:
    """The native core's desc_log_columns (the tensors batch's record columns and the
    stats/path/note maxima in one pass) against record_columns, shape_lists and
    field_ranges over the same desc records: nulls, one value in every row, every grad,
    ranks 0 to MAX_INLINE_DIMS; a deeper shape gives None."""
    from pprobe import records
    from pprobe import writer as W

    nat = _native_mod()
    _, desc_dt = records.numpy_dtypes()
    size = desc_dt.itemsize
    rng = np.random.default_rng(11)

    def cols(c: object) -> list:
        if isinstance(c, tuple):
            return [bytes(b) for b in c]
        return [c.length, c.null_count, [None if b is None else bytes(b) for b in c.buffers]]

    specs = [(W.RC_INT, *W._DESCF["seq"], 8, 0, False),
             *((W.RC_INDEX, *W._DESCF[f]) for f in ("role", "idx", "dtype", "device")),
             (W.RC_BOOL, *W._DESCF["grad"])]  # fmt: skip
    for n in (1, 2, 9, 300):
        for same in (None, 3, -1, 0):  # (None: each row its own values)
            ds = np.zeros(n, dtype=desc_dt)
            ds["seq"] = rng.integers(0, 2**40, n)
            for f in ("role", "idx", "dtype", "device", "stats", "path", "note"):
                ds[f] = rng.integers(-2, 6, n) if same is None else same
            ds["grad"] = rng.integers(-1, 2, n) if same is None else min(same, 1)
            ds["ndim"] = rng.integers(0, records.MAX_INLINE_DIMS + 1, n)
            for i in range(records.MAX_INLINE_DIMS):
                ds[f"d{i}"] = rng.integers(0, 1000, n)
            b = ds.tobytes()
            got = nat.desc_log_columns(b, size, W._DESC_LOG_AT, A.Column, A.Const)
            want = nat.record_columns(b, size, specs, A.Column, A.Const)
            seq, role, idx, shape, dtype, device, grad, maxes = got
            assert [cols(c) for c in (seq, role, idx, dtype, device, grad)] == [
                cols(c) for c in want
            ]
            at = (W._NDIM_AT, W._D0_AT)
            assert cols(shape) == cols(nat.shape_lists(b, size, *at))
            ranges = nat.field_ranges(b, size, W._OBJECT_AT)
            assert list(maxes) == [hi for _, hi in ranges]
            ds["ndim"][n // 2] = records.MAX_INLINE_DIMS + 1  # a deep shape
            assert (
                nat.desc_log_columns(ds.tobytes(), size, W._DESC_LOG_AT, A.Column, A.Const) is None
            )
    with pytest.raises(ValueError, match="outside the record"):
        nat.desc_log_columns(b, size, (size,) * 11, A.Column, A.Const)
    with pytest.raises(TypeError):
        nat.desc_log_columns(b, size, W._DESC_LOG_AT[:5], A.Column, A.Const)


@needs_native
def test_native_arg_texts_are_the_python_twins() -> None:
    """native.arg_texts writes the common values' texts (None, bools, floats, short ints and
    strs, Text, texts and shapes made during the call) as writer._arg_bytes does, byte for
    byte, and answers None for a set with any value that needs the twin (reprlib)."""
    import struct

    from pprobe import values
    from pprobe import writer as W

    nat = _native_mod()
    rng = random.Random(5)

    class Sub(str):
        pass

    common = [
        None, True, False, 0, -7, 10**39, 1.5, -0.0, float("nan"), float("inf"), 1e300,
        "", "x", "caf\u00e9", "a'b\"c", "lone \udc80 surrogate", "z" * 58, values.Text("t=1"),
        values.Text(""),
    ]  # fmt: skip
    twin_only = [10**40, 10**5000, "z" * 59, np.float64(2.0), Sub("s"), [1, 2], (1, 2), object]
    made = [(None, "dim=1"), (None, ""), *((None, (f"s{k}", struct.pack(f"{k}q", *range(k))))
                                            for k in (0, 1, 2, 8))]  # fmt: skip
    made.append((None, ("big", struct.pack("3q", 2**62, -(2**62), 7))))  # cut at 80
    made.append((None, ("deep", struct.pack("40q", *range(10**6, 10**6 + 40)))))
    sets: list = [()]
    for _ in range(400):
        k = rng.randint(1, 4)
        pairs = []
        for _ in range(k):
            r = rng.random()
            if r < 0.2:
                pairs.append(rng.choice(made))
            elif r < 0.3:
                pairs.append((rng.choice(["0", "dim", "\u00e9"]), rng.choice(twin_only)))
            else:
                pairs.append((rng.choice(["0", "1", "dim", "out", "\u00e9t\u00e9"]),
                              rng.choice(common)))  # fmt: skip
        sets.append(tuple(pairs))
    sets += ["not a tuple", ((1, 2, 3),), ((1, 2),)]  # the twin's (it raises or formats)
    got = nat.arg_texts(sets, values.Text)
    assert len(got) == len(sets)
    native_made = 0
    for s, g in zip(sets, got):
        needs_twin = not isinstance(s, tuple) or any(
            p[0] is not None
            and (not (len(p) == 2 and isinstance(p[0], str)) or any(p[1] is t for t in twin_only))
            for p in s
        )
        if g is None:
            assert needs_twin, s
            continue
        native_made += 1
        assert not needs_twin, s
        assert g == W._arg_bytes(s), s
    assert native_made > 200
    assert max(len(t) for t in nat.arg_texts([(made[-1],), (made[-2],)], values.Text)) < 90
    with pytest.raises(TypeError):
        nat.arg_texts(tuple(sets), values.Text)
