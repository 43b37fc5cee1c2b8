"""The pack writer's CRC-32 (pprobe/_dumpio.c): carry-less multiplication folding where the CPU
has PCLMULQDQ and SSE4.1, slicing by 8 elsewhere and for short inputs. Both implementations
(``_dumpio.crc32(..., portable=False / True)``) must give zlib.crc32's values on every input:
each length from 0 to 300, lengths around the folding's 16/64-byte steps, random lengths up to
a few MiB, every start offset within 16 bytes, chained values, constant data."""

from __future__ import annotations

import os
import platform
import random
import zlib
from typing import Any

import pytest

from pprobe import core

dumpio: Any = core.dumpio()
pytestmark = pytest.mark.skipif(dumpio is None, reason="PPROBE_CORE=python: no native module")

PATHS = [False, True]  # portable: folding where the CPU allows it, then the tables only
IDS = ["dispatch", "tables"]
VALUES = (0, 1, 0xFFFFFFFF, 0x12345678)


def _data(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not os.path.exists("/proc/cpuinfo"),
    reason="the folding is built for x86-64 only; CPU flags read from /proc/cpuinfo",
)
def test_folding_dispatch_follows_the_cpu() -> None:
    """On x86-64 the folding runs exactly where the CPU has PCLMULQDQ and SSE4.1, so the
    comparisons below test it there."""
    flags = _cpu_flags()
    assert dumpio.CRC_CLMUL == int("pclmulqdq" in flags and "sse4_1" in flags)


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
def test_every_length_to_300(portable: bool) -> None:
    for n in range(301):
        d = _data(n)
        for v in VALUES:
            assert dumpio.crc32(d, v, portable) == zlib.crc32(d, v), (n, v)
    assert dumpio.crc32(b"", portable=portable) == 0
    assert dumpio.crc32(b"", 0xDEADBEEF, portable) == 0xDEADBEEF


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
def test_lengths_around_block_boundaries(portable: bool) -> None:
    for base in (64, 112, 128, 176, 192, 256, 512, 1024, 4096, 65536):
        for n in range(base - 17, base + 18):
            d = _data(n, 1)
            assert dumpio.crc32(d, portable=portable) == zlib.crc32(d), n
            assert dumpio.crc32(d, 0x9ABCDEF0, portable) == zlib.crc32(d, 0x9ABCDEF0), n


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
def test_random_lengths_up_to_mebibytes(portable: bool) -> None:
    rng = random.Random(5)
    lengths = [rng.randrange(1 << 12) for _ in range(40)]
    lengths += [rng.randrange(1 << 22) for _ in range(6)] + [(1 << 22) + 13]
    for n in lengths:
        d = _data(n, 2)
        v = rng.getrandbits(32)
        assert dumpio.crc32(d, v, portable) == zlib.crc32(d, v), n


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
def test_unaligned_starts(portable: bool) -> None:
    """Slices starting at every offset within 16 bytes (memoryview: no copy, the pointer
    itself is unaligned), several lengths each."""
    buf = memoryview(_data(9000, 3))
    for off in range(16):
        for n in (0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1000, 8191):
            s = buf[off : off + n]
            assert dumpio.crc32(s, 7, portable) == zlib.crc32(s, 7), (off, n)


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
def test_chained_values(portable: bool) -> None:
    """crc(b, crc(a)) == crc(a + b), cut anywhere, as the writer chains head, name, payload."""
    d = _data(5000, 4)
    whole = zlib.crc32(d)
    for cut in list(range(0, 70)) + [127, 128, 129, 1000, 2047, 4095, 4999, 5000]:
        a, b = d[:cut], d[cut:]
        assert dumpio.crc32(b, dumpio.crc32(a, 0, portable), portable) == whole, cut
    # three pieces of the writer's shapes: a 16-byte head, a name, a payload
    head, name, payload = _data(16, 5), b"pprobe/seed/name-17.npy", _data(3000, 6)
    c = dumpio.crc32(head, 0, portable)
    c = dumpio.crc32(name, c, portable)
    c = dumpio.crc32(payload, c, portable)
    assert c == zlib.crc32(head + name + payload)


@pytest.mark.parametrize("portable", PATHS, ids=IDS)
@pytest.mark.parametrize("byte", [0x00, 0xFF])
def test_constant_data(portable: bool, byte: int) -> None:
    for n in (1, 4, 16, 31, 32, 48, 64, 65, 128, 300, 4096, 1 << 20):
        d = bytes([byte]) * n
        for v in VALUES:
            assert dumpio.crc32(d, v, portable) == zlib.crc32(d, v), (n, v)


def test_buffers_and_errors() -> None:
    """Any contiguous buffer, as zlib.crc32; the value wraps as zlib's does."""
    d = _data(1000, 7)
    want = zlib.crc32(d)
    assert dumpio.crc32(bytearray(d)) == want
    assert dumpio.crc32(memoryview(d).cast("I", (250,))) == want
    assert dumpio.crc32(data=d, value=0, portable=True) == want
    assert dumpio.crc32(d, (1 << 32) + 5) == zlib.crc32(d, (1 << 32) + 5)
    with pytest.raises(TypeError):
        dumpio.crc32("text")
    with pytest.raises(BufferError):
        dumpio.crc32(memoryview(d)[::2])
    with pytest.raises(BufferError):
        zlib.crc32(memoryview(d)[::2])
