"""Tensor codecs: how a dump's values are stored on disk (docs/codecs.md).

Built in: ``npy`` (a plain .npy file, the default), ``zstd`` (lossless), ``sparse`` (lossless
COO when few elements are non-zero), ``int8`` (per-tensor scale and zero point), ``fp16`` and
``bf16`` (downcasts). ``register(name, encode, decode, lossy=...)`` adds one.

Every codec but ``npy`` writes one self-describing layout, so a file says how to read it::

    magic  b"\\x93PPCODEC"                 8 bytes
    version                                1 byte (1)
    header length                          4 bytes, little-endian
    header  a Python literal dict, UTF-8:  {'codec': 'int8', 'descr': '<f4', 'shape': (3, 4),
            'payload': n, 'exceptions': k, ...the codec's parameters}
    payload                                n bytes: what the codec's encode returned
    exceptions                             k int64 flat indices, then k values in the dtype

Lossy codecs see floating arrays only (others are stored with ``zstd``), with NaN and infinities
replaced by 0; those elements, and any finite element the codec turns into a NaN or an infinity
(float16 overflow), are stored exactly as exceptions. ``max_abs_error`` is measured on the
encoded result (a decode at encode time), never estimated.
"""

from __future__ import annotations

import io
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"\x93PPCODEC"
NPY_MAGIC = b"\x93NUMPY"
VERSION = 1
#: ``sparse`` stores COO when at most this fraction of the elements is non-zero (by bits:
#: -0.0 counts as non-zero); above it the array is stored with ``zstd``.
SPARSE_DENSITY = 0.25
#: The codec a lossy or unsuited codec falls back to (lossless).
FALLBACK = "zstd"
_NAME = re.compile(r"^[a-z0-9_]{1,32}$")

Encode = Callable[[np.ndarray], "tuple[bytes, dict[str, Any]] | None"]
Decode = Callable[[bytes, np.dtype, tuple, dict], np.ndarray]


@dataclass(frozen=True)
class Codec:
    """A registered codec. ``encode(array)`` returns (payload, parameters) or None (not suited:
    the array is stored with :data:`FALLBACK`); ``decode(payload, dtype, shape, parameters)``
    returns the array. Parameters are ints, floats (finite), strings or tuples of them."""

    name: str
    encode: Encode
    decode: Decode
    lossy: bool = False


_REGISTRY: dict[str, Codec] = {}
BUILTIN = ("npy", "zstd", "sparse", "int8", "fp16", "bf16")


def register(name: str, encode: Encode, decode: Decode, lossy: bool = False) -> None:
    """Add a codec (``PPROBE_DUMP_CODEC=name`` then selects it). Built-in names cannot be
    replaced; a name is 1 to 32 characters of ``[a-z0-9_]``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"codec name {name!r}: 1 to 32 characters of [a-z0-9_]")
    if name in BUILTIN:
        raise ValueError(f"codec {name!r} is built in and cannot be replaced")
    _REGISTRY[name] = Codec(name, encode, decode, bool(lossy))


def names() -> tuple[str, ...]:
    """Every codec this process knows: the built-in ones, then the registered ones."""
    return BUILTIN + tuple(n for n in _REGISTRY if n not in BUILTIN)


def is_lossy(name: str) -> bool:
    c = _REGISTRY.get(name)
    return c is not None and c.lossy


# ---------------------------------------------------------------------- encode / decode
def encode(name: str, array: Any) -> tuple[bytes, dict[str, Any]]:
    """``array`` encoded with codec ``name``: (file bytes, info). info: ``codec`` (the one
    used: a fallback may replace the one asked for), ``lossy``, ``max_abs_error`` (0 for
    lossless), ``bytes`` (encoded size) and ``raw_bytes`` (the array's)."""
    a = np.asarray(array)
    if a.dtype.hasobject:
        raise ValueError("object arrays cannot be encoded")
    if name == "npy":
        from .dumps import npy_header

        blob = npy_header(a.dtype, a.shape) + a.tobytes()  # tobytes: C order
        return blob, _info("npy", False, 0.0, blob, a)
    codec = _REGISTRY.get(name)
    if codec is None:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(names())}")
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # not np.ascontiguousarray: it makes a 0-d array 1-d
    if codec.lossy and a.dtype.kind != "f":
        codec = _REGISTRY[FALLBACK]  # ints, bools, complex: lossless
    if codec.lossy:
        return _encode_lossy(codec, a)
    got = codec.encode(a)
    if got is None:
        return _encode_fallback(a)
    blob = _pack(codec.name, a, got[0], got[1])
    return blob, _info(codec.name, False, 0.0, blob, a)


def _encode_fallback(a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    """``a`` by the lossless fallback codec (a codec declined it)."""
    fb = _REGISTRY[FALLBACK]
    got = fb.encode(a)
    assert got is not None
    blob = _pack(fb.name, a, got[0], got[1])
    return blob, _info(fb.name, False, 0.0, blob, a)


def _info(codec: str, lossy: bool, err: float, blob: bytes, a: np.ndarray) -> dict[str, Any]:
    return {
        "codec": codec,
        "lossy": lossy,
        "max_abs_error": err,
        "bytes": len(blob),
        "raw_bytes": int(a.nbytes),
    }


def _encode_lossy(codec: Codec, a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    flat = a.reshape(-1)
    bad = ~np.isfinite(flat)
    work = a
    if bad.any():
        w = flat.copy()
        w[bad] = 0
        work = w.reshape(a.shape)
    got = codec.encode(work)
    if got is None:
        return _encode_fallback(a)
    payload, params = got
    dec = np.asarray(codec.decode(payload, a.dtype, a.shape, params)).reshape(-1)
    # Elements the codec cannot hold are kept exactly: NaN/inf, and values it turns into one.
    exc = bad | ~np.isfinite(dec)
    idx = np.flatnonzero(exc)
    err = 0.0
    if idx.size < flat.size:
        ok = ~exc
        d = np.abs(dec[ok].astype(np.float64) - flat[ok].astype(np.float64))
        err = float(d.max()) if d.size else 0.0
    blob = _pack(codec.name, a, payload, params, idx, flat[idx])
    return blob, _info(codec.name, True, err, blob, a)


def _pack(
    name: str,
    a: np.ndarray,
    payload: bytes,
    params: dict[str, Any],
    exc_idx: np.ndarray | None = None,
    exc_vals: np.ndarray | None = None,
) -> bytes:
    from numpy.lib import format as npformat

    k = 0 if exc_idx is None else int(exc_idx.size)
    head = {
        **params,
        "codec": name,
        "descr": npformat.dtype_to_descr(a.dtype),
        "shape": tuple(int(x) for x in a.shape),
        "payload": len(payload),
        "exceptions": k,
    }
    for v in params.values():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"codec {name}: parameter {v!r} is not finite")
    text = repr(head).encode("utf-8")
    parts = [MAGIC, bytes([VERSION]), len(text).to_bytes(4, "little"), text, bytes(payload)]
    if k:
        assert exc_idx is not None and exc_vals is not None
        parts += [exc_idx.astype("<i8").tobytes(), exc_vals.tobytes()]
    return b"".join(parts)


def header(data: bytes | memoryview) -> dict[str, Any] | None:
    """The header of an encoded dump (None for a .npy file)."""
    data = memoryview(data)
    if bytes(data[:6]) == NPY_MAGIC:
        return None
    if bytes(data[:8]) != MAGIC:
        raise ValueError("not a pprobe dump: neither .npy nor a pprobe codec file")
    if data[8] != VERSION:
        raise ValueError(f"codec file version {data[8]} is not supported (this pprobe reads 1)")
    import ast  # on demand: the writer thread never needs it

    n = int.from_bytes(data[9:13], "little")
    head = ast.literal_eval(bytes(data[13 : 13 + n]).decode("utf-8"))
    if not isinstance(head, dict) or "codec" not in head:
        raise ValueError("damaged codec header")
    head["_offset"] = 13 + n
    return head


def decode(data: bytes | memoryview) -> np.ndarray:
    """The array a dump file's bytes hold, whatever codec wrote them (the header says)."""
    head = header(data)
    if head is None:
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)  # type: ignore[no-any-return]
    from numpy.lib import format as npformat

    name = head.pop("codec")
    codec = _REGISTRY.get(name)
    if codec is None:
        raise ValueError(f"this dump was written with codec {name!r}, not registered here")
    dtype = npformat.descr_to_dtype(head.pop("descr"))
    shape = tuple(head.pop("shape"))
    start = head.pop("_offset")
    n, k = head.pop("payload"), head.pop("exceptions")
    mv = memoryview(data)
    payload = bytes(mv[start : start + n])
    arr = np.asarray(codec.decode(payload, dtype, shape, head)).reshape(shape)
    if not arr.flags.writeable or not arr.flags.c_contiguous or arr.dtype != dtype:
        arr = np.array(arr, dtype=dtype, order="C")
    if k:
        at = start + n
        idx = np.frombuffer(mv[at : at + 8 * k], dtype="<i8")
        vals = np.frombuffer(mv[at + 8 * k : at + 8 * k + k * dtype.itemsize], dtype=dtype)
        arr.reshape(-1)[idx] = vals
    return arr


def load(path: str | os.PathLike, mmap: bool = False) -> np.ndarray:
    """A dump file as its array: a .npy file is read by NumPy (memory-mapped with ``mmap``),
    any other is decoded by the codec its header names. A name that is not a file is looked up
    in its folder's packs (small dumps, pprobe.packs); ``mmap`` does not apply to those."""
    packed = _packed(path)
    if packed is not None:
        if packed[:6] == NPY_MAGIC:
            return np.load(io.BytesIO(packed), allow_pickle=False)  # type: ignore[no-any-return]
        return decode(packed)
    with open(path, "rb") as f:
        start = f.read(8)
        if start[:6] == NPY_MAGIC:
            f.close()
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)  # type: ignore[no-any-return]
        data = start + f.read()
    return decode(data)


def _packed(path: str | os.PathLike) -> bytes | None:
    """The bytes of a dump held in a pack (pprobe.packs): ``path`` is not a regular file (a
    symlink planted at a packed dump's name does not shadow the packed dump)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except OSError:
        pass
    from . import packs

    return packs.read(path)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a dump, from its file or its folder's packs (FileNotFoundError: neither)."""
    packed = _packed(path)
    if packed is not None:
        return packed
    with open(path, "rb") as f:
        return f.read()


def exists(path: str | os.PathLike) -> bool:
    """Whether a dump can be read: a file, or an entry of its folder's packs."""
    if os.path.isfile(path):
        return True
    from . import packs

    folder, name = os.path.split(os.fspath(path))
    return packs.find(folder or ".", name) is not None or packs.read(path) is not None


def stored_size(path: str | os.PathLike) -> int:
    """The bytes a dump takes (its file's size, or its pack entry's payload); 0: not found."""
    try:
        return os.path.getsize(path)
    except OSError:
        pass
    from . import packs

    folder, name = os.path.split(os.fspath(path))
    e = packs.find(folder or ".", name)
    return e.length if e is not None else 0


def codec_of(path: str | os.PathLike) -> str:
    """The codec a dump file was written with (``npy`` for a .npy file)."""
    packed = _packed(path)
    if packed is not None:
        head = header(packed[: 1 << 16])
        return "npy" if head is None else str(head["codec"])
    with open(path, "rb") as f:
        start = f.read(1 << 16)
    head = header(start)
    return "npy" if head is None else str(head["codec"])


# ---------------------------------------------------------------------- built-in codecs
def _size(dtype: np.dtype, shape: tuple) -> int:
    return int(dtype.itemsize * math.prod(shape))


def _zstd_encode(a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    import pyarrow as pa

    if not a.nbytes:
        return b"", {}
    return pa.compress(a.reshape(-1).view(np.uint8), codec="zstd", asbytes=True), {}


def _zstd_decode(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
    import pyarrow as pa

    size = _size(dtype, shape)
    if not size:
        return np.empty(shape, dtype=dtype)
    raw = pa.decompress(payload, decompressed_size=size, codec="zstd", asbytes=True)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _nonzero(a: np.ndarray) -> np.ndarray:
    """Flat mask of the elements whose bits are not all zero (-0.0 is non-zero here: the
    codec is exact bit for bit)."""
    flat = a.reshape(-1)
    if a.dtype.itemsize in (1, 2, 4, 8):
        return np.not_equal(flat.view(f"u{a.dtype.itemsize}"), 0)
    return np.asarray(flat.view(np.uint8).reshape(flat.size, a.dtype.itemsize).any(axis=1))


def _sparse_encode(a: np.ndarray) -> tuple[bytes, dict[str, Any]] | None:
    if not a.size:
        return None
    mask = _nonzero(a)
    nnz = int(np.count_nonzero(mask))
    if nnz > SPARSE_DENSITY * a.size:
        return None
    index = "<i4" if a.size < 2**31 else "<i8"
    idx = np.flatnonzero(mask).astype(index)
    vals = a.reshape(-1)[mask]
    return idx.tobytes() + vals.tobytes(), {"nnz": nnz, "index": index}


def _sparse_decode(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
    nnz = int(params["nnz"])
    it = np.dtype(params["index"])
    out = np.zeros(math.prod(shape), dtype=dtype)
    idx = np.frombuffer(payload, dtype=it, count=nnz)
    out[idx] = np.frombuffer(payload, dtype=dtype, count=nnz, offset=nnz * it.itemsize)
    return out.reshape(shape)


def _int8_encode(a: np.ndarray) -> tuple[bytes, dict[str, Any]] | None:
    """Affine quantization (as torch.quantize_per_tensor with a min-max observer): the range
    [min(x, 0), max(x, 0)] onto -128..127, so 0 is exact."""
    x = a.astype(np.float64).reshape(-1)
    lo = min(float(x.min()), 0.0) if x.size else 0.0
    hi = max(float(x.max()), 0.0) if x.size else 0.0
    scale = (hi - lo) / 255.0
    if not math.isfinite(scale):
        return None  # a float64 range wider than float64: stored losslessly
    if scale == 0.0:
        scale, zp = 1.0, 0
    else:
        zp = int(min(127, max(-128, round(-128 - lo / scale))))
    q = np.clip(np.rint(x / scale) + zp, -128, 127).astype(np.int8)
    return q.tobytes(), {"scale": scale, "zero_point": zp}


def _int8_decode(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
    q = np.frombuffer(payload, dtype=np.int8).astype(np.float64)
    x = (q - params["zero_point"]) * params["scale"]
    return x.astype(dtype).reshape(shape)


def _fp16_encode(a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    with np.errstate(over="ignore"):  # overflow becomes inf, then an exception (exact)
        return a.astype("<f2").tobytes(), {}


def _fp16_decode(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
    return np.frombuffer(payload, dtype="<f2").astype(dtype).reshape(shape)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """bfloat16 bits of finite ``a``: the upper 16 bits of float32, rounded to nearest even."""
    with np.errstate(over="ignore"):
        u = np.ascontiguousarray(a, dtype="<f4").view("<u4").reshape(-1).astype(np.uint64)
    # rounding bias 0x7FFF plus the lowest kept bit: ties go to the even result
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # type: ignore[no-any-return]


def _bf16_encode(a: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    return bf16_bits(a).tobytes(), {}


def _bf16_decode(payload: bytes, dtype: np.dtype, shape: tuple, params: dict) -> np.ndarray:
    u = np.frombuffer(payload, dtype="<u2").astype("<u4") << 16
    return u.view("<f4").astype(dtype).reshape(shape)  # type: ignore[no-any-return]


for _c in (
    Codec("zstd", _zstd_encode, _zstd_decode),
    Codec("sparse", _sparse_encode, _sparse_decode),
    Codec("int8", _int8_encode, _int8_decode, lossy=True),
    Codec("fp16", _fp16_encode, _fp16_decode, lossy=True),
    Codec("bf16", _bf16_encode, _bf16_decode, lossy=True),
):
    _REGISTRY[_c.name] = _c
