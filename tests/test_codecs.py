"""Tensor codecs (pprobe/codecs.py): lossless ones exact bit for bit, lossy ones within the
error they report, dumps written with PPROBE_DUMP_CODEC, rows that say how each dump is stored,
``pprobe.load`` decoding by the file's header, and ``pprobe compare`` bounded by the codecs.

The in-process tests come first; the end-to-end ones run scripts through the bootstrap."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import clean_env, meta, run_script, tensors

import pprobe
from pprobe import codecs, config
from pprobe import compare_metrics as cm


# ---------------------------------------------------------------------- arrays to encode
def _f32_bits(*bits: int) -> np.ndarray:
    return np.array(bits, dtype="<u4").view("<f4")


def _f64_bits(*bits: int) -> np.ndarray:
    return np.array(bits, dtype="<u8").view("<f8")


def _awkward_floats() -> dict[str, np.ndarray]:
    """NaN payloads (quiet, signalling, negative), -0.0, infinities, subnormals, extremes."""
    f32 = _f32_bits(0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x7F800000, 0xFF800000,
                    0x00000001, 0x7F7FFFFF, 0x3F800000, 0)  # fmt: skip
    f64 = _f64_bits(0x7FF8000000000001, 0x7FF0000000000001, 0xFFF8DEADBEEF0001,
                    0x8000000000000000, 0x7FF0000000000000, 0x0000000000000001,
                    0x7FEFFFFFFFFFFFFF, 0)  # fmt: skip
    f16 = np.array([0x7E01, 0x7C01, 0x8000, 0x7C00, 0x0001, 0x7BFF, 0], dtype="<u2").view("<f2")
    return {"f32": f32, "f64": f64, "f16": f16}


def _arrays() -> dict[str, np.ndarray]:
    """Every dtype the dumps support (numpy_arrays.dtype_name), in several layouts."""
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {
        "bool": rng.random(37) < 0.3,
        "datetime64": np.array(["2024-01-01T00:00:00.123", "NaT"], dtype="datetime64[ns]"),
        "timedelta64": np.array([1, -5, 0], dtype="timedelta64[s]"),
        "0-d": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float64),
        "big-endian": np.arange(6, dtype=">f4").reshape(2, 3),
        "strided": np.arange(40, dtype=np.int32).reshape(5, 8)[:, ::3],
        "fortran": np.asfortranarray(rng.standard_normal((3, 4))),
        "unicode": np.array(["a", "bé", ""], dtype="<U2"),
        "bytes": np.array([b"x", b"\x00y"], dtype="S2"),
        "complex64": (rng.standard_normal(9) + 1j * rng.standard_normal(9)).astype(np.complex64),
        "complex128": np.array([complex(0.0, -0.0), complex(math.inf, math.nan)]),
    }
    for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(t)
        out[t] = np.array([info.min, -1 if info.min else 1, 0, info.max], dtype=t)
    for t in ("float16", "float32", "float64"):
        out[t] = rng.standard_normal((4, 5)).astype(t)
    out.update(_awkward_floats())
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert b.dtype == a.dtype and b.shape == a.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


# ---------------------------------------------------------------------- lossless, bit for bit
@pytest.mark.parametrize("codec", ["npy", "zstd", "sparse"])
@pytest.mark.parametrize("key", sorted(_arrays()))
def test_lossless_codecs_are_exact_bit_for_bit(codec: str, key: str) -> None:
    a = _arrays()[key]
    blob, info = codecs.encode(codec, a)
    assert info["max_abs_error"] == 0.0 and not info["lossy"] and info["bytes"] == len(blob)
    _same_bits(a, codecs.decode(blob))


def test_sparse_is_coo_below_the_density_and_zstd_above() -> None:
    n = 1000
    a = np.zeros(n, dtype=np.float32)
    k = int(codecs.SPARSE_DENSITY * n)
    a[:k] = np.arange(1, k + 1)
    a[k - 1] = -0.0  # bits: counted as a non-zero element, restored as -0.0
    blob, info = codecs.encode("sparse", a)
    assert info["codec"] == "sparse" and info["bytes"] < a.nbytes
    assert codecs.header(blob)["nnz"] == k  # type: ignore[index]
    _same_bits(a, codecs.decode(blob))
    a[k] = 1.0  # one more: over the threshold
    blob, info = codecs.encode("sparse", a)
    assert info["codec"] == "zstd" and codecs.header(blob)["codec"] == "zstd"  # type: ignore[index]
    _same_bits(a, codecs.decode(blob))


def test_zstd_compresses_redundant_data() -> None:
    a = np.repeat(np.arange(100, dtype=np.float64), 100)
    blob, info = codecs.encode("zstd", a)
    assert info["bytes"] < a.nbytes / 10


# ---------------------------------------------------------------------- lossy
def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    with np.errstate(invalid="ignore"):  # a signalling NaN raises "invalid" as it is cast
        fa, fb = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    ok = np.isfinite(fa)
    return float(np.max(np.abs(fa[ok] - fb[ok]), initial=0.0))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_int8_error_is_within_half_a_step_and_reported_exactly(dtype: str) -> None:
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((50, 20)) * 3 + 1).astype(dtype)
    a[0, :3] = 0.0
    blob, info = codecs.encode("int8", a)
    head = codecs.header(blob)
    assert head is not None and head["codec"] == "int8" and info["lossy"]
    b = codecs.decode(blob)
    assert b.dtype == a.dtype and b.shape == a.shape
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale = (hi - lo) / 255
    assert head["scale"] == pytest.approx(scale)
    assert info["max_abs_error"] == _max_err(a, b)  # what the file holds, measured
    eps = float(np.finfo(dtype).eps) * max(abs(lo), abs(hi))  # rounding to the dtype
    assert 0 < info["max_abs_error"] <= scale / 2 + eps
    assert (b[0, :3] == 0).all()  # zero is exact (it is a quantization level)
    assert info["bytes"] < a.nbytes or dtype == "float16"


def test_lossy_codecs_keep_nan_inf_and_overflow_exactly() -> None:
    a = np.concatenate([_awkward_floats()["f32"], np.float32([1e6, -7e4, 2.5])])
    for name in ("int8", "fp16", "bf16"):
        blob, info = codecs.encode(name, a)
        b = codecs.decode(blob)
        bad = ~np.isfinite(a)
        bad |= np.abs(a) > 65504 if name == "fp16" else False  # float16's largest finite
        # non-finite values keep their bits (NaN payloads included); overflow is not lost
        assert b[bad].view("<u4").tolist() == a[bad].view("<u4").tolist(), name
        assert codecs.header(blob)["exceptions"] >= int(bad.sum())  # type: ignore[index]
        assert info["max_abs_error"] == _max_err(a, b), name
        assert math.isfinite(info["max_abs_error"])


def test_fp16_is_numpys_float16_rounding() -> None:
    a = np.random.default_rng(2).standard_normal(1000).astype(np.float32) * 100
    blob, info = codecs.encode("fp16", a)
    b = codecs.decode(blob)
    np.testing.assert_array_equal(b, a.astype(np.float16).astype(np.float32))
    assert info["max_abs_error"] == _max_err(a, b) > 0
    h = np.float16([1.5, -2.25])  # float16 in: nothing to lose
    assert codecs.encode("fp16", h)[1]["max_abs_error"] == 0.0


def test_bf16_rounds_to_nearest_even_like_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    # ties (exactly half-way between two bfloat16 values), both parities, and random values
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x4049_8000, 0x3F80_7FFF, 0x3F80_8001],
                    dtype="<u4").view("<f4")  # fmt: skip
    a = np.concatenate([ties, rng.standard_normal(2000).astype(np.float32) * 1e3])
    bits = codecs.bf16_bits(a)
    ref = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view("<u2")
    np.testing.assert_array_equal(bits, ref)
    blob, info = codecs.encode("bf16", a)
    b = codecs.decode(blob)
    np.testing.assert_array_equal(b, torch.from_numpy(a).to(torch.bfloat16).float().numpy())
    assert info["max_abs_error"] == _max_err(a, b)
    assert info["bytes"] < a.nbytes * 0.6


@pytest.mark.parametrize("name", ["int8", "fp16", "bf16"])
def test_lossy_codecs_store_ints_bools_and_complex_losslessly(name: str) -> None:
    for a in (np.arange(-5, 300, dtype=np.int16), np.array([True, False]),
              np.array([1 + 2j], dtype=np.complex64)):  # fmt: skip
        blob, info = codecs.encode(name, a)
        assert info["codec"] == "zstd" and info["max_abs_error"] == 0.0
        _same_bits(a, codecs.decode(blob))


# ---------------------------------------------------------------------- the registry
def test_register_a_codec_and_decode_by_header() -> None:
    def enc(a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        return np.round(a.astype(np.float64), 1).astype(np.float32).tobytes(), {"digits": 1}

    def dec(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
        assert params == {"digits": 1}
        return np.frombuffer(payload, dtype=np.float32).astype(dtype).reshape(shape)

    codecs.register("round1", enc, dec, lossy=True)
    try:
        a = np.array([[0.04, 1.26], [-3.333, 10.0]])
        blob, info = codecs.encode("round1", a)
        b = codecs.decode(blob)
        assert info["codec"] == "round1" and codecs.is_lossy("round1")
        np.testing.assert_allclose(b, [[0.0, 1.3], [-3.3, 10.0]], rtol=1e-6)
        assert info["max_abs_error"] == _max_err(a, b)
        assert "round1" in codecs.names()
    finally:
        codecs._REGISTRY.pop("round1")
    with pytest.raises(ValueError, match="round1.*not registered"):
        codecs.decode(blob)
    with pytest.raises(ValueError, match="built in"):
        codecs.register("zstd", enc, dec)
    with pytest.raises(ValueError, match="a-z0-9_"):
        codecs.register("Bad name", enc, dec)
    with pytest.raises(ValueError, match="unknown codec"):
        codecs.encode("nope", a)
    with pytest.raises(ValueError, match="not a pprobe dump"):
        codecs.decode(b"garbage bytes")


def test_codec_setting_is_checked() -> None:
    assert config.load(env={"PPROBE_DUMP_CODEC": "ZSTD"}).dump_codec == "zstd"
    assert config.load(env={}).dump_codec == "npy"
    with pytest.raises(config.ConfigError, match="PPROBE_DUMP_CODEC=.*allowed: npy, zstd"):
        config.load(env={"PPROBE_DUMP_CODEC": "z std!"})


def test_bounded_comparison_passes_only_with_the_codec_bound() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal(4096).astype(np.float32)
    b = codecs.decode(codecs.encode("int8", a)[0])
    err = codecs.encode("int8", a)[1]["max_abs_error"]
    rtol, atol = cm.dtype_tolerance("float32")
    plain = cm.compare_arrays(a, b, rtol, atol, "float32", "float32")
    bounded = cm.compare_arrays(a, b, rtol, atol + err, "float32", "float32")
    assert plain is not None and bounded is not None
    assert plain.ratio is not None and plain.ratio > 10  # a divergence without the bound
    assert bounded.ratio is not None and bounded.ratio <= 1.0


# ---------------------------------------------------------------------- end to end
PROG = """
import numpy as np
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 64)).astype(np.float32)
w = rng.standard_normal((64, 32)).astype(np.float32)
h = np.maximum(x @ w, 0)
y = np.tanh(h)
k = np.arange(1000) % 7
s = np.zeros(5000, dtype=np.float64); s[::100] = 1.5
t = np.multiply(s, 2)
"""


def _expected() -> dict[str, np.ndarray]:
    """The program's values, computed here without the probe."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    h = np.maximum(x @ w, 0)
    s = np.zeros(5000, dtype=np.float64)
    s[::100] = 1.5
    return {"h": h, "y": np.tanh(h), "k": np.arange(1000) % 7, "s": s, "t": s * 2}


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return tensors(run_dir, "dump_path IS NOT NULL")


def _run(tmp_path: Path, codec: str | None) -> Path:
    env = {"PPROBE_DUMP_CODEC": codec} if codec else {}
    r = run_script(tmp_path / (codec or "default"), PROG, env=env).check()
    return r.run_dir


def _output(run_dir: Path, op: str) -> dict[str, Any]:
    from helpers import sql

    (row,) = sql(
        run_dir,
        "SELECT t.* FROM tensors t JOIN ops o USING (pid, seq) "
        f"WHERE o.op = '{op}' AND t.role = 'output'",
    )
    return row


@pytest.mark.parametrize("codec", ["zstd", "sparse"])
def test_a_lossless_run_is_read_back_exactly(tmp_path: Path, codec: str) -> None:
    run_dir = _run(tmp_path, codec)
    rows = _rows(run_dir)
    assert rows
    for row in rows:
        path = run_dir / row["dump_path"]
        assert row["dump_path"].endswith(".npy." + codec)
        assert row["dump_max_abs_error"] == 0.0
        assert row["dump_bytes"] == codecs.stored_size(path)  # a file or a pack entry
        head = codecs.header(codecs.read_bytes(path))
        assert head is not None and row["dump_codec"] == head["codec"]
        assert row["dump_codec"] in ({"zstd"} if codec == "zstd" else {"sparse", "zstd"})
    exp = _expected()
    for op, key in (("numpy.maximum", "h"), ("numpy.tanh", "y"), ("numpy.multiply", "t")):
        row = _output(run_dir, op)
        _same_bits(exp[key], pprobe.load(str(run_dir / row["dump_path"])))
    if codec == "sparse":  # t is 1% non-zero: COO; y (dense) falls back to zstd
        assert _output(run_dir, "numpy.multiply")["dump_codec"] == "sparse"
        assert _output(run_dir, "numpy.tanh")["dump_codec"] == "zstd"
        t = _output(run_dir, "numpy.multiply")
        assert t["dump_bytes"] < exp["t"].nbytes / 10
    m = meta(run_dir)["dumps"]
    assert m["codec"] == codec and m["writer"] == "python"
    from pprobe import packs

    files = [p for p in os.listdir(run_dir) if ".npy" in p]
    files += [n for n in packs.names(str(run_dir)) if ".npy" in n]  # small dumps: packed
    assert files and all(p.endswith(".npy." + codec) for p in files)


def test_the_default_stays_plain_npy(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, None)
    rows = _rows(run_dir)
    assert rows and all(r["dump_path"].endswith(".npy") for r in rows)
    assert {r["dump_codec"] for r in rows} == {"npy"}
    assert {r["dump_max_abs_error"] for r in rows} == {0.0}
    for r in rows:  # unchanged files: NumPy reads them as they are
        assert codecs.header(codecs.read_bytes(run_dir / r["dump_path"])[:64]) is None
    np.testing.assert_array_equal(
        codecs.load(run_dir / _output(run_dir, "numpy.tanh")["dump_path"]), _expected()["y"]
    )
    assert meta(run_dir)["dumps"]["codec"] == "npy"


def _compare(a: Path, b: Path, *extra: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "compare", str(a), str(b), "--format", "json", *extra],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def test_an_int8_run_against_the_npy_run(tmp_path: Path) -> None:
    ref = _run(tmp_path, None)
    q = _run(tmp_path, "int8")
    by_key = {(r["seq"], r["role"], r["idx"]): r for r in _rows(ref)}
    lossy = 0
    for r in _rows(q):
        assert r["dump_path"].endswith(".npy.int8")
        a = codecs.load(ref / by_key[(r["seq"], r["role"], r["idx"])]["dump_path"])
        b = pprobe.load(str(q / r["dump_path"]))
        assert b.dtype == a.dtype and b.shape == a.shape
        if a.dtype.kind == "f":
            assert r["dump_codec"] == "int8"
            # the error the row states is the one in the file, measured here independently
            assert r["dump_max_abs_error"] == _max_err(a, b)
            lossy += r["dump_max_abs_error"] > 0
        else:
            assert r["dump_codec"] == "zstd" and r["dump_max_abs_error"] == 0.0
            np.testing.assert_array_equal(a, b)
        assert r["dump_bytes"] == codecs.stored_size(q / r["dump_path"])  # file or pack entry
    assert lossy >= 4
    # the same values seen through int8: no divergence, and the report says why
    doc = _compare(ref, q, "--fail-on", "warn")
    assert doc["summary"]["fail"] == doc["summary"]["warn"] == 0
    assert doc["summary"]["codec_bounded"] >= lossy
    text = subprocess.run(
        [sys.executable, "-m", "pprobe", "compare", str(ref), str(q)],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    ).stdout  # fmt: skip
    assert "within a lossy codec's error bound" in text
    # the bound matters: without it the int8 values diverge from the float32 ones
    row = _output(q, "numpy.tanh")
    shown = subprocess.run(
        [sys.executable, "-m", "pprobe", "show", str(row["seq"]), "--run", str(q)],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    ).stdout  # fmt: skip
    assert f"int8, max abs error {row['dump_max_abs_error']:.3g}" in shown
    a = codecs.load(ref / _output(ref, "numpy.tanh")["dump_path"])
    b = pprobe.load(str(q / row["dump_path"]))
    rtol, atol = cm.dtype_tolerance("float32")
    plain = cm.compare_arrays(a, b, rtol, atol, "float32", "float32")
    assert plain is not None and plain.ratio is not None and plain.ratio > 10


def test_bounded_pairs_are_saved_with_their_bound(tmp_path: Path) -> None:
    from pprobe import compare as C

    ref = _run(tmp_path, None)
    q = _run(tmp_path, "fp16")
    c = C.compare(str(ref), str(q))
    rows = [r for r in C.rows(c) if r.get("codec_bound") is not None]
    assert rows and all(r["codecs"] == "fp16" for r in rows)
    errs = {r["seq"]: r["dump_max_abs_error"] for r in _rows(q) if r["role"] == "output"}
    for r in rows:
        assert r["tensor_verdict"] == "pass" and r["error_ratio"] <= 1.0
        if r["role"] == "output" and r["b_seq"] in errs:
            assert r["codec_bound"] == errs[r["b_seq"]]  # A (npy) adds 0


REGISTERING = """
import numpy as np
import pprobe.codecs as pc

def enc(a):
    return np.round(a, 1).astype(np.float32).tobytes(), {}

def dec(payload, dtype, shape, params):
    return np.frombuffer(payload, dtype=np.float32).astype(dtype).reshape(shape)

pc.register("round1", enc, dec, lossy=True)
x = np.linspace(-1, 1, 101)
y = np.multiply(x, 3)
"""


def test_a_codec_the_program_registers(tmp_path: Path) -> None:
    r = run_script(tmp_path, REGISTERING, env={"PPROBE_DUMP_CODEC": "round1"}).check()
    row = _output(r.run_dir, "numpy.multiply")
    assert row["dump_path"].endswith(".npy.round1") and row["dump_codec"] == "round1"
    x = np.linspace(-1, 1, 101) * 3
    stored = np.round(x, 1).astype(np.float32).astype(np.float64)
    assert row["dump_max_abs_error"] == _max_err(x, stored)
    with pytest.raises(ValueError, match="round1"):  # not registered in this process
        pprobe.load(str(r.run_dir / row["dump_path"]))


def test_an_unknown_codec_falls_back_to_npy_with_a_warning(tmp_path: Path) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE_DUMP_CODEC": "nosuch"}).check()
    assert "dump codec 'nosuch' failed" in r.err and "plain .npy" in r.err
    row = _output(r.run_dir, "numpy.tanh")
    assert row["dump_codec"] == "npy" and row["dump_path"].endswith(".npy.nosuch")
    np.testing.assert_array_equal(codecs.load(r.run_dir / row["dump_path"]), _expected()["y"])


def test_a_run_of_schema_version_1_reads_null_codec_columns(tmp_path: Path) -> None:
    import pyarrow as pa

    from pprobe import schema
    from pprobe.query import run_sql

    new = ("dump_codec", "dump_max_abs_error", "dump_bytes")
    old = pa.schema([f for f in schema.TENSORS if f.name not in new])
    assert "dump_codec" not in old.names and "dump_path" in old.names
    (tmp_path / "log").mkdir()
    cols = [pa.nulls(1, f.type) for f in old]
    cols[old.get_field_index("seq")] = pa.array([3], pa.int64())
    cols[old.get_field_index("dump_path")] = pa.array(["op_numpy.add_output_1-3.npy"])
    batch = pa.RecordBatch.from_arrays(cols, schema=old)
    with pa.OSFile(str(tmp_path / "log" / "tensors-h-1.arrows"), "wb") as f:
        with pa.ipc.new_stream(f, old.with_metadata({"pprobe.schema_version": "1"})) as w:
            w.write_batch(batch)
    names, rows = run_sql(
        "SELECT seq, dump_path, dump_codec, dump_max_abs_error, dump_bytes FROM tensors",
        str(tmp_path),
    )
    assert rows == [(3, "op_numpy.add_output_1-3.npy", None, None, None)]
