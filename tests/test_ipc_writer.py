"""The log written by pprobe's own Arrow IPC encoder (pprobe.arrowipc), without pyarrow.

Unit layer: the encoder's messages decoded by pyarrow (every type, nulls, empty strings,
non-ASCII, empty lists, 0-row and big batches, streams cut short at every byte) and the two
schema descriptions (pprobe.logschema, pprobe.schema) compared. End-to-end: the same programs
run through the bootstrap with PPROBE_LOG_WRITER=pprobe and =pyarrow give the same tables.
"""

from __future__ import annotations

import io
import random
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pprobe import arrowipc as A
from pprobe import logschema, schema

META = {"pprobe.schema_version": logschema.SCHEMA_VERSION, "run_id": "r1", "pid": "7",
        "host": "h\u00e9"}  # fmt: skip


# ---------------------------------------------------------------------- helpers
def _texts_and_values(rng: random.Random, n: int) -> list:
    pool = ["", "a", "ok", "h\u00e9llo", "\u65e5\u672c\u8a9e", "x" * 300, "\U0001f600 emoji",
            "nul\x00inside", None]  # fmt: skip
    return [rng.choice(pool) for _ in range(n)]


def _column(rng: random.Random, tp: str, n: int) -> tuple[A.Column, pa.Array]:
    """A column made with arrowipc's constructors and the same values as a pyarrow array
    built from Python objects (an independent reference)."""
    valid = np.array([rng.random() < 0.7 for _ in range(n)], dtype=bool)
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


def _batch(rng: random.Random, fields: tuple, n: int) -> tuple[A.Batch, pa.RecordBatch]:
    made = [_column(rng, tp, n) for _, tp in fields]
    ref = pa.RecordBatch.from_arrays([r for _, r in made], schema=A.pa_schema(pa, fields))
    return A.Batch(fields, n, [c for c, _ in made]), ref


def _stream(fields: tuple, batches: list[A.Batch], eos: bool = True) -> bytes:
    out = A.schema_message(fields, META)
    for b in batches:
        out += b"".join(A.batch_message(b))
    return out + (A.EOS if eos else b"")


def _read(data: bytes) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    r = pa.ipc.open_stream(io.BytesIO(data))
    got = list(r)
    for b in got:
        b.validate(full=True)
    return r.schema, got


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
    _, (got,) = _read(_stream(fields, [A.Batch(fields, n, cols)]))
    assert all(c.null_count == n for c in got.columns)
    assert got.column(0).to_pylist() == [None] * n
    one = (("s", A.UTF8),)
    _, (got,) = _read(_stream(one, [A.Batch(one, 3, [A.texts(np, ["\u00e9"] * 3)])]))
    assert got.column(0).to_pylist() == ["\u00e9"] * 3
    none = A.ints(np, np.zeros(4), A.INT64, np.zeros(4, dtype=bool))
    _, (got,) = _read(_stream((("i", A.INT64),), [A.Batch((("i", A.INT64),), 4, [none])]))
    assert got.column(0).to_pylist() == [None] * 4


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
    ours = [_batch(rng, fields, n) for n in (3, 0, 40)]
    head = A.schema_message(fields, META)
    msgs = [b"".join(A.batch_message(b)) for b, _ in ours]
    ends = [len(head)]
    for m in msgs:
        ends.append(ends[-1] + len(m))
    whole = head + b"".join(msgs)
    path = tmp_path / "ops-h-7.arrows"
    near = {e + d for e in ends for d in (-9, -8, -5, -4, -1, 1, 3, 4, 8)}
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
        assert early or cut in ends  # cut mid-message (at a boundary: a plain end)
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
    w.close()
    w.close()  # idempotent
    data = path.read_bytes()
    assert data.endswith(A.EOS)
    _, (got,) = _read(data)
    assert got.to_pylist() == ref.to_pylist()
