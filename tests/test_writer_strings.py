"""The log writer's string columns and its vector write (pprobe.writer, pprobe.safefs).

The native core's ``utf8_column`` builds a utf8 column's buffers in C; its Python twin
(``pprobe.writer._utf8`` and ``_Strings.gather`` without the core) joins the same bytes with
``bytes.join``. Both are compared with pyarrow's own conversion of the same values, and the
args column (one text per distinct set of (name, value) pairs, cached) with the texts
``values.arg_text`` makes, hashable sets or not. ``write_all_v`` is checked against short
writes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pprobe import arrowipc as A
from pprobe import core, records, safefs, values, writer

ENGINES = ["native", "python"] if core.native is not None else ["python"]


@pytest.fixture(params=ENGINES)
def engine(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the native core's helpers, then with their Python twins."""
    if request.param == "python":
        monkeypatch.setattr(core, "native", None)
    return str(request.param)


def _decoded(col: A.Column) -> list:
    """The values of a utf8 column, decoded by pyarrow from the column's own buffers."""
    fields = (("s", A.UTF8),)
    data = b"".join(A.batch_message(A.Batch(fields, col.length, [col])))
    sink = A.schema_message(fields, {}) + data + A.EOS
    return pa.ipc.open_stream(sink).read_all().column("s").to_pylist()


def _values(rng: random.Random, n: int) -> list:
    pool = ["", "a", "numpy.add", "é∂ƒ", "x" * 300, "line\nbreak", "\x00nul"]
    return [None if rng.random() < 0.2 else rng.choice(pool) for _ in range(n)]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_a_column_of_bytes_or_none_reads_back_as_given(engine: str, n: int) -> None:
    rng = random.Random(n)
    vals = _values(rng, n)
    items = [None if v is None else v.encode() for v in vals]
    col = writer._utf8(np, items)
    assert col.length == n
    assert col.null_count == vals.count(None)
    assert _decoded(col) == vals


def test_a_column_without_nulls_has_no_bitmap(engine: str) -> None:
    col = writer._utf8(np, [b"a", b"", b"bc"])
    assert col.null_count == 0 and col.buffers[0] is None
    assert _decoded(col) == ["a", "", "bc"]


@pytest.mark.parametrize("n", [1, 9, 1000])
def test_string_ids_gather_to_the_strings(engine: str, n: int) -> None:
    rng = random.Random(n)
    texts = ["ok", "é", "", "numpy.ndarray.__add__", "y" * 100]
    ids = np.array([rng.choice([-1, *[records.sid(t) for t in texts]]) for _ in range(n)])
    ids[0] = records.sid(texts[0])  # at least two distinct ids: not the one-value shortcut
    if n > 1:
        ids[1] = records.sid(texts[1])
    strs = writer._Strings()
    strs.refresh()
    col = strs.gather(ids)
    want = [None if i < 0 else records.strings[i] for i in ids.tolist()]
    assert col.null_count == want.count(None)
    assert _decoded(col) == want


@pytest.mark.skipif(
    core.native is None, reason="the native core is off (PPROBE_CORE=python) or not built"
)
def test_utf8_column_refuses_what_it_cannot_encode() -> None:
    fn = core.native.utf8_column  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        fn([b"a", 3])
    with pytest.raises(UnicodeEncodeError):  # a str with no UTF-8: the writer's twin takes it
        fn(["a", "lone \ud800"])
    # str rows (dump paths, notes) are their UTF-8, as arrowipc.texts encodes them
    k, bitmap, offsets, data = fn(["é", None, b"x", "ab"])
    assert (k, data, bitmap) == (1, "é".encode() + b"xab", bytes([0b1101]))
    assert np.frombuffer(offsets, dtype=np.int32).tolist() == [0, 2, 2, 3, 5]
    with pytest.raises(IndexError):
        fn([b"", b"a"], np.array([0, 5], dtype=np.int64))
    with pytest.raises(TypeError):  # ids are int32 or int64, one dimension
        fn([b"", b"a"], np.array([0.0, 1.0]))
    with pytest.raises(TypeError):
        fn([b"", b"a"], np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(IndexError):  # one id for every row, past the table
        fn([b"", b"a"], np.array([4, 4], dtype=np.int32), True)
    assert fn([b"", b"a"], np.array([0, 0, 0], dtype=np.int32), True) == 0
    assert fn([b"", b"a"], np.array([-1, -1], dtype=np.int64), True) == -1
    assert fn([b"", b"a"], np.array([-3, -1], dtype=np.int64), True) != -1  # two null ids
    k, bitmap, offsets, data = fn([b"", b"a", b"bc"], np.array([1, -1, 0, 1], dtype=np.int64))
    assert (k, data) == (1, b"bcabc")
    assert np.frombuffer(offsets, dtype=np.int32).tolist() == [0, 2, 2, 3, 5]
    assert bitmap == bytes([0b1101])


def _writer() -> writer.Writer:
    w = writer.Writer.__new__(writer.Writer)
    w._args_cache = {}
    w._args_ids = {}
    return w


def _args(w: writer.Writer, calls: list) -> list:
    """The args column for ``calls`` (a pairs tuple or None per row), decoded."""
    objs = [c for c in calls if c is not None]
    refs, k = [], 0
    for c in calls:
        refs.append(-1 if c is None else k)
        k += c is not None
    return _decoded(w._args(np, np.array(refs, dtype=np.int64), objs))


def _text(pairs: Any) -> str:
    return ", ".join(values.arg_text(i, v) for i, v in pairs)


def test_args_are_the_texts_of_their_pairs_hashable_or_not(engine: str) -> None:
    a = (("alpha", -0.01),)
    b = (("axis", 1), ("keepdims", True))
    u = (("out", [1, 2, 3]),)  # a list: unhashable
    w = _writer()
    for calls in ([a, None, b, a, None], [b, b, a], [a, u, None, u, b], [None, None]):
        want = [None if c is None else _text(c) for c in calls]
        assert _args(w, calls) == want
    assert {k[0] for k in w._args_cache} == {a, b}  # the unhashable set is formatted each time


def test_equal_sets_with_different_texts_are_not_confused(engine: str) -> None:
    # 1.0 == True, 1000 == 1000.0, 0.0 == -0.0 (and their hashes are equal): a cache keyed
    # by the sets alone would give each the text of whichever came first
    calls = [
        (("x", 1.0),), (("x", True),), (("x", 0.0),), (("x", -0.0),), (("x", False),),
        (("0", 1000),), (("0", 1000.0),), (("0", 1000 + 0j),), (("x", 1.0), ("y", True)),
        (("x", True), ("y", 1.0)),
    ]  # fmt: skip
    w = _writer()
    want = [_text(c) for c in calls]
    assert len(set(want)) == len(want)
    assert _args(w, calls) == want
    assert _args(w, calls[::-1]) == want[::-1]  # from the cache this time


def test_the_args_cache_starts_over_when_full(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _writer()
    calls = [(("lr", float(i)),) for i in range(70_000)]
    got = _args(w, calls[:40_000])
    got += _args(w, calls[40_000:])
    assert got == [_text(c) for c in calls]
    assert len(w._args_cache) <= 65_536
    assert len(w._args_ids) <= 65_536
    assert _args(w, [calls[-1], calls[0]]) == [_text(calls[-1]), _text(calls[0])]


@pytest.mark.skipif(core.native is None, reason="the native core is not built")
def test_arg_column_finds_sets_by_identity_only() -> None:
    """native.arg_column gives the text of a set met before as that very object (the core
    shares one tuple between rows with the same args); an equal set that is another object
    is a miss, whatever its text would be, and so is one whose cache entry names another.
    A missed set is listed once (a first flush meets each set in many rows), and nothing is
    built until every set has its text."""
    fn = core.native.arg_column  # type: ignore[union-attr]
    a, t = (("x", 1.0),), (("x", True),)  # equal, hash alike, print differently
    a2 = tuple([("x", 1.0)])  # equal to a, another object
    assert a2 == a and a2 is not a
    cache: dict = {}
    objs = [a, t, a2]
    rec = np.zeros(6, dtype=[("s", "<i2"), ("ref", "<i4")])  # a strided field, as the records'
    rec["ref"] = [0, 1, 0, -1, 2, 1]
    assert fn(rec["ref"], objs, cache) == [a, t, a2]
    cache[id(a)] = (a, b"x=1.0")
    assert fn(rec["ref"], objs, cache) == [t, a2]
    cache[id(t)] = (a, b"stale")  # an entry under t's id that holds another set
    assert fn(rec["ref"], objs, cache) == [t, a2]
    cache[id(t)] = (t, b"x=True")
    cache[id(a2)] = (a2, b"x=1.0")
    k, bitmap, offsets, data = fn(rec["ref"], objs, cache)
    assert (k, bitmap, data) == (1, bytes([0b110111]), b"x=1.0x=Truex=1.0x=1.0x=True")
    assert np.frombuffer(offsets, dtype=np.int32).tolist() == [0, 5, 11, 16, 16, 21, 27]
    k, bitmap, offsets, data = fn(np.array([1, 1], dtype=np.int64), objs, cache)
    assert (k, bitmap, data) == (0, None, b"x=Truex=True")
    with pytest.raises(IndexError):
        fn(np.array([3]), objs, cache)
    with pytest.raises(TypeError):
        fn(np.array([0]), (a,), cache)


def test_args_of_sets_shared_between_rows_across_batches(engine: str) -> None:
    """The same set objects in several batches (as the native core's shared tuples are):
    each row keeps its own text, from the identity cache (native) or by value."""
    a, b, t = (("x", 1.0),), (("axis", 0), ("keepdims", True)), (("x", True),)
    w = _writer()
    for calls in ([a, b, t, a], [t, t, a, None, b], [a2 := tuple(list(a)), a, t]):
        assert _args(w, calls) == [None if c is None else _text(c) for c in calls]
    assert a2 == a


def test_write_all_v_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = [b"head", np.arange(10, dtype=np.int32), b"", bytes(range(256)) * 3, b"\x00" * 5]
    want = b"".join(memoryview(p).cast("B").tobytes() for p in pieces)
    real = os.writev

    def short(fd: int, bufs: list) -> int:
        return real(fd, [memoryview(bufs[0])[:3]])  # at most 3 bytes a call

    monkeypatch.setattr(os, "writev", short)
    path = tmp_path / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        safefs.write_all_v(fd, pieces)
    finally:
        os.close(fd)
    assert path.read_bytes() == want


def test_write_all_v_reports_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "writev", lambda fd, bufs: 0)
    fd = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="No space"):
            safefs.write_all_v(fd, [b"abc"])
    finally:
        os.close(fd)


@pytest.mark.parametrize("dt", ["<i4", "<i8"])
@pytest.mark.parametrize("n", [1, 2, 17, 1000])
def test_ids_read_in_place_from_a_record_field(engine: str, dt: str, n: int) -> None:
    """The writer passes a record buffer's field as it is (strided, int32 or int64): the
    column is the same as from a contiguous copy, and a field with one id in every row
    (one value, or nulls) is a column of one value that builds no buffer (arrowipc.Const)."""
    rng = random.Random(n)
    texts = ["ok", "é", "", "numpy.ndarray.__add__"]
    sids = [records.sid(t) for t in texts]
    rec = np.zeros(n, dtype=[("a", "<i8"), ("ids", dt), ("b", "<i2")])  # packed: unaligned
    strs = writer._Strings()
    strs.refresh()
    for case in ("mixed", "one", "nulls"):
        if case == "mixed":
            rec["ids"] = [rng.choice([-1, *sids]) for _ in range(n)]
        else:
            rec["ids"] = sids[1] if case == "one" else -1
        ids = rec["ids"]
        assert not ids.flags.c_contiguous or n == 1
        col = strs.gather(ids)
        want = [None if i < 0 else records.strings[i] for i in ids.tolist()]
        assert _decoded(col) == want, case
        assert col.null_count == want.count(None)
        assert _decoded(strs.gather(np.ascontiguousarray(ids, dtype=np.int64))) == want
        if len(set(ids.tolist())) == 1:  # its bytes (and a null column's offsets) not made
            data, null = col.buffers[-1], ids[0] < 0
            assert isinstance(data, A.Const) or (null and data == b""), case
            if null:
                assert isinstance(col.buffers[0], A.Const) and isinstance(col.buffers[1], A.Const)


@pytest.mark.parametrize(
    "v",
    [None, True, False, 0, -5, 10**39, 10**40, -(10**39), 10**45, 0.1, -0.0, float("inf"),
     float("nan"), 1e-300, "", "a" * 58, "a" * 59, "a" * 60, "a" * 61, "it's", "é" * 30,
     "\n" * 30, "x\"y'z" * 12, 2**63, "x\"y'z" * 4],
)  # fmt: skip
def test_format_value_shortcuts_write_what_reprlib_writes(v: Any) -> None:
    """format_value's repr() shortcut for floats, bools, None and short ints and strs gives
    reprlib's text (which shortens ints past 40 characters, strs past 60)."""
    want = values._repr.repr(v)
    assert values.format_value(v) == (want if len(want) <= 80 else want[:77] + "...")


def test_format_value_of_an_int_too_long_for_a_text() -> None:
    """An int past the interpreter's digits limit has no repr (ValueError): its text is the
    type's, as before the shortcut, and the flush goes on."""
    assert values.format_value(10**5000) == "<int>"
    assert writer._arg_bytes((("x", 10**5000),)) == b"x=<int>"


def _specs_for(rng: random.Random, n: int, sids: list[int]) -> list:
    """Every kind of record_columns spec over the op records' fields."""
    f = writer._OPF
    table = np.array([rng.choice([-1, *sids]) for _ in range(7)], dtype=np.int64)
    inner = np.array([rng.randrange(-1, 7) for _ in range(6)], dtype=np.int64)
    W = writer
    return [
        (W.RC_COL, A.repeat(np, "given", n)),
        (W.RC_REPEAT, "run-é".encode()),
        (W.RC_REPEAT, b""),
        (W.RC_CONST, 8, 12345678901),
        (W.RC_CONST, 4, -3),
        (W.RC_CONST, 4, None),
        *((W.RC_NULLS, tp) for tp in (A.UTF8, A.INT32, A.INT64, A.FLOAT64, A.BOOL, A.DICT_UTF8)),
        (W.RC_ONE, sids[1]),
        (W.RC_ONE, -1),
        (W.RC_INT, *f["seq"], 8, 0, False),
        (W.RC_INT, *f["t0"], 8, 1_700_000_000_000_000_000, False),
        (W.RC_INT, *f["thread"], 8, 0, False),
        (W.RC_INT, *f["depth"], 4, 0, False),
        (W.RC_INT, *f["parent"], 8, 0, True),
        (W.RC_INT, *f["site"], 8, 0, True),
        (W.RC_DIFF, *f["t1"][:2], *f["t0"][:2]),
        (W.RC_TAKE, *f["op"], table, None),
        (W.RC_TAKE, *f["site"], table, inner),
        (W.RC_INDEX, *f["status"]),
        (W.RC_INDEX, *f["module"]),
        (W.RC_BOOL, *f["args"]),
    ]


@pytest.mark.skipif(core.native is None, reason="the native core is not built")
@pytest.mark.parametrize("n", [1, 2, 9, 64, 1000])
def test_record_columns_are_their_twins(n: int) -> None:
    """native.record_columns makes, from the records' fields, the columns that its twin
    (writer.py_record_columns: arrowipc's functions) makes: the same null counts, the same
    buffers, the same IPC bytes once written; a column of one value in every row stays one
    value (arrowipc.Const) on both sides."""
    rng = random.Random(n)
    sids = [records.sid(t) for t in ("ok", "é", "", "torch.add")]
    op_dt, _ = records.numpy_dtypes()
    for case in ("mixed", "one", "nulls"):
        recs = np.zeros(n, dtype=op_dt)
        for name, _code in records.OP_FIELDS:
            if case == "mixed":
                lo, hi = (0, 2**40) if name in ("t0", "t1", "seq", "thread") else (-1, 6)
                recs[name] = [rng.randrange(lo, hi) for _ in range(n)]
            else:
                recs[name] = 3 if case == "one" else (-1 if name not in ("thread",) else 0)
        recs["args"] = [rng.randrange(-1, 2) for _ in range(n)]  # grad-like: -1, 0, 1
        specs = _specs_for(rng, n, sids)
        got = core.native.record_columns(recs, recs.dtype.itemsize, specs, A.Column, A.Const)  # type: ignore[union-attr]
        want = writer.py_record_columns(np, recs, specs)
        assert len(got) == len(want) == len(specs)
        for spec, g, w in zip(specs, got, want):
            assert (g.length, g.null_count) == (w.length, w.null_count), (case, spec[:2])
            assert [type(b) is A.Const for b in g.buffers] == [
                type(b) is A.Const for b in w.buffers
            ], (case, spec[:2])
            assert [A.Const if b is None else bytes(b) for b in g.buffers] == [
                A.Const if b is None else bytes(b) for b in w.buffers
            ], (case, spec[:2])
        fields = [(f"c{i}", "int64") for i in range(len(specs))]
        msg = [A.py_batch_message(A.Batch(fields, n, c)) for c in (got, want)]
        assert [b"".join(map(bytes, m)) for m in msg][0] == b"".join(map(bytes, msg[1]))


@pytest.mark.skipif(core.native is None, reason="the native core is not built")
def test_record_columns_refuses_what_it_cannot_read() -> None:
    """A malformed spec, a field past the record, a partial record, an index past its
    table: an exception (the writer reports it), never a read outside the buffers."""
    fn = core.native.record_columns  # type: ignore[union-attr]
    op_dt, _ = records.numpy_dtypes()
    recs = np.zeros(3, dtype=op_dt)
    size = op_dt.itemsize
    table = np.zeros(2, dtype=np.int64)
    bad = [
        [(99,)],
        [(writer.RC_INT, "seq", size - 4, "q", 8, 0, False)],
        [(writer.RC_INT, "seq", 0, "d", 8, 0, False)],
        [(writer.RC_INT, "seq", 0, "q", 2, 0, False)],
        [(writer.RC_NULLS, "decimal")],
        [(writer.RC_CONST, 4, 2**40)],
        [(writer.RC_REPEAT, "not bytes")],
    ]
    for specs in bad:
        with pytest.raises((ValueError, TypeError, OverflowError)):
            fn(recs, size, specs, A.Column, A.Const)
    with pytest.raises(ValueError):
        fn(recs.tobytes()[:-1], size, [], A.Column, A.Const)
    recs["op"] = 5
    with pytest.raises(IndexError):
        fn(recs, size, [(writer.RC_TAKE, *writer._OPF["op"], table, None)], A.Column, A.Const)
