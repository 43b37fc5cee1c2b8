"""The recording engines: choice, fallback, metadata, and the record codec they share.

The whole suite runs once per engine (run_tests.sh: PPROBE_CORE=native, then python); these
tests check what is specific to the engine layer itself.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from helpers import meta, ops, run_script, tensors

from pprobe import core, records

ENGINE = core.ENGINE
NATIVE_BUILT = True
try:
    from pprobe import _native  # noqa: F401
except ImportError:
    NATIVE_BUILT = False


def test_engine_is_the_one_asked_for() -> None:
    want = os.environ.get("PPROBE_CORE", "auto")
    if want == "python":
        assert ENGINE == "python" and core.REASON == "PPROBE_CORE=python"
    elif NATIVE_BUILT:
        assert ENGINE == "native", core.REASON
    else:
        assert ENGINE == "python" and core.FELL_BACK


@pytest.mark.parametrize("engine", ["native", "python"])
def test_meta_says_which_engine_ran(tmp_path: Path, engine: str) -> None:
    if engine == "native" and not NATIVE_BUILT:
        pytest.skip("the native core is not built here")
    r = run_script(
        tmp_path,
        """
        import numpy as np
        print(np.add(np.arange(3.0), 1.0).sum())
        """,
        env={"PPROBE_CORE": engine, "PPROBE_MODE": "log"},
    ).check()
    assert r.out.strip() == "6.0"
    m = meta(r.run_dir)
    assert m["core"]["engine"] == engine
    assert m["core"]["reason"] == f"PPROBE_CORE={engine}"
    proc = json.loads(next((r.run_dir / "procs").iterdir()).read_text())
    assert proc["core"]["engine"] == engine
    assert [o["op"] for o in ops(r.run_dir)] == [
        "numpy.arange", "numpy.add", "numpy.ndarray.sum"
    ]  # fmt: skip
    assert not r.pprobe_lines()


@pytest.mark.parametrize(
    ("core_env", "setup", "why"),
    [
        # the extension cannot be imported (as without a compiler at install time)
        ("native", 'sys.modules["pprobe._native"] = None', "not built"),
        # a core built from other sources than this Python side (an old build in the tree)
        ("auto", 'sys.modules["pprobe._native"] = types.ModuleType("x"); '
                 'sys.modules["pprobe._native"].API = 0', "out of date"),
    ],
    ids=["missing", "out-of-date"],
)  # fmt: skip
def test_a_native_core_that_cannot_run_falls_back_with_one_line(
    tmp_path: Path, core_env: str, setup: str, why: str
) -> None:
    r = run_script(
        tmp_path,
        f"""
        import sys, types
        {setup}
        import pprobe, numpy as np
        pprobe.enable(mode="log")
        print(np.multiply(np.arange(4), 2).tolist())
        pprobe.disable()
        """,
        env={"PPROBE_CORE": core_env},
        probe=False,
    ).check()
    assert r.out.strip() == "[0, 2, 4, 6]"
    lines = r.pprobe_lines()
    assert len(lines) == 1 and "Python engine" in lines[0] and why in lines[0], lines
    m = meta(r.run_dir)
    assert m["core"]["engine"] == "python"
    assert why in m["core"]["reason"]
    assert [o["op"] for o in ops(r.run_dir)] == [
        "numpy.arange", "numpy.multiply", "numpy.ndarray.tolist"
    ]  # fmt: skip


def test_a_bad_core_value_is_a_configuration_error(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print('ran')", env={"PPROBE_CORE": "fast"})
    assert r.rc == 0 and r.out.strip() == "ran"
    (line,) = r.pprobe_lines()
    assert "PPROBE_CORE='fast'" in line and "auto, native, python" in line


# ---------------------------------------------------------------------- the record codec
def _rows() -> list[tuple]:
    f32 = ("input", "0", struct.pack("2q", 2, 3), "float32", "cpu", None, None, None, None)
    deep = ("output", "0", struct.pack("10q", *range(1, 11)), "int64", "cpu", True,
            (1.0, 5.0, 2.5, None, 0.0, 3.0), "/x/op.npy", "a note")  # fmt: skip
    nostats = ("input", "out", struct.pack("0q"), "bool", None, False,
               (None, None, None, None, 2.0, 0.0), None, None)  # fmt: skip
    return [
        (0, 7, 100, 150, 11, 3, 0, -1, -1, "ok", None, None, [f32, deep], [("axis", 1.5)]),
        (1, 8, 200, 260, 12, 3, 1, 0, -1, "ValueError", "model.fc", "forward", [nostats], []),
        (2, 7, 300, 300, 11, 4, 0, -1, -1, "ok", None, None, [], [(None, "k=3")]),
    ]


def _buffers() -> list[object]:
    out: list[object] = [records.Buffer()]
    if NATIVE_BUILT:
        from pprobe import _native

        out.append(_native.Buffer())
    return out


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_records_round_trip_to_arrow(buf: object, tmp_path: Path) -> None:
    from pprobe import recorder, state
    from pprobe.writer import Writer

    while len(recorder.ops_by_index) < 9:  # the rows name ops 7 and 8
        recorder.op(f"test.op{len(recorder.ops_by_index)}", "function", "numpy")
    for row in _rows():
        buf.append(*records.encode_row(*row))  # type: ignore[attr-defined]
    assert len(buf) == 3  # type: ignore[arg-type]
    heads, descs, objs, n = buf.take()  # type: ignore[attr-defined]
    assert n == 3 and len(buf) == 0  # type: ignore[arg-type]
    w = Writer(str(tmp_path), "run1", "host", 100, 1.0)
    with state.internal():
        o, t = w._to_batches(heads, descs, objs, n)
    from pprobe.arrowipc import to_pyarrow

    ot, tt = to_pyarrow(o).to_pylist(), to_pyarrow(t).to_pylist()
    assert [r["seq"] for r in ot] == [0, 1, 2]
    assert [r["op"] for r in ot] == [recorder.ops_by_index[i].name for i in (7, 8, 7)]
    assert [r["status"] for r in ot] == ["ok", "ValueError", "ok"]
    assert [r["dur_ns"] for r in ot] == [50, 60, 0]
    assert [r["step"] for r in ot] == [3, 3, 4]
    assert [r["depth"] for r in ot] == [0, 1, 0]
    assert [r["parent"] for r in ot] == [None, 0, None]
    assert [r["module_path"] for r in ot] == [None, "model.fc", None]
    assert [r["phase"] for r in ot] == [None, "forward", None]
    assert [r["args"] for r in ot] == ["axis=1.5", None, "k=3"]
    assert [r["caller"] for r in ot] == [None, None, None]
    assert [(r["seq"], r["role"], r["idx"]) for r in tt] == [
        (0, "input", "0"), (0, "output", "0"), (1, "input", "out")
    ]  # fmt: skip
    assert [r["shape"] for r in tt] == [[2, 3], list(range(1, 11)), []]
    assert [r["dtype"] for r in tt] == ["float32", "int64", "bool"]
    assert [r["device"] for r in tt] == ["cpu", "cpu", None]
    assert [r["requires_grad"] for r in tt] == [None, True, False]
    assert [(r["min"], r["max"], r["mean"], r["std"]) for r in tt] == [
        (None, None, None, None), (1.0, 5.0, 2.5, None), (None, None, None, None)
    ]  # fmt: skip
    assert [(r["nan_count"], r["inf_count"]) for r in tt] == [(None, None), (0, 3), (2, 0)]
    assert [(r["dump_path"], r["note"]) for r in tt] == [
        (None, None), ("/x/op.npy", "a note"), (None, None)
    ]  # fmt: skip


def test_the_python_buffer_cuts_its_rows_as_slicing_each_row_does() -> None:
    """records.Buffer.take cuts the rows it joined with NumPy (records._split): its op and
    desc records and its objects are those of slicing every row at OP_SIZE, with each row's
    object indices moved past the objects of the rows before it."""
    import numpy as np

    rng = np.random.default_rng(5)
    op_dt, desc_dt = records.numpy_dtypes()
    kept = records.Buffer()  # one buffer for every trial: take cuts into recycled memory
    reused = 0
    for trial in range(60):
        buf = kept if trial % 2 else records.Buffer()
        want_h, want_d, want_objs = [], [], []
        for _ in range(int(rng.integers(1, 40))):
            nd = int(rng.integers(0, 4))  # rows without a desc record too
            op = np.zeros(1, op_dt)
            ds = np.zeros(nd, desc_dt)
            op["seq"] = rng.integers(0, 1 << 40)
            op["n_descs"] = nd
            kind = int(rng.integers(0, 3)) if trial else 0  # trial 0: bytes rows only
            objs = None if kind == 0 else () if kind == 1 else tuple(rng.integers(0, 9, 3))
            top = len(objs) if objs else 0  # a row's object indices: its own objects, or -1
            for f in records.OP_OBJ_FIELDS:
                op[f] = rng.integers(-1, top) if top else -1
            for f in records.DESC_OBJ_FIELDS:
                ds[f] = rng.integers(-1, top, nd) if top else -1
            ds["ndim"] = rng.integers(0, 9, nd)
            buf.append(op.tobytes(), ds.tobytes(), objs)
            base = len(want_objs)
            if objs:  # the indices the writer sees are absolute
                for f in records.OP_OBJ_FIELDS:
                    op[f] = np.where(op[f] >= 0, op[f] + base, op[f])
                for f in records.DESC_OBJ_FIELDS:
                    ds[f] = np.where(ds[f] >= 0, ds[f] + base, ds[f])
                want_objs.extend(objs)
            want_h.append(op.tobytes())
            want_d.append(ds.tobytes())
        n_rows = len(buf)
        spare = buf._scratch.spare  # (heads, descs) the previous trial gave back
        heads, descs, objs_got, n = buf.take()
        assert n == n_rows and len(buf) == 0
        assert np.frombuffer(heads, op_dt).tobytes() == b"".join(want_h), trial
        assert np.frombuffer(descs, desc_dt).tobytes() == b"".join(want_d), trial
        assert objs_got == want_objs, trial
        if buf is kept:
            fits = spare is not None and spare[0].nbytes >= heads.nbytes
            if fits and spare[1].nbytes >= descs.nbytes:
                assert np.shares_memory(heads, spare[0]), trial
                reused += 1
            buf.recycle(heads, descs)  # the writer's, once the batch is written
            heads.view(np.uint8).fill(0)  # the next take must not depend on what was left
            descs.view(np.uint8).fill(0)
    assert reused >= 5  # some of the 30 takes fit in the memory given back before them
    assert records.Buffer().take() == (b"", b"", [], 0)


def test_batches_a_tap_holds_keep_their_values_after_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector's tap may queue a flush's batches for its own thread, and a one-row
    column is a view of the flushed records: the Python buffer must not cut the next flush's
    rows into that memory (the native buffer reuses only blocks nothing else exports)."""
    from pprobe import recorder, state
    from pprobe.writer import Writer

    while len(recorder.ops_by_index) < 8:
        recorder.op(f"test.op{len(recorder.ops_by_index)}", "function", "numpy")
    bufs: list[object] = [records.Buffer()]
    if NATIVE_BUILT:
        from pprobe import _native

        bufs.append(_native.Buffer())
    for buf in bufs:
        monkeypatch.setattr(recorder, "buffer", buf)
        w = Writer(str(tmp_path / type(buf).__module__), "run1", "host", 100, 1.0)
        queued: list = []
        w.tap = lambda table, batch, queued=queued: queued.append((table, batch))
        w.keep_local = False
        for seq, shape, lo in ((111, (2, 3), 1.0), (222, (7, 9), -4.0)):
            d = ("input", "0", struct.pack("2q", *shape), "float32", "cpu", None,
                 (lo, 5.0, 2.5, 1.0, 0.0, 0.0), None, None)  # fmt: skip
            row = records.encode_row(seq, 7, 100, 150, 11, seq, 0, -1, -1, "ok", None, None,
                                     [d], [])  # fmt: skip
            buf.append(*row)  # type: ignore[attr-defined]
            with state.internal():
                w._flush()
        got = [(t, b.to_pydict()) for t, b in queued]
        ops = [d for t, d in got if t == "ops"]
        tensors = [d for t, d in got if t == "tensors"]
        assert [(d["seq"], d["step"]) for d in ops] == [([111], [111]), ([222], [222])], buf
        assert [(d["shape"], d["min"]) for d in tensors] == [
            ([[2, 3]], [1.0]), ([[7, 9]], [-4.0])
        ]  # fmt: skip


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_native_buffer_reuses_a_batch_s_memory_only_when_nothing_reads_it() -> None:
    import numpy as np

    from pprobe import _native, recorder

    while len(recorder.ops_by_index) < 8:
        recorder.op(f"test.op{len(recorder.ops_by_index)}", "function", "numpy")
    buf = _native.Buffer()
    d = ("input", "0", struct.pack("2q", 2, 3), "float32", "cpu", None, None, None, None)
    op_dt, _ = records.numpy_dtypes()

    def one(seq: int) -> tuple:
        buf.append(*records.encode_row(seq, 7, 100, 150, 11, seq, 0, -1, -1, "ok", None, None,
                                       [d], []))  # fmt: skip
        heads, descs, _, _ = buf.take()
        return heads, descs, np.frombuffer(heads, np.uint8).ctypes.data

    h, ds, at1 = one(1)
    buf.recycle(h, ds)
    del h, ds
    h, ds, at2 = one(2)
    assert at2 == at1  # given back, nothing reading it: reused
    col = np.ascontiguousarray(np.frombuffer(h, op_dt)["seq"])  # a view (one row)
    buf.recycle(h, ds)
    del h, ds
    h, ds, at3 = one(3)
    assert at3 != at2 and col.tolist() == [2]  # still read: not reused


SHAPES = [(), (5,), (2, 3), (1, 1, 1, 1, 1, 1, 1, 1), (4, 0, 7), (9,), (2**40, 3)]


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize(
    "deep, one_rank",
    [(False, False), (True, False), (False, True), (False, None)],
    ids=["inline", "deep", "one rank", "rank 0"],
)
def test_the_shape_column_of_mixed_ranks(
    engine: str,
    deep: bool,
    one_rank: bool | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of tensors of several ranks (0 to MAX_INLINE_DIMS, a zero and a big
    dimension), and with a deeper shape among them: the native core's shape_lists, or its
    NumPy twin (and the NumPy path wherever a shape is deep); and batches of one rank (the
    twin's slice of the dimensions), scalars' rank 0 among them."""
    from pprobe import recorder, state
    from pprobe.writer import Writer

    if engine == "native" and core.native is None:
        pytest.skip("the native core is not built")
    if engine == "python":
        monkeypatch.setattr(core, "native", None)
    shapes = SHAPES + [tuple(range(1, 12))] if deep else SHAPES
    if one_rank:
        shapes = [(2, 3), (0, 5), (2**40, 1), (7, 7)]
    elif one_rank is None:
        shapes = [()]
    shapes = shapes * 3
    while len(recorder.ops_by_index) < 8:
        recorder.op(f"test.op{len(recorder.ops_by_index)}", "function", "numpy")
    buf = records.Buffer()
    for i, sh in enumerate(shapes):
        d = ("input", "0", struct.pack(f"{len(sh)}q", *sh), "float32", "cpu", None, None,
             None, None)  # fmt: skip
        buf.append(*records.encode_row(i, 7, 0, 1, 11, 0, 0, -1, -1, "ok", None, None, [d], []))
    heads, descs, objs, n = buf.take()
    if engine == "native":  # the C path runs (inline), or declines (deep)
        _, desc_dt = records.numpy_dtypes()
        got = core.native.shape_lists(  # type: ignore[union-attr]
            descs, desc_dt.itemsize, desc_dt.fields["ndim"][1], desc_dt.fields["d0"][1]
        )
        assert (got is None) == deep
    w = Writer(str(tmp_path), "run1", "host", 100, 1.0)
    with state.internal():
        _, t = w._to_batches(heads, descs, objs, n)
    from pprobe.arrowipc import to_pyarrow

    assert [tuple(r["shape"]) for r in to_pyarrow(t).to_pylist()] == shapes


def test_record_sizes_match_the_native_core() -> None:
    op_dt, desc_dt = records.numpy_dtypes()
    assert (op_dt.itemsize, desc_dt.itemsize) == (records.OP_SIZE, records.DESC_SIZE) == (80, 160)
    if NATIVE_BUILT:
        from pprobe import _native

        assert _native.layout() == (records.OP_SIZE, records.DESC_SIZE)


def test_string_ids_are_stable() -> None:
    assert records.strings[records.S_OK] == "ok"
    assert records.strings[records.S_INPUT] == "input"
    assert records.strings[records.S_IDX0 + 5] == "5"
    i = records.sid("a brand new string")
    assert records.sid("a brand new string") == i and records.strings[i] == "a brand new string"


# ---------------------------------------------------------------------- operators (native)
OPERATOR_SCRIPT = """
import numpy as np
a = np.arange(4.0); b = np.ones(4)
r = [a + b, 2 * a, a < b, -a, a @ b, a ** 2, a - 1, ~np.arange(3), +a, 1 < a]
a += 1
c = np.add(a, b)
print(len(r))
"""


def test_operators_are_named_as_operators(tmp_path: Path) -> None:
    r = run_script(tmp_path, OPERATOR_SCRIPT, env={"PPROBE_MODE": "log"}).check()
    got = [(o["op"], o["kind"], o["ufunc"]) for o in ops(r.run_dir, "op like 'numpy.ndarray.%'")]
    names = [g[0].rsplit(".", 1)[1] for g in got if g[1] == "operator"]
    assert names == [
        "__add__", "__rmul__", "__lt__", "__neg__", "__matmul__", "__pow__", "__sub__",
        "__invert__", "__pos__", "__gt__", "__iadd__",
    ], got  # fmt: skip
    # a += 1 describes self and the other operand, not NumPy's out= argument
    iadd = ops(r.run_dir, "op = 'numpy.ndarray.__iadd__'")[0]
    ins = tensors(r.run_dir, f"seq = {iadd['seq']} and role = 'input'")
    assert [t["idx"] for t in ins] == ["0"]
    assert [o["op"] for o in ops(r.run_dir)][-1] == "numpy.add"


@pytest.mark.parametrize("buf", _buffers(), ids=lambda b: type(b).__module__)
def test_a_batch_without_arrays(buf: object, tmp_path: Path) -> None:
    from pprobe import recorder, state
    from pprobe.writer import Writer

    op = recorder.op("test.noarrays", "function", "numpy")
    buf.append(*records.encode_row(5, op.index, 1, 2, 3, 0, 0, -1, -1, "ok", None, None, [],  # type: ignore[attr-defined]
                                   [("0", "x")]))  # fmt: skip
    w = Writer(str(tmp_path), "run1", "host", 100, 1.0)
    with state.internal():
        o, t = w._to_batches(*buf.take())  # type: ignore[attr-defined]
    from pprobe.arrowipc import to_pyarrow

    assert [(r["op"], r["args"]) for r in to_pyarrow(o).to_pylist()] == [("test.noarrays", "0='x'")]
    assert t.num_rows == 0


def test_deep_arrays_among_outputs_are_described(tmp_path: Path) -> None:
    # 1-D inputs, 9-dimensional outputs in a list: past the records' inline shape
    r = run_script(
        tmp_path,
        """
        import numpy as np
        grids = np.meshgrid(*[np.arange(2)] * 9)
        print(len(grids), grids[0].ndim)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert r.out.split() == ["9", "9"]
    (row,) = ops(r.run_dir, "op = 'numpy.meshgrid'")
    outs = tensors(r.run_dir, f"seq = {row['seq']} and role = 'output'")
    assert [(t["idx"], t["shape"]) for t in outs] == [(str(i), [2] * 9) for i in range(9)]


ARGS_SCRIPT = """
import enum
import numpy as np

class Mode(enum.Enum):
    A = 1

a = np.arange(6.0).reshape(2, 3)
a.astype(np.float32)                          # a class
a.astype(np.dtype("float16"), copy=False)     # a dtype, a bool
np.broadcast_to(a[0], (2, 3))                 # a shape of small ints
np.broadcast_to(np.arange(2.0), (1000, 2))    # a shape with a big int
np.reshape(a, (3, 2), order="C")
np.sum(a, axis=(0, 1), keepdims=True)
np.full((2,), 1.5, dtype=np.float64)
np.concatenate([a, a], axis=0)                # a list holding arrays: described as inputs
np.stack((a, a), axis=-1)
np.clip(a, 0.5, 4.5)
np.array(a, copy=np._CopyMode.ALWAYS)         # an object shown by its class
np.asarray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])  # a long list of scalars
np.zeros(3, dtype=[("x", "f4")])              # a structured dtype spec
a[slice(0, 1)].copy()
np.pad(np.arange(3.0), (1, 2), mode="constant")  # a tuple and a str
np.round(a, decimals=Mode.A.value)
"""


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built here")
def test_both_engines_record_the_same_arguments(tmp_path: Path) -> None:
    """Arguments the native core does not describe itself (classes, dtypes, tuples, enums,
    lists) go through values.other_pair: the rows, their inputs and their args texts are the
    Python engine's."""
    got = {}
    for engine in ("native", "python"):
        r = run_script(tmp_path / engine, ARGS_SCRIPT,
                       env={"PPROBE_CORE": engine, "PPROBE_MODE": "log"}).check()  # fmt: skip
        assert meta(r.run_dir)["core"]["engine"] == engine
        rows = ops(r.run_dir)
        got[engine] = [
            (o["op"], o["args"], [(t["role"], t["idx"], t["shape"]) for t in
                                  tensors(r.run_dir, f"seq = {o['seq']}")])
            for o in rows
        ]  # fmt: skip
    assert got["native"] == got["python"]

    def args(op: str) -> list:
        return [a for o, a, _ in got["native"] if o == op]

    assert args("numpy.ndarray.astype") == [
        "1=<class 'numpy.float32'>", "1=dtype('float16'), copy=False"
    ]  # fmt: skip
    assert args("numpy.broadcast_to") == ["1=(2, 3)", "1=(1000, 2)"]
    assert args("numpy.array") == ["copy=<numpy._CopyMode>"]
