"""Pack files (pprobe/packs.py, PPROBE_DUMP_PACK): small dumps appended to one file per process.

End to end through the bootstrap: values bit-exact through pprobe.load for packed and plain
dumps (both engines in one session), dedup aliases, kill -9, export --npy, threshold 0 (the
session's engine, PPROBE_CORE: CI runs the suite under both). In-process: the entry
framing (a cut or damaged tail is ignored), the native and Python writers appending the same
bytes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import BOOTSTRAP, PYTHON, clean_env, meta, run_script, sql, tensors

import pprobe
from pprobe import core, dumps, packs

ENGINES = ["native", "python"] if core.dumpio() is not None else ["python"]

# The arrays the script below dumps, rebuilt here independently of the run.
_ARRAYS = """
import numpy as np
rng = np.random.default_rng(7)
arrays = [
    rng.standard_normal((3, 5)).astype(np.float32),
    rng.standard_normal(40),
    rng.integers(-100, 100, size=17).astype(np.int8),
    rng.integers(0, 60000, size=(2, 9)).astype(np.uint16),
    rng.random(13) > 0.5,
    (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64),
    rng.standard_normal(11).astype(np.float16),
    np.array(3.25),
    np.zeros((0, 4), dtype=np.float64),
    np.array([np.nan, -0.0, np.inf, -np.inf, 5e-324]),
    rng.standard_normal(140_000),  # 1.1 MB: more than the 1 MiB threshold, a file
]
"""


def _expected() -> list[np.ndarray]:
    ns: dict = {}
    exec(_ARRAYS, ns)
    return ns["arrays"]  # type: ignore[no-any-return]


def _copies(run_dir: Path) -> list[dict]:
    """The output rows of the script's np.copy calls, in call order."""
    return sql(
        run_dir,
        "SELECT t.* FROM tensors t JOIN ops o USING (pid, seq) "
        "WHERE o.op = 'numpy.copy' AND t.role = 'output' ORDER BY t.seq",
    )


def _entry_versions(pack: Path) -> dict[str, int]:
    """name -> version of each entry of a pack (walked by the format, not by pprobe.packs)."""
    raw, at, out = pack.read_bytes(), 0, {}
    while at < len(raw):
        _, version, _, nlen, plen, _, _ = packs.HEAD.unpack_from(raw, at)
        out[raw[at + 24 : at + 24 + nlen].decode()] = version
        at += 24 + nlen + (16 if version == 2 else 0) + plen
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_and_plain_dumps_load_bit_exact(tmp_path: Path, engine: str) -> None:
    r = run_script(
        tmp_path,
        _ARRAYS + "for a in arrays:\n    np.copy(a)\n",
        env={"PPROBE_CORE": engine},
    ).check()
    run_dir = r.run_dir
    m = meta(run_dir)
    assert m["core"]["dumps"] == engine
    rows = _copies(run_dir)
    want = _expected()
    assert len(rows) == len(want)
    for x, a in zip(rows, want):
        path = run_dir / x["dump_path"]
        packed = a.nbytes + 128 <= 64 * 1024
        assert path.is_file() != packed, x["dump_path"]  # small: in a pack; large: a file
        assert _same(pprobe.load(str(path)), a)  # through the central loader
        assert _same(pprobe.load(x, str(run_dir)), a)  # a tensors row
        assert _same(pprobe.load(x["seq"], str(run_dir)), a)  # a call's seq
    pack_files = list((run_dir / ".packs").iterdir())
    assert len(pack_files) == 1
    # an array of 64 bytes and more is checked by the digest its dump was deduplicated by
    assert m["dumps"]["content_hash"] == "xxh3_128"
    versions, entries = _entry_versions(pack_files[0]), packs.names(str(run_dir))
    checked = set()
    for x, a in zip(rows, want):
        name = x["dump_path"]
        while name in entries and entries[name].kind == packs.ALIAS:  # (np.copy's input)
            name = entries[name].target
        if name in versions:
            assert versions[name] == (2 if a.nbytes >= 64 else 1), name
            checked.add(versions[name])
    assert checked == {1, 2}
    st = pack_files[0].stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert pack_files[0].name.endswith(f"-{rows[0]['pid']}-0.npk")
    # every row of the run (np.random's outputs too) points to a loadable dump
    for x in tensors(run_dir):
        if x["dump_path"]:
            assert pprobe.load(str(run_dir / x["dump_path"])).shape == tuple(x["shape"])


@pytest.mark.skipif(
    subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="torch is not importable",
)
def test_a_bf16_tensor_comes_back_identical_from_a_pack(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import torch
        t = torch.arange(-20, 20, dtype=torch.float32).to(torch.bfloat16) * 0.37
        torch.neg(t)
        """,
    ).check()
    run_dir = r.run_dir
    rows = sql(
        run_dir,
        "SELECT t.* FROM tensors t JOIN ops o USING (pid, seq) "
        "WHERE o.op LIKE '%neg' AND t.role = 'output'",
    )
    assert len(rows) == 1 and rows[0]["dump_path"].endswith(".bfloat16.npy")
    assert not (run_dir / rows[0]["dump_path"]).exists()  # packed
    import torch

    got = pprobe.load(str(run_dir / rows[0]["dump_path"]))
    want = torch.neg(torch.arange(-20, 20, dtype=torch.float32).to(torch.bfloat16) * 0.37)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_the_same_content_again_is_an_alias_entry(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        data = np.arange(1000, dtype=np.float64)   # 8 kB, passed to every step
        for step in range(6):
            np.copy(data)
        """,
    ).check()
    run_dir = r.run_dir
    rows = tensors(run_dir)
    copies = [x for x in rows if x["dump_path"] and "numpy.copy" in x["dump_path"]]
    assert len(copies) == 12  # input and output of 6 calls
    want = np.arange(1000, dtype=np.float64)
    for x in copies:
        assert _same(pprobe.load(str(run_dir / x["dump_path"])), want)
    s = packs.stats(str(run_dir))
    assert s["aliases"] >= 11  # one copy of the bytes; further dumps name it
    pack = next((run_dir / ".packs").iterdir())
    assert pack.stat().st_size < 2 * want.nbytes
    m = meta(run_dir)["dumps"]
    assert m["links"] >= 11
    assert m["bytes_reserved"] < 2 * (want.nbytes + 128)  # aliases take no budget


def test_after_kill_9_every_row_loads_and_a_cut_tail_is_ignored(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(
        "import numpy as np\n"
        "i = 0\n"
        "while True:\n"
        "    np.negative(np.full(100 + i % 700, float(i)))\n"
        "    i += 1\n"
        "    if i == 200: print('ready', flush=True)\n"
    )
    out = tmp_path / "out"
    env = clean_env(
        PYTHONPATH=str(BOOTSTRAP),
        PPROBE_OUTPUT=str(out),
        PPROBE_FLUSH_SECONDS="0.2",
    )
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    time.sleep(1.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    run_dir = next(d for d in out.iterdir() if d.is_dir() and not d.is_symlink())
    rows = [x for x in tensors(run_dir) if x["dump_path"]]
    assert len(rows) > 20

    def check_all() -> None:
        for x in rows:
            a = pprobe.load(str(run_dir / x["dump_path"]))
            n = x["shape"][0]
            i = float(a[0])
            # values independently: np.full(100 + i % 700, i), negated or not
            assert a.shape == (n,) and (np.all(a == i) and n == 100 + abs(int(i)) % 700)

    check_all()
    # a crash mid-append: half an entry at the end of the pack is ignored, the rest reads
    pack = next((run_dir / ".packs").iterdir())
    good = pack.read_bytes()
    n_before = packs.stats(str(run_dir))["entries"]
    with open(pack, "ab") as f:
        f.write(good[: packs.HEAD_SIZE + 40])  # the start of an entry, cut
    check_all()
    ix = packs.indexes(str(run_dir))[0]
    assert ix.bad_tail and packs.stats(str(run_dir))["entries"] == n_before


def test_export_npy_materialises_every_dump(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        _ARRAYS + "for a in arrays:\n    np.copy(a)\nfor k in range(3):\n    np.copy(arrays[1])\n",
    ).check()
    run_dir = r.run_dir
    dest = tmp_path / "exported"
    p = subprocess.run(
        [PYTHON, "-m", "pprobe", "export", "--npy", str(dest), "--run", str(run_dir)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 0, p.stderr
    assert "aliases" in p.stdout
    rows = [x for x in tensors(run_dir) if x["dump_path"]]
    assert sorted(os.listdir(dest)) == sorted({x["dump_path"] for x in rows})
    want = _expected()
    copies = _copies(run_dir)
    for x, a in zip(copies, want + [want[1]] * 3):
        assert _same(np.load(dest / x["dump_path"], allow_pickle=False), a)
    for x in rows:
        f = dest / x["dump_path"]
        assert f.is_file() and not f.is_symlink()
        assert _same(np.load(f), pprobe.load(str(run_dir / x["dump_path"]), torch=False))
    # again into the same folder: refused with one line, nothing overwritten
    p = subprocess.run(
        [PYTHON, "-m", "pprobe", "export", "--npy", str(dest), "--run", str(run_dir)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "not an empty folder" in p.stderr


def test_export_npy_never_writes_through_a_symlink(tmp_path: Path) -> None:
    r = run_script(tmp_path, "import numpy as np\nnp.copy(np.arange(5.0))\n").check()
    victim = tmp_path / "victim"
    victim.mkdir()
    link = tmp_path / "link"
    link.symlink_to(victim)
    p = subprocess.run(
        [PYTHON, "-m", "pprobe", "export", "--npy", str(link), "--run", str(r.run_dir)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2 and "symlink" in p.stderr and not os.listdir(victim)


def test_threshold_0_writes_plain_files_as_before(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        _ARRAYS + "for a in arrays:\n    np.copy(a)\n",
        env={"PPROBE_DUMP_PACK": "0"},
    ).check()
    run_dir = r.run_dir
    assert not (run_dir / ".packs").exists()
    for x, a in zip(_copies(run_dir), _expected()):
        assert _same(np.load(run_dir / x["dump_path"], allow_pickle=False), a)


def test_a_bad_threshold_names_the_variable(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print('hi')\n", env={"PPROBE_DUMP_PACK": "lots"})
    assert "PPROBE_DUMP_PACK" in r.err


# ---------------------------------------------------------------------- in process
def _entry(kind: int, name: str, payload: bytes) -> bytes:
    b = name.encode()
    return packs.entry_head(kind, b, payload) + b + payload


def test_scanner_stops_at_the_first_damaged_entry_and_follows_aliases(tmp_path: Path) -> None:
    d = tmp_path / "run"
    (d / ".packs").mkdir(parents=True)
    pack = d / ".packs" / "h-1-0.npk"
    one = np.arange(7, dtype=np.int32)
    blob = dumps.npy_header(one.dtype, one.shape) + one.tobytes()
    data = _entry(packs.DATA, "a.npy", blob) + _entry(packs.ALIAS, "b.npy", b"a.npy")
    pack.write_bytes(data)
    assert _same(pprobe.load(str(d / "b.npy")), one)
    # the crc covers the header, the name and the payload: a flipped byte ends the scan
    bad = bytearray(_entry(packs.DATA, "c.npy", blob))
    bad[-1] ^= 1
    later = _entry(packs.DATA, "e.npy", blob)
    pack.write_bytes(data + bytes(bad) + later)
    assert set(packs.names(str(d))) == {"a.npy", "b.npy"}
    assert packs.indexes(str(d))[0].bad_tail
    with pytest.raises(FileNotFoundError):
        pprobe.load(str(d / "c.npy"))
    # a pack that grows is scanned on from where the last scan ended
    pack.write_bytes(data)
    packs.indexes(str(d))
    with open(pack, "ab") as f:
        f.write(_entry(packs.DATA, "f.npy", blob))
    assert "f.npy" in packs.names(str(d))
    crc_ok = zlib.crc32(blob, zlib.crc32(b"a.npy", zlib.crc32(data[:16])))
    assert int.from_bytes(data[16:20], "little") == crc_ok


def _queues() -> list:
    qs = [dumps.PyQueue()]
    mod = core.dumpio()
    if mod is not None:
        qs.append(dumps.NativeQueue(mod))
    return qs


def test_native_and_python_writers_append_the_same_bytes(tmp_path: Path) -> None:
    qs = _queues()
    if len(qs) < 2:
        pytest.skip("no native dump writer in this build")
    a = np.arange(12.0).reshape(3, 4).T  # not contiguous: appended in C order
    h = dumps.npy_header(a.dtype, (4, 3))
    out = []
    for k, q in enumerate(qs):
        d = tmp_path / f"run{k}"
        d.mkdir()
        fd = os.open(d, os.O_RDONLY)
        try:
            q.set_host("testhost")
            q.open(fd, 1 << 20)
            assert q.submit("x.npy", h, a, None, True, True)
            assert q.submit("y.npy", b"", None, "x.npy", True, True)
            assert q.submit("big.npy", h, a, None, True, False)  # not packed: a file
            assert q.wait(q.ticket(), 10.0)
            assert q.close(10.0)
            assert not q.failures()
        finally:
            os.close(fd)
        (pack,) = (d / ".packs").iterdir()
        assert pack.name.startswith(f"testhost-{os.getpid()}-") and pack.name.endswith(".npk")
        assert _same(np.load(d / "big.npy"), np.ascontiguousarray(a))
        assert _same(pprobe.load(str(d / "y.npy")), np.ascontiguousarray(a))
        out.append(pack.read_bytes())
    assert out[0] == out[1]


def test_a_digest_checks_the_array_and_the_crc_the_rest(tmp_path: Path) -> None:
    """Version 2 entries: the XXH3-128 digest of the array's bytes (taken on the program's
    thread) checks them, the crc32 the head, hlen, name, digest and .npy header; a flipped
    byte anywhere ends the scan, and version 1 entries read on beside them."""
    from xxhash import xxh3_128_digest

    runs = iter(range(100))

    def folder(data: bytes) -> str:  # a new folder each time (an index is cached by mtime)
        d = tmp_path / f"run{next(runs)}"
        (d / ".packs").mkdir(parents=True)
        (d / ".packs" / "h-1-0.npk").write_bytes(data)
        return str(d)

    a = np.arange(40, dtype=np.float32).reshape(5, 8)
    h = dumps.npy_header(a.dtype, a.shape)
    blob, dg = h + a.tobytes(), xxh3_128_digest(a)

    def v2(name: str, digest: bytes = dg) -> bytes:
        b = name.encode()
        return packs.entry_head(packs.DATA, b, blob, digest, len(h)) + b + digest + blob

    good = v2("a.npy") + _entry(packs.DATA, "b.npy", blob) + _entry(packs.ALIAS, "c.npy", b"a.npy")
    assert good[4] == packs.VERSION_DIGEST and int.from_bytes(good[20:24], "little") == len(h)
    d = folder(good)
    for n in ("a.npy", "b.npy", "c.npy"):
        assert _same(pprobe.load(os.path.join(d, n)), a), n
    assert packs.read(os.path.join(d, "a.npy")) == blob
    one = len(v2("a.npy"))
    for where, what in [
        (one - 1, "the array's last byte"),
        (one - a.nbytes - 1, "the .npy header's last byte"),
        (one - len(blob) - 1, "the digest"),
        (24, "the name"),
        (20, "hlen"),
    ]:
        bad = bytearray(v2("a.npy"))
        bad[where] ^= 1
        d = folder(bytes(bad) + good)
        assert "a.npy" not in packs.names(d), what
        assert packs.indexes(d)[0].bad_tail, what
    # a digest of other bytes (an array another thread wrote during the copy) fails too
    assert packs.names(folder(v2("a.npy", xxh3_128_digest(a + 1)) + good)) == {}
    with pytest.raises(ValueError):
        packs.entry_head(packs.DATA, b"x.npy", blob, dg[:8], len(h))


@pytest.mark.parametrize("q", _queues(), ids=lambda q: type(q).__name__)
def test_a_dump_submitted_with_its_digest_is_a_version_2_entry(tmp_path: Path, q: object) -> None:
    """Both writers append the same version 2 entry for a submit with a digest; without one
    (or a strided view's, which is not the bytes written) the entry is version 1."""
    from xxhash import xxh3_128_digest

    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    s = a[:, ::2]
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        q.open(fd, 1 << 20)  # type: ignore[attr-defined]
        h = dumps.npy_header(a.dtype, a.shape)
        assert q.submit("d.npy", h, a, None, True, True, xxh3_128_digest(a))  # type: ignore[attr-defined]
        assert q.submit("p.npy", h, a, None, True, True, None)  # type: ignore[attr-defined]
        hs = dumps.npy_header(s.dtype, s.shape)
        assert q.submit("s.npy", hs, s, None, True, True, bytes(16))  # type: ignore[attr-defined]
        assert q.close(10.0)  # type: ignore[attr-defined]
        assert not q.failures()  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    (pack,) = (tmp_path / ".packs").iterdir()
    raw = pack.read_bytes()
    b = b"d.npy"
    want = packs.entry_head(packs.DATA, b, h + a.tobytes(), xxh3_128_digest(a), len(h))
    assert raw.startswith(want + b + xxh3_128_digest(a) + h + a.tobytes())
    versions = {n: raw[raw.index(n.encode()) - 24 + 4] for n in ("d.npy", "p.npy", "s.npy")}
    assert versions == {"d.npy": 2, "p.npy": 1, "s.npy": 1}
    for n, x in (("d.npy", a), ("p.npy", a), ("s.npy", s)):
        assert _same(pprobe.load(str(tmp_path / n)), np.ascontiguousarray(x)), n


_STRIDED = [
    np.arange(60, dtype=np.float32).reshape(3, 4, 5).transpose(2, 0, 1),  # a 3-D transpose
    np.arange(100, dtype=np.int8)[::3],  # a step, 1-byte items
    np.arange(48, dtype=np.int16).reshape(6, 8)[::2, 1::3],  # steps in both dimensions
    np.arange(40, dtype=np.complex128).reshape(5, 8)[::-1, 1::3],  # negative, 16-byte items
    np.arange(30, dtype=np.float64).reshape(5, 6)[:, 2:4],  # contiguous rows, strided rows
    np.zeros((3, 4), dtype="V3")[:, ::2],  # an item size without a typed loop
    np.ones((3, 0, 2))[:, :, ::2],  # empty
]


@pytest.mark.parametrize("q", _queues(), ids=lambda q: type(q).__name__)
def test_strided_views_are_written_in_c_order(tmp_path: Path, q: object) -> None:
    """A view that is neither C- nor Fortran-contiguous is gathered into C order: the bytes
    after each entry's header are ``a.tobytes()``, in a pack and in a plain file."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        q.open(fd, 1 << 20)  # type: ignore[attr-defined]
        for i, a in enumerate(_STRIDED):
            assert not a.flags.c_contiguous or a.size == 0, i
            h = dumps.npy_header(a.dtype, a.shape)
            assert q.submit(f"p{i}.npy", h, a, None, True, True)  # type: ignore[attr-defined]
            assert q.submit(f"f{i}.npy", h, a, None, True, False)  # type: ignore[attr-defined]
        assert q.close(10.0)  # type: ignore[attr-defined]
        assert not q.failures()  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    for i, a in enumerate(_STRIDED):
        h = dumps.npy_header(a.dtype, a.shape)
        assert (tmp_path / f"f{i}.npy").read_bytes() == h + a.tobytes(), i
        assert packs.read(str(tmp_path / f"p{i}.npy")) == h + a.tobytes(), i


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (/proc/self/mounts)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1].replace("\\040", " ")
            if str(path).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best):
                best, kind = mnt, parts[2]
    return kind


@pytest.mark.skipif(core.dumpio() is None or not sys.platform.startswith("linux"),
                    reason="the native writer preallocates on Linux")  # fmt: skip
def test_the_native_writer_gives_a_packs_preallocated_blocks_back(tmp_path: Path) -> None:
    """The native writer allocates a pack's blocks ahead of its end (beyond its size: readers
    see the same file) and gives what it did not write back when it closes: afterwards the
    pack holds its size's blocks only."""
    q = dumps.NativeQueue(core.dumpio())
    fd = os.open(tmp_path, os.O_RDONLY)
    a = np.arange(10_000, dtype=np.float64)  # 80 kB entries, 1.6 MB in all
    h = dumps.npy_header(a.dtype, a.shape)
    try:
        q.set_host("testhost")
        q.open(fd, 64 << 20)
        for i in range(20):
            assert q.submit(f"x{i}.npy", h, a + i, None, True, True)
        assert q.wait(q.ticket(), 10.0)
        (pack,) = (tmp_path / ".packs").iterdir()
        size = pack.stat().st_size
        assert size == sum(24 + len(f"x{i}.npy") + len(h) + a.nbytes for i in range(20))
        ahead = pack.stat().st_blocks * 512 - size
        if _fs_type(tmp_path) in ("ext4", "xfs", "btrfs", "tmpfs"):
            assert ahead >= 1 << 20, (ahead, _fs_type(tmp_path))  # preallocated
        assert q.close(10.0)
        assert not q.failures()
    finally:
        os.close(fd)
    st = pack.stat()
    assert st.st_size == size
    assert st.st_blocks * 512 - size < 64 << 10, st.st_blocks  # given back
    assert _same(pprobe.load(str(tmp_path / "x19.npy")), a + 19)


def test_a_forked_child_appends_to_a_pack_of_its_own(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import os
        import numpy as np
        np.negative(np.arange(10.0))
        pid = os.fork()
        if pid == 0:
            for i in range(5):
                np.negative(np.full(7, float(i)))
            os._exit(0)
        for i in range(5):
            np.negative(np.full(9, float(-i)))
        os.waitpid(pid, 0)
        """,
    ).check()
    run_dir = r.run_dir
    rows = [x for x in tensors(run_dir) if x["dump_path"]]
    pids = {x["pid"] for x in rows}
    assert len(pids) == 2
    names = sorted(p.name for p in (run_dir / ".packs").iterdir())
    assert len(names) == 2 and {int(n.rsplit("-", 2)[1]) for n in names} == pids
    for x in rows:
        a = pprobe.load(str(run_dir / x["dump_path"]))
        assert a.shape == tuple(x["shape"])
    for x in rows:
        if "negative_output" in x["dump_path"] and x["shape"] in ([7], [9]):
            a = pprobe.load(str(run_dir / x["dump_path"]))
            assert np.all(a == a[0])
            # the child negated full(7, i), the parent full(9, -i), i >= 0
            assert a[0] <= 0 if x["shape"] == [7] else a[0] >= 0


_GROUPED = r"""
import json, os, resource, signal, sys
import numpy as np
from pprobe import core, dumps
kind, folder, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = dumps.PyQueue() if kind == "python" else dumps.NativeQueue(core.dumpio())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
fd = os.open(folder, os.O_RDONLY)
q.set_host("testhost")
q.open(fd, 64 << 20)
rng = np.random.default_rng(3)
for i in range(300):  # queued faster than written: the native writer groups them
    a = rng.standard_normal(int(rng.integers(1, 400)))
    h = dumps.npy_header(a.dtype, a.shape)
    assert q.submit(f"d{i}.npy", h, a, None, True, True)
    if i % 7 == 3:
        assert q.submit(f"a{i}.npy", b"", None, f"d{i}.npy", True, True)
    if i % 50 == 9:
        assert q.submit(f"m{i}.npy", b"", None, "missing.npy", True, True)
assert q.wait(q.ticket(), 30.0)
assert q.close(30.0)
print(json.dumps(sorted((n, e) for n, e, _ in q.failures())))
"""


@pytest.mark.parametrize("limit", [0, 300_000])
def test_many_queued_entries_append_as_the_python_writer_does(tmp_path: Path, limit: int) -> None:
    """Hundreds of entries queued at once (the native writer takes them in batches and appends
    runs of them with one writev) give the Python writer's pack byte for byte, with the same
    failures: aliases to a missing entry, and, under a file-size limit that a grouped write
    crosses, the entries that no longer fit and their aliases (the pack keeps only complete
    entries)."""
    if core.dumpio() is None:
        pytest.skip("no native dump writer in this build")
    got = {}
    for kind in ("python", "native"):
        d = tmp_path / kind
        d.mkdir()
        cmd = [PYTHON, "-c", _GROUPED, kind, str(d), str(limit)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
        assert r.returncode == 0, r.stderr
        packs_ = sorted((d / ".packs").iterdir())
        got[kind] = (r.stdout, [p.read_bytes() for p in packs_])
    assert got["native"] == got["python"]
    out, blobs = got["native"]
    failed = {n for n, _ in json.loads(out)}
    names = ({f"d{i}.npy" for i in range(300)} | {f"a{i}.npy" for i in range(3, 300, 7)}
             | {f"m{i}.npy" for i in range(9, 300, 50)})  # fmt: skip
    if limit:
        assert any(n.startswith("d") for n in failed)  # the limit was reached
        # an alias of an entry that could not be appended fails too
        assert {f"a{i}.npy" for i in range(3, 300, 7) if f"d{i}.npy" in failed} <= failed
        assert all(len(b) <= limit for b in blobs)
    else:
        assert not failed  # (an alias to a name never dumped is appended: it loads as missing)
    written = set(packs.names(str(tmp_path / "native")))
    assert written == names - failed and len(written) > 100
    rng = np.random.default_rng(3)
    for i in range(300):
        a = rng.standard_normal(int(rng.integers(1, 400)))
        if f"d{i}.npy" in written:
            assert _same(pprobe.load(str(tmp_path / "native" / f"d{i}.npy")), a)
