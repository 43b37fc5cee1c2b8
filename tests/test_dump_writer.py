"""The dump writer (pprobe/dumps.py, pprobe/_dumpio.c): repeated contents stored once, a bounded
queue (wait or skip), rows that never point to a missing file (kill -9 included), safe names,
symlinks never followed, the budget as a hard limit, and the statistics' bounded memory.

Everything runs through the bootstrap in subprocesses; the in-process tests at the end check
the .npy header, the names and the two queues (native and Python) directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import BOOTSTRAP, clean_env, meta, ops, run_script, sql, tensors

from pprobe import core, dumps


@pytest.fixture(autouse=True)
def _one_file_per_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the one-file-per-dump storage (names, links, modes, symlinks) on
    disk; small dumps packed into pack files are tested in tests/test_dump_pack.py."""
    monkeypatch.setenv("PPROBE_DUMP_PACK", "0")


def _of(run_dir: Path, op: str, where: str = "true") -> list[dict]:
    """The tensor rows of one op's calls, in call order."""
    return sql(
        run_dir,
        "SELECT t.* FROM tensors t JOIN ops o USING (pid, seq) "
        f"WHERE o.op = '{op}' AND {where} ORDER BY t.pid, t.seq, t.role, t.idx",
    )


def _unique_bytes(files: list[Path]) -> int:
    return sum({f.stat().st_ino: f.stat().st_size for f in files}.values())


def test_the_same_content_is_stored_once_as_hard_links(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        data = np.arange(50_000, dtype=np.float64)   # a training set passed to every step
        w = np.zeros(3)
        for step in range(20):
            w = np.add(w, np.dot(data[:3], data[:3]))
            np.copy(data)
        """,
    ).check()
    run_dir = r.run_dir
    rows = _of(run_dir, "numpy.copy")
    assert len(rows) == 40
    files = [run_dir / x["dump_path"] for x in rows]
    assert len(set(files)) == 40  # every row has its own seed-named file...
    assert len({f.stat().st_ino for f in files}) == 1  # ...and they are one file on disk
    for f in files[::7]:
        np.testing.assert_array_equal(np.load(f), np.arange(50_000, dtype=np.float64))
    m = meta(run_dir)["dumps"]
    assert m["links"] >= 39
    assert m["bytes_written"] < 2 * 400_000  # not 40 x 400 kB


def test_different_contents_of_the_same_shape_are_not_merged(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        a = np.zeros(1000)
        for i in range(10):
            a[i] = 1.0          # one element changes
            np.copy(a)
        np.copy(np.zeros(1000, dtype=np.int64))   # same bytes as zeros(1000), another dtype
        np.copy(np.zeros((10, 100)))             # same bytes, another shape
        """,
    ).check()
    rows = _of(r.run_dir, "numpy.copy", "role = 'input'")
    assert len(rows) == 12
    for i, x in enumerate(rows[:10]):
        want = np.zeros(1000)
        want[: i + 1] = 1.0
        np.testing.assert_array_equal(np.load(r.run_dir / x["dump_path"]), want)
    assert np.load(r.run_dir / rows[10]["dump_path"]).dtype == np.int64
    assert np.load(r.run_dir / rows[11]["dump_path"]).shape == (10, 100)


def test_a_full_queue_waits_when_so_configured(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        a = np.random.default_rng(0).standard_normal(65536)   # 512 KiB
        for i in range(60):
            a += 1.0                  # new contents, 2 more dumps, fast
            np.negative(a)            # 512 KiB in, 512 KiB out
        """,
        env={"PPROBE_DUMP_QUEUE": "1MiB", "PPROBE_DUMP_FULL": "wait"},
    ).check()
    rows = _of(r.run_dir, "numpy.negative")
    assert len(rows) == 120
    assert all(x["dump_path"] for x in rows)  # waited, never skipped
    for x in rows[::9]:  # every dump a row points to is complete
        assert np.load(r.run_dir / x["dump_path"]).shape == (65536,)
    pairs: dict = {}
    for x in rows:
        pairs.setdefault(x["seq"], {})[x["role"]] = np.load(r.run_dir / x["dump_path"])
    for pair in pairs.values():
        np.testing.assert_array_equal(pair["output"], -pair["input"])
    assert meta(r.run_dir)["dumps"]["skipped"] == 0


def test_a_full_queue_skips_when_so_configured(tmp_path: Path) -> None:
    # A 1-byte queue takes a dump only when the writer has nothing pending. Each np.add queues
    # its 16 MiB first input into an empty queue (the writer had 0.3 s to drain it), then its
    # 8-byte second input microseconds later, while the writer is still writing 16 MiB: that
    # one is skipped, whatever the disk's speed.
    r = run_script(
        tmp_path,
        """
        import time
        import numpy as np
        big = np.random.default_rng(0).standard_normal(2 << 20)   # 16 MiB
        small = np.ones(1)
        for i in range(3):
            big[0] = small[0] = i     # new contents: no dump is a link to an earlier one
            time.sleep(0.3)
            np.add(big, small)
        """,
        env={"PPROBE_DUMP_QUEUE": "1", "PPROBE_DUMP_FULL": "skip"},
    ).check()
    rows = _of(r.run_dir, "numpy.add")
    assert [(x["role"], x["idx"]) for x in rows[:3]] == [
        ("input", "0"),
        ("input", "1"),
        ("output", "0"),
    ]
    assert len(rows) == 9
    for i in range(3):
        big, small = rows[3 * i], rows[3 * i + 1]
        assert big["dump_path"], big["note"]
        a = np.load(r.run_dir / big["dump_path"])
        assert a.shape == (2 << 20,) and a[0] == i
        assert small["dump_path"] is None
        assert "dump queue is full" in small["note"] and "PPROBE_DUMP_FULL" in small["note"]
    every = tensors(r.run_dir)  # the generator's and ones' outputs too
    assert meta(r.run_dir)["dumps"]["skipped"] == sum(not x["dump_path"] for x in every) >= 3


def test_after_kill_9_every_dump_a_row_points_to_is_complete(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(
        "import numpy as np, sys\n"
        "rng = np.random.default_rng(1)\n"
        "i = 0\n"
        "while True:\n"
        "    np.negative(rng.standard_normal(1000 + i % 5000))\n"
        "    i += 1\n"
        "    if i == 200: print('ready', flush=True)\n"
    )
    out = tmp_path / "out"
    env = clean_env(PYTHONPATH=str(BOOTSTRAP), PPROBE_OUTPUT=str(out), PPROBE_FLUSH_SECONDS="0.2")
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    time.sleep(2.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    run_dir = next(d for d in out.iterdir() if d.is_dir() and not d.is_symlink())
    rows = [x for x in tensors(run_dir) if x["dump_path"]]
    assert len(rows) > 20  # the log had batches by then (how many depends on the disk)
    for x in rows:
        a = np.load(run_dir / x["dump_path"], allow_pickle=False)  # complete and readable
        assert a.shape == tuple(x["shape"])


def test_one_array_larger_than_the_budget_left_is_skipped_and_dumping_goes_on(
    tmp_path: Path,
) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        np.negative(np.ones(10))
        np.negative(np.ones(20 * 1024 * 1024 // 8))   # 20 MiB
        for i in range(5):
            np.negative(np.full(10, float(i)))
        """,
        env={"PPROBE_BUDGET": "10MB"},
    ).check()
    rows = _of(r.run_dir, "numpy.negative")
    big = [x for x in rows if x["shape"] == [20 * 1024 * 1024 // 8]]
    small = [x for x in rows if x["shape"] == [10]]
    assert len(big) == 2 and len(small) == 12
    for x in big:
        assert x["dump_path"] is None and "do not fit" in x["note"], x
    assert all(x["dump_path"] for x in small)
    m = meta(r.run_dir)["dumps"]
    too_big = [x for x in tensors(r.run_dir) if x["note"] and "do not fit" in x["note"]]
    assert m["exhausted"] is False and m["skipped"] == len(too_big) == 3  # np.ones' too
    assert r.pprobe_lines() == []


def test_the_budget_is_a_hard_limit_across_threads(tmp_path: Path) -> None:
    budget = 3 * 1024 * 1024
    r = run_script(
        tmp_path,
        """
        import threading
        import numpy as np
        def work(k):
            for i in range(4):
                np.negative(np.full(128 * 1024, float(k * 100 + i)))   # 1 MiB each
        ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        """,
        env={"PPROBE_BUDGET": str(budget)},
    ).check()
    files = list(r.run_dir.glob("*.npy"))
    assert files
    assert _unique_bytes(files) <= budget
    assert len(ops(r.run_dir, "op = 'numpy.negative'")) == 32


@pytest.mark.parametrize("budget", [1, 4096, 3 << 20, (3 << 20) + 5, 1 << 30, 1 << 40])
def test_the_budget_chunks(tmp_path: Path, budget: int) -> None:
    """The budget is cut into at most MAX_CHUNKS chunks of at least 1 MiB (one, smaller, when
    the budget is), which never add up to more than the budget."""
    d = dumps.Dumper(str(tmp_path), budget)
    assert 1 <= d.n_chunks <= dumps.MAX_CHUNKS
    assert d.n_chunks * d.chunk <= budget
    assert d.chunk >= min(budget, 1 << 20)
    assert budget - d.n_chunks * d.chunk < d.n_chunks  # only the division's remainder is lost


def test_the_dumpers_view_number_changes_with_each_field_the_core_reads(tmp_path: Path) -> None:
    """Dumper._n[VIEW] (what the native core checks before it takes the dumper's fields again)
    is 0 until the folder is open and the digest chosen, STOPPED (with the note of every dump
    in ``stop_note``) while dumping has stopped for good; every change of a field the core
    reads gives a number not seen before."""
    d = dumps.Dumper(str(tmp_path), 8 << 20)
    view = lambda: d._n[dumps.VIEW]  # noqa: E731
    assert view() == 0  # not opened, no digest
    d._open()
    assert view() == 0
    d.digest, d.content_hash, d.c_digest = dumps._content_hash(d.io)
    seen = {view()}
    assert 0 not in seen
    for field, value in (("lock", threading.Lock()), ("c_digest", d.c_digest)):
        setattr(d, field, value)
        assert view() not in seen, field
        seen.add(view())
    n = d._n
    d._reset()  # (a forked child's dumper): a new _n, numbered at once
    assert d._n is not n and view() not in seen and view() != 0
    for field, stop, go, note in (
        ("disk_full", "not dumped: full", "", "not dumped: full"),
        ("exhausted", True, False, dumps.NOTE_EXHAUSTED),
    ):
        setattr(d, field, stop)
        # stopped for good (no ring of steps): the core gives each dump this note itself
        assert view() == dumps.STOPPED and d.stop_note == note, field
        setattr(d, field, go)
        assert d.stop_note is None, field
        assert view() not in seen and view() != 0, field
        seen.add(view())
    d.close()


@pytest.mark.parametrize("refused", [None, PermissionError, NotImplementedError])
def test_budget_chunks_are_taken_once_across_dumpers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: type | None
) -> None:
    """Two dumpers of one run folder (as two processes) take the budget's chunks by name, each
    chunk once: as hard links to .budget/token (no inode per chunk), or, where the file system
    refuses hard links, as empty files. Neither ever takes more than the budget."""
    links = refused is None
    if refused is not None:  # a file system without hard links; a platform without linkat

        def no_links(*a: object, **k: object) -> None:
            raise refused("no hard links")

        monkeypatch.setattr(os, "link", no_links)
    mib = 1 << 20
    a, b = dumps.Dumper(str(tmp_path), 8 * mib), dumps.Dumper(str(tmp_path), 8 * mib)
    taken = []
    while True:
        got = [d._reserve(mib) for d in (a, b)]  # one new chunk each
        taken += got
        if not any(got):
            break
    assert sum(taken) == 8 and a.held + b.held == 8 * mib and a.held == b.held
    chunks = sorted(int(p.name) for p in (tmp_path / ".budget").iterdir() if p.name.isdigit())
    assert chunks == list(range(8))
    inodes = {(tmp_path / ".budget" / str(k)).stat().st_ino for k in chunks}
    if links:
        assert inodes == {(tmp_path / ".budget" / "token").stat().st_ino}
    else:
        assert len(inodes) == 8
    for p in (tmp_path / ".budget").iterdir():
        assert not p.is_symlink() and p.stat().st_size == 0


def test_unsafe_and_long_names_are_sanitised_and_do_not_stop_dumping(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import io
        import numpy as np
        a = np.arange(4.0)
        np.savez(io.BytesIO(), **{"sub/dir": a, "../up": a, "x" * 300: a})
        np.negative(a)
        """,
    ).check()
    run_dir = r.run_dir
    names = [p.name for p in run_dir.rglob("*.npy")]
    assert all(p.parent == run_dir for p in run_dir.rglob("*.npy"))
    assert all(len(n.encode()) <= 255 for n in names)
    savez = _of(run_dir, "numpy.savez")
    assert sorted(x["idx"] for x in savez)[:2] == ["../up", "sub/dir"]
    for x in savez:
        assert x["dump_path"] and "/" not in x["dump_path"], x
        np.testing.assert_array_equal(np.load(run_dir / x["dump_path"]), np.arange(4.0))
    neg = _of(run_dir, "numpy.negative")
    assert all(x["dump_path"] for x in neg)  # dumping went on
    assert not (tmp_path / "out" / "up").exists()


def test_a_symlink_at_a_dump_name_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    r = run_script(
        tmp_path,
        f"""
        import os
        import numpy as np
        import pprobe
        d = pprobe.active_run_dir()
        np.ones(2)          # numpy is probed from here
        pid = os.getpid()
        for seq in range(200):
            for which in ("input0", "output"):
                name = f"op_numpy.negative_{{which}}_{{pid}}-{{seq}}.npy"
                for n in (name, "." + name + ".tmp"):   # the final and the temporary name
                    os.symlink({str(victim)!r}, os.path.join(d, n))
        for i in range(5):
            np.negative(np.full(10, float(i)))
        """,
    ).check()
    assert victim.read_text() == "precious"
    rows = _of(r.run_dir, "numpy.negative")
    assert len(rows) == 10
    for x in rows:
        assert x["dump_path"] is None and "not dumped" in x["note"], x
    assert meta(r.run_dir)["dumps"]["failed_files"] == 10


def test_dump_files_are_private_and_meta_says_which_writer_ran(tmp_path: Path) -> None:
    r = run_script(tmp_path, "import numpy as np\nnp.negative(np.ones(3))\n").check()
    files = list(r.run_dir.glob("*.npy"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    want = "python" if os.environ.get("PPROBE_CORE") == "python" else "native"
    m = meta(r.run_dir)
    assert m["dumps"]["writer"] == want
    assert m["core"]["dumps"] == want


def test_statistics_of_a_large_array_use_bounded_memory(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import resource
        import numpy as np
        a = np.ones(25_000_000)          # 200 MB
        a[::1000] = np.nan
        b = a[::3]                       # not contiguous: the chunked path
        np.sum(a[:10])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        np.sum(a)
        np.sum(b)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024, int(np.isnan(b).sum()))
        """,
        env={"PPROBE_MODE": "stats"},
    ).check()
    grew_mb, nan_b = map(int, r.out.split()[-2:])
    assert grew_mb < 40, grew_mb
    rows = _of(r.run_dir, "numpy.sum", "role = 'input'")
    assert [x["nan_count"] for x in rows[1:]] == [25_000, nan_b]
    assert rows[1]["min"] == rows[1]["max"] == 1.0 and rows[1]["std"] == 0.0


# ----------------------------------------------------------------------- in-process
@pytest.mark.parametrize(
    "a",
    [
        np.arange(5.0),
        np.zeros((3, 0)),
        np.array(7, dtype=np.int16),
        np.arange(24, dtype=">i4").reshape(2, 3, 4),
        np.array(["ab", "c"]),
        np.array([(1, 2.0)], dtype=[("x", "i4"), ("y", "f8")]),
        np.array([(1,)], dtype=[("é", "i4")]),
        np.array([0, 1, 2], dtype="datetime64[s]"),
        np.zeros((2, 2), dtype=np.complex64),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),  # a Fortran-ordered array
        np.arange(24, dtype=np.float32).reshape(2, 3, 4).T,  # a transpose
        np.arange(6, dtype=np.int8).reshape(1, 6).T,  # both C and F: C order
    ],
    ids=lambda a: f"{a.dtype}-{'F' if dumps.fortran_order(a) else 'C'}{a.ndim}",
)
def test_npy_header_is_what_np_save_writes(a: np.ndarray) -> None:
    """The header np.save writes, and for a numeric array the whole file: a Fortran-ordered
    array's memory as it is (its transpose's C order) under ``'fortran_order': True``."""
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    raw = buf.getvalue()
    fortran = dumps.fortran_order(a)
    h = dumps.npy_header(a.dtype, a.shape, fortran)
    assert raw[: len(h)] == h
    if a.dtype.kind in "biufc":
        assert raw == h + (a.T if fortran else a).tobytes()


def test_file_names_are_one_safe_component() -> None:
    assert dumps.file_name("numpy.add", "input0", "12-3") == "op_numpy.add_input0_12-3.npy"
    for which in ("input../../x", "input/a", "input\x00b", "p" * 1000):
        n = dumps.file_name("a/b", which, "1-2")
        assert "/" not in n and "\x00" not in n and len(n.encode()) <= dumps.NAME_MAX
        assert n.endswith("_1-2.npy")
    long = {dumps.file_name("op", "input" + "x" * 300 + str(i), "1-2") for i in range(3)}
    assert len(long) == 3  # cut names stay distinct


def _queues() -> list:
    qs = [dumps.PyQueue()]
    mod = core.dumpio()
    if mod is not None:
        qs.append(dumps.NativeQueue(mod))
    return qs


@pytest.mark.parametrize("q", _queues(), ids=lambda q: type(q).__name__)
def test_queue_writes_links_and_reports_failures(tmp_path: Path, q: object) -> None:
    d = tmp_path / "run"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    try:
        q.open(fd, 1 << 20)  # type: ignore[attr-defined]
        # the native queue is the process's one queue: its counters go on from earlier uses
        before = q.counters()  # type: ignore[attr-defined]
        a = np.arange(12.0).reshape(3, 4).T  # not contiguous: written in C order
        assert q.submit("a.npy", b"HEAD", a, None, True)  # type: ignore[attr-defined]
        assert q.submit("b.npy", b"", None, "a.npy", True)  # type: ignore[attr-defined]
        assert q.submit("c.npy", b"", None, "missing.npy", True)  # type: ignore[attr-defined]
        (d / "taken.npy").write_text("x")
        os.symlink(tmp_path / "victim", d / ".d.npy.tmp")
        assert q.submit("d.npy", b"X", None, None, True)  # type: ignore[attr-defined]
        assert q.wait(q.ticket(), 10.0)  # type: ignore[attr-defined]
        raw = (d / "a.npy").read_bytes()
        assert raw[:4] == b"HEAD"
        np.testing.assert_array_equal(np.frombuffer(raw[4:]), np.ascontiguousarray(a).ravel())
        assert (d / "b.npy").stat().st_ino == (d / "a.npy").stat().st_ino
        fails = {n: e for n, e, _ in q.failures()}  # type: ignore[attr-defined]
        assert set(fails) == {"c.npy", "d.npy"}
        assert not (tmp_path / "victim").exists()
        now = q.counters()  # type: ignore[attr-defined]
        _, sub, done, files, links, failed, written = (x - y for x, y in zip(now, before))
        assert (sub, done, files, links, failed) == (4, 4, 1, 1, 2)
        assert written == 4 + a.nbytes
        with pytest.raises(ValueError):
            q.submit("x/y", b"", None, None, True)  # type: ignore[attr-defined]
        assert q.close(10.0)  # type: ignore[attr-defined]
    finally:
        os.close(fd)


@pytest.mark.parametrize("q", _queues(), ids=lambda q: type(q).__name__)
def test_queue_skips_when_full_unless_asked_to_wait(tmp_path: Path, q: object) -> None:
    d = tmp_path / "run"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    try:
        q.open(fd, 100_000)  # type: ignore[attr-defined]
        big = np.ones(50_000)  # 400 kB: larger than the queue, taken when it is empty
        results = [q.submit(f"f{i}.npy", b"", big, None, False) for i in range(50)]  # type: ignore[attr-defined]
        assert results[0] and not all(results)
        assert all(q.submit(f"w{i}.npy", b"", big, None, True) for i in range(5))  # type: ignore[attr-defined]
        assert q.close(30.0)  # type: ignore[attr-defined]
        written = sorted(p.name for p in d.iterdir())
        assert len(written) == sum(results) + 5
    finally:
        os.close(fd)


def test_a_transposed_array_is_never_an_alias_of_its_base(tmp_path: Path) -> None:
    """``b.T`` of a square ``b`` has b's memory bytes, dtype and shape but other values: its
    dump holds its own values (a Fortran-ordered array's key, the digest of its memory with
    its Fortran-order header, only matches another Fortran-ordered array's)."""
    r = run_script(
        tmp_path,
        """
        import numpy as np
        b = np.negative(np.arange(16.0).reshape(4, 4))   # b: dumped as negative's output
        np.positive(b.T)                                   # b.T: the same bytes, transposed
        f = np.asfortranarray(np.arange(16.0).reshape(4, 4))
        np.positive(f)
        np.positive(np.asfortranarray(np.arange(16.0).reshape(4, 4)))  # f's twin: an alias
        """,
    ).check()
    rows = _of(r.run_dir, "numpy.positive", "t.role = 'input'")
    assert len(rows) == 3
    base = -np.arange(16.0).reshape(4, 4)
    got = [np.load(r.run_dir / x["dump_path"]) for x in rows]
    np.testing.assert_array_equal(got[0], base.T)
    assert got[0][0, 1] == -4.0  # not b's -1.0
    np.testing.assert_array_equal(got[1], np.arange(16.0).reshape(4, 4))
    np.testing.assert_array_equal(got[2], got[1])
    assert os.path.samefile(r.run_dir / rows[1]["dump_path"], r.run_dir / rows[2]["dump_path"])
    assert meta(r.run_dir)["dumps"]["content_hash"] in ("xxh3_128", "pprobe", "blake2b")


@pytest.mark.parametrize("xxh", [True, False], ids=["xxhash", "no-xxhash"])
@pytest.mark.parametrize("q", ["native", "python"])
def test_content_hash_without_and_with_xxhash(
    monkeypatch: pytest.MonkeyPatch, xxh: bool, q: str
) -> None:
    if q == "native" and core.dumpio() is None:
        pytest.skip("no native dump writer in this install")
    io = dumps.NativeQueue(core.dumpio()) if q == "native" else dumps.PyQueue()
    if not xxh:
        monkeypatch.setitem(sys.modules, "xxhash", None)  # import xxhash fails
    digest, name, raw = dumps._content_hash(io)
    assert name == ("xxh3_128" if xxh else {"native": "pprobe", "python": "blake2b"}[q])
    a = np.arange(64.0).reshape(8, 8)
    assert digest(a) == digest(a.copy()) and len(digest(a)) == 16
    assert raw(a) == digest(a)  # what the native core calls for a C-contiguous array
    assert digest(a) != digest(a + 1)
    # a Fortran-ordered array reaches the digest as its transpose (Dumper._dump), and the
    # key pairs the digest with the header, whose 'fortran_order' tells the two apart
    assert digest(a.T) is None
    assert digest(a[:, ::2]) is None  # no contiguous buffer: no dedup


@pytest.mark.skipif(core.dumpio() is None, reason="the native dump writer is not built")
def test_large_files_are_written_two_at_once_and_each_is_whole(tmp_path: Path) -> None:
    """A batch's large dumps (256 KiB and more, one file each) are written by the writer and a
    helper thread together: every file has its bytes, a hard link submitted right after its
    target finds it, a failure is reported for its own file only, and wait() returns only once
    every file up to the ticket is written. A forked child writes its own with a helper of its
    own."""
    mod = core.dumpio()
    q = dumps.NativeQueue(mod)
    rng = np.random.default_rng(3)

    def burst(d: Path, tag: str, rounds: int = 10) -> dict[str, np.ndarray]:
        fd = os.open(d, os.O_RDONLY)
        try:
            q.open(fd, 256 << 20)
            want: dict[str, np.ndarray] = {}
            start = mod.helper_files()
            for r in range(rounds):  # until the helper took part (a new one joins its round)
                mod.hold(True)  # one batch: the round's files are submitted before it starts
                try:
                    for i in range(8):
                        a = rng.standard_normal(40_000 + 1_000 * i)  # 320-376 KB, new bytes
                        name = f"{tag}{r}_{i}.npy"
                        assert q.submit(name, b"H" * 64, a, None, True)
                        want[name] = a
                        if i == 3:  # a link in the same batch as its target
                            assert q.submit(f"{tag}{r}_link.npy", b"", None, name, True)
                            want[f"{tag}{r}_link.npy"] = a
                finally:
                    mod.hold(False)
                assert q.wait(q.ticket(), 30.0)
                if mod.helper_files() > start:
                    break
            assert mod.helper_files() > start
            assert q.close(30.0)
            return want
        finally:
            os.close(fd)

    d = tmp_path / "run"
    d.mkdir()
    os.symlink(tmp_path / "victim", d / ".blocked.npy.tmp")  # never followed: this one fails
    fd = os.open(d, os.O_RDONLY)
    try:
        q.open(fd, 256 << 20)
        q.failures()  # (earlier tests' failures)
        big = rng.standard_normal(50_000)
        assert q.submit("blocked.npy", b"H" * 64, big, None, True)
        assert q.submit("fine.npy", b"H" * 64, big + 1, None, True)
        assert q.wait(q.ticket(), 30.0)
        assert [n for n, _, _ in q.failures()] == ["blocked.npy"]
        assert not (tmp_path / "victim").exists()
        assert q.close(30.0)
    finally:
        os.close(fd)
    want = burst(d, "p")
    for name, a in want.items():
        raw = (d / name).read_bytes()
        assert raw[:64] == b"H" * 64 and np.array_equal(np.frombuffer(raw[64:]), a), name
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]
    r0 = next(n for n in want if n.endswith("_link.npy"))
    assert (d / r0).stat().st_ino == (d / r0.replace("link", "3")).stat().st_ino

    c = tmp_path / "child"
    c.mkdir()
    pid = os.fork()
    if pid == 0:  # the child: its queue and helper start afresh
        code = 1
        try:
            got = burst(c, "c", rounds=20)
            code = 0 if all(np.array_equal(np.frombuffer((c / n).read_bytes()[64:]), a)
                            for n, a in got.items()) else 2  # fmt: skip
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_dump_blocks_are_reused_within_a_bound_and_given_back(tmp_path: Path) -> None:
    """The native queue keeps the blocks of dumps of 32 KiB and more once written (up to
    half the queue's memory) and hands them to the next dumps of their size: every file has
    its own bytes all the same, the kept bytes stay within the bound, close() gives them
    back, and a forked child starts with none of its parent's."""
    mod = core.dumpio()
    if mod is None:
        pytest.skip("no native dump writer")
    q = dumps.NativeQueue(mod)
    rng = np.random.default_rng(7)
    d = tmp_path / "run"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    want: dict[str, np.ndarray] = {}
    try:
        q.open(fd, 8 << 20)
        kept, most, hits0, misses0 = mod.pool()
        assert most == 4 << 20
        for i in range(24):  # one at a time: each finds the block the one before gave back
            a = rng.standard_normal(40_000 if i % 2 else 5_000)  # 320 KB (a file), 40 KB
            want[f"a{i}.npy"] = a
            assert q.submit(f"a{i}.npy", b"H" * 64, a, None, True)
            assert q.wait(q.ticket(), 30.0)
        kept, most, hits, misses = mod.pool()
        assert hits - hits0 >= 20 and misses - misses0 <= 4, (hits, misses)
        assert 0 < kept <= most
        for i in range(40):  # 40 MB through an 8 MB queue: at most 4 MB kept
            a = np.full(1 << 17, float(i))
            want[f"b{i}.npy"] = a
            assert q.submit(f"b{i}.npy", b"H" * 64, a, None, True)
        # forked with jobs still queued: the child frees the parent's jobs, and keeps none
        # of their blocks nor the pool's
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, f"{mod.pool()[0]} {mod.counters()[0]}".encode())
            os._exit(0)
        os.close(w)
        assert os.read(r, 64) == b"0 0"
        os.close(r)
        os.waitpid(pid, 0)
        assert q.wait(q.ticket(), 60.0)
        assert 0 < mod.pool()[0] <= most
        assert q.close(30.0)
        deadline = time.monotonic() + 10
        while mod.pool()[0] and time.monotonic() < deadline:  # (the writer exits after close)
            time.sleep(0.01)
        assert mod.pool()[0] == 0
    finally:
        os.close(fd)
    for name, a in want.items():
        raw = (d / name).read_bytes()
        assert raw[:64] == b"H" * 64 and np.array_equal(np.frombuffer(raw[64:]), a), name


def _takes_o_direct(d: Path) -> bool:
    """The file system of folder d opens files with O_DIRECT (ext4, xfs; tmpfs since 6.6)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    p = d / "o_direct_probe"
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        if p.exists():
            p.unlink()


@pytest.mark.skipif(core.dumpio() is None, reason="the native dump writer is not built")
@pytest.mark.parametrize("setting", ["on", "auto", "off", "refused"])
def test_large_files_written_with_o_direct_are_whole(tmp_path: Path, setting: str) -> None:
    """PPROBE_DUMP_DIRECT: large dumps (256 KiB and more, one file each) go with O_DIRECT
    from their page-aligned block, their last partial page through the page cache: every file
    holds exactly its bytes whatever its size's remainder by the page, no temporary is left,
    and the counter says how many went that way: all with `on`, at least the helper's with
    `auto` (the worker's too when they were the faster way), none with `off`. `refused`: `on`
    where the file system creates each file and then refuses O_DIRECT (tmpfs before Linux
    6.6): the temporary file it made goes, every file is written through the page cache, and
    direct() says the folder refused."""
    mod = core.dumpio()
    q = dumps.NativeQueue(mod)
    rng = np.random.default_rng(5)
    d = tmp_path / "run"
    d.mkdir()
    if setting != "off" and not _takes_o_direct(d):
        pytest.skip("this file system refuses O_DIRECT")
    mod.direct(dumps.DIRECT_CODES["on" if setting == "refused" else setting], setting == "refused")
    fd = os.open(d, os.O_RDONLY)
    try:
        q.open(fd, 256 << 20)
        q.failures()  # (earlier tests')
        _, ok, start = mod.direct()
        want: dict[str, bytes] = {}
        helper0 = mod.helper_files()
        for r in range(12):
            for i, n in enumerate((262_144 - 64, 262_144 + 1, 300_001, 1 << 20, 4096 * 70 + 7)):
                a = rng.integers(0, 256, n, dtype=np.uint8)
                header = bytes([65 + i]) * (64 + i)  # headers of odd lengths too
                name = f"f{r}_{i}.npy"
                assert q.submit(name, header, a, None, True)
                want[name] = header + a.tobytes()
            assert q.submit(f"f{r}_link.npy", b"", None, f"f{r}_2.npy", True)
            want[f"f{r}_link.npy"] = want[f"f{r}_2.npy"]
            assert q.wait(q.ticket(), 30.0)
        assert q.close(30.0)
        _, ok_after, end = mod.direct()
    finally:
        os.close(fd)
        mod.direct(dumps.DIRECT_CODES["auto"], False)
    for name, raw in want.items():
        assert (d / name).read_bytes() == raw, name
    assert sorted(p.name for p in d.iterdir()) == sorted(want)  # (no .tmp left)
    assert q.failures() == []
    went = end - start
    if setting == "refused":
        assert ok and not ok_after and went == 0  # (refused at the first file, then buffered)
        return
    assert ok and ok_after
    if setting == "on":
        assert went == 5 * 12  # every file of 256 KiB and more, the first included
    elif setting == "auto":
        assert went >= mod.helper_files() - helper0 > 0  # the helper's, and the worker's?
    else:
        assert went == 0


def test_o_direct_dumps_load_back_and_meta_counts_them(tmp_path: Path) -> None:
    """Through the bootstrap: 1 MB arrays dumped with PPROBE_DUMP_DIRECT=on load back
    bit-exact, and meta.json says how many files went with O_DIRECT (None with the Python
    writer, which writes through the page cache)."""
    r = run_script(
        tmp_path,
        """
        import numpy as np
        rng = np.random.default_rng(0)
        for i in range(6):
            np.negative(rng.random(131_072 + i, dtype=np.float32))
        """,
        env={"PPROBE_DUMP_DIRECT": "on"},
    ).check()
    m = meta(r.run_dir)["dumps"]
    assert m["direct"] == "on" and m["direct_refused"] is False
    rows = _of(r.run_dir, "numpy.negative")
    assert len(rows) == 12
    import pprobe

    rng = np.random.default_rng(0)
    for i in range(6):
        x = rng.random(131_072 + i, dtype=np.float32)
        by_role = {t["role"]: t for t in rows if t["shape"] == [131_072 + i]}
        assert np.array_equal(pprobe.load(by_role["input"], run=str(r.run_dir)), x)
        assert np.array_equal(pprobe.load(by_role["output"], run=str(r.run_dir)), -x)
    if m["writer"] == "native":
        assert m["direct_files"] == 12
        # 12 copies of ~512 KB, each into a kept block or a new one
        assert m["blocks_reused"] + m["blocks_fresh"] == 12 and m["blocks_fresh"] >= 1
    else:
        assert m["direct_files"] is None and m["blocks_reused"] is None


def test_a_content_whose_file_failed_is_written_again(tmp_path: Path) -> None:
    """A dump whose file could not be written (here a symlink planted at its temporary name,
    never followed) leaves the seen contents: the next dump of the same content is a file of
    its own, not a hard link to the file that does not exist."""
    d = dumps.Dumper(str(tmp_path), 64 << 20)
    a = np.arange(100_000, dtype=np.float64)  # 800 KB: a file, new content
    name, note = d.dump(np.ones(3), "x", "input0", "1-1")
    assert name and note is None
    planted = ".op_x_input0_1-2.npy.tmp"
    os.symlink(tmp_path / "victim", tmp_path / planted)
    first, note = d.dump(a, "x", "input0", "1-2")
    assert first == "op_x_input0_1-2.npy" and note is None
    failed = d.barrier()
    assert first in failed and not (tmp_path / first).exists()
    assert not (tmp_path / "victim").exists()
    again, note = d.dump(a.copy(), "x", "input0", "1-3")
    assert again == "op_x_input0_1-3.npy" and note is None
    assert d.barrier().keys() == {first}
    assert (tmp_path / again).stat().st_nlink == 1  # a file, not a link
    assert np.array_equal(np.load(tmp_path / again), a)
    # and the content is seen again: its next dump is a link to that file
    third, _ = d.dump(a.copy(), "x", "input0", "1-4")
    d.barrier()
    assert (tmp_path / third).stat().st_ino == (tmp_path / again).stat().st_ino
    d.close()
