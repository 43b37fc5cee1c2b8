"""PPROBE_DUMP_KEEP=steps:K (a ring of the last K steps' dumps) and PPROBE_ON_NAN=dump (the
NaN's step and the K before it kept past the budget), end to end and in process."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from helpers import meta, npy_files, run_script, sql

from pprobe import config, dumpkeep, state
from pprobe.dumps import Dumper

# Each step multiplies a fresh random array by 2: every step's dumps are distinct contents.
RING = """
    import sys
    import numpy as np
    import pprobe
    steps = int(sys.argv[1])
    for s in range(steps):
        pprobe.step(s)
        a = np.random.default_rng(s).standard_normal(500)
        np.multiply(a, 2.0)
"""


def rows(run_dir: Path, op: str = "numpy.multiply") -> list[dict[str, Any]]:
    return sql(
        run_dir,
        "SELECT o.step, o.seq, o.pid, t.role, t.dump_path, t.note FROM ops o "
        f"JOIN tensors t USING (pid, seq) WHERE o.op = '{op}' ORDER BY o.seq, t.role",
    )


def expected(step: int, role: str) -> np.ndarray:
    a = np.random.default_rng(step).standard_normal(500)
    return a if role == "input" else a * 2.0


def disk_bytes(run_dir: Path) -> int:
    """Bytes of the run's .npy files on disk, each inode (hard links: one content) once."""
    sizes = {}
    for f in npy_files(run_dir):
        st = os.stat(run_dir / f)
        sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


def kept_files_match_the_rows(run_dir: Path) -> None:
    """Every .npy on disk is pointed to by a row, and every row's dump is on disk."""
    paths = {r["dump_path"] for r in sql(run_dir, "SELECT dump_path FROM tensors")}
    paths.discard(None)
    assert set(npy_files(run_dir)) == paths


@pytest.mark.parametrize("k", [1, 3])
def test_the_ring_keeps_the_dumps_of_the_last_k_steps(tmp_path: Path, k: int) -> None:
    n = 6
    r = run_script(tmp_path, RING, str(n), env={"PPROBE_DUMP_KEEP": f"steps:{k}"}).check()
    got = rows(r.run_dir)
    assert sorted({g["step"] for g in got}) == list(range(n))
    for g in got:
        if g["step"] >= n - k:
            assert g["note"] is None
            np.testing.assert_array_equal(
                np.load(r.run_dir / g["dump_path"]), expected(g["step"], g["role"])
            )
        else:
            assert g["dump_path"] is None
            assert g["note"] == (
                f"dump dropped: step {g['step']} left the last {k} steps kept (PPROBE_DUMP_KEEP)"
            )
    kept_files_match_the_rows(r.run_dir)
    d = meta(r.run_dir)["dumps"]
    assert d["keep_steps"] == k
    # 2 files per step dropped, plus np.random's own arrays' dumps of those steps, if any
    assert d["dropped_files"] == len(sql(r.run_dir, "SELECT 1 FROM tensors WHERE note LIKE "
                                                    "'dump dropped%'"))  # fmt: skip
    assert d["bytes_reserved"] == disk_bytes(r.run_dir)


def test_the_budget_counts_only_what_is_kept(tmp_path: Path) -> None:
    one_step = 2 * (4000 + 128)  # an input and an output of 500 float64, with their headers
    budget = 3 * one_step + 1000  # three steps fit, not four
    env = {"PPROBE_BUDGET": str(budget)}
    plain = run_script(tmp_path / "plain", RING, "12", env=env).check()
    ring = run_script(tmp_path / "ring", RING, "12", env={**env, "PPROBE_DUMP_KEEP": "steps:2"})
    ring.check()
    # Without the ring the first steps take the budget and the last ones are not dumped.
    last = [g for g in rows(plain.run_dir) if g["step"] == 11]
    assert all(g["dump_path"] is None and g["note"].startswith("not dumped") for g in last)
    # With it every step is dumped while it is among the last two; the last two are kept.
    got = rows(ring.run_dir)
    assert not [g for g in got if (g["note"] or "").startswith("not dumped")]
    assert {g["step"] for g in got if g["dump_path"]} == {10, 11}
    d = meta(ring.run_dir)["dumps"]
    assert not d["exhausted"] and d["skipped"] == 0
    assert disk_bytes(ring.run_dir) == d["bytes_reserved"] <= budget
    assert "used up" not in ring.err


def test_repeated_contents_stay_linked_to_a_kept_file(tmp_path: Path) -> None:
    """The same input every step is a hard link to the first file; the ring deletes the
    first names, and the link of a kept step still reads the values."""
    r = run_script(
        tmp_path,
        """
        import numpy as np
        import pprobe
        w = np.linspace(0.0, 1.0, 1000)
        for s in range(5):
            pprobe.step(s)
            np.add(w, float(s))
        """,
        env={"PPROBE_DUMP_KEEP": "steps:2"},
    ).check()
    got = rows(r.run_dir, "numpy.add")
    kept = [g for g in got if g["dump_path"]]
    assert {g["step"] for g in kept} == {3, 4}
    w = np.linspace(0.0, 1.0, 1000)
    for g in kept:
        want = w if g["role"] == "input" else w + g["step"]
        np.testing.assert_array_equal(np.load(r.run_dir / g["dump_path"]), want)
    kept_files_match_the_rows(r.run_dir)
    d = meta(r.run_dir)["dumps"]
    assert d["links"] >= 4
    # bytes reserved: w once (its newest name holds the inode), and the two outputs
    assert d["bytes_reserved"] == 3 * (8000 + 128)


def test_each_process_keeps_its_own_ring(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(
        "import numpy as np, pprobe\n"
        "for s in range(100, 104):\n"
        "    pprobe.step(s)\n"
        "    np.multiply(np.random.default_rng(s).standard_normal(500), 2.0)\n"
    )
    r = run_script(
        tmp_path,
        textwrap.dedent(RING).replace("steps = int(sys.argv[1])", "steps = 4")
        + f"\nimport subprocess\nsubprocess.run([sys.executable, {str(child)!r}], check=True)\n",
        env={"PPROBE_DUMP_KEEP": "steps:1"},
    ).check()
    got = rows(r.run_dir)
    assert len({g["pid"] for g in got}) == 2
    kept = {g["step"] for g in got if g["dump_path"]}
    assert kept == {3, 103}  # each process's last step
    for g in got:
        if g["dump_path"]:
            np.testing.assert_array_equal(
                np.load(r.run_dir / g["dump_path"]), expected(g["step"], g["role"])
            )
    assert len(list((r.run_dir / "dropped").glob("*.csv"))) == 2
    kept_files_match_the_rows(r.run_dir)


NAN = """
    import sys
    import warnings
    import numpy as np
    import pprobe
    warnings.simplefilter("ignore", RuntimeWarning)
    bad = int(sys.argv[1])                     # the step that makes -inf (-1: none)
    for s in range(10):
        pprobe.step(s)
        a = np.random.default_rng(s).standard_normal(500)
        y = np.multiply(a, 2.0)
        if s == bad:
            np.log(y - y)                      # log(0): -inf from finite inputs
"""


@pytest.mark.parametrize("keep", [None, 2])
def test_on_nan_dump_keeps_the_nan_step_and_the_steps_before_it(
    tmp_path: Path, keep: int | None
) -> None:
    one_step = 2 * (4000 + 128)
    env = {"PPROBE_ON_NAN": "dump", "PPROBE_BUDGET": str(2 * one_step + 1000)}
    if keep:
        env["PPROBE_DUMP_KEEP"] = f"steps:{keep}"
    r = run_script(tmp_path, NAN, "7", env=env).check()
    k = keep or 1
    pinned = set(range(7 - k, 8))
    assert f"the dumps of steps {', '.join(map(str, sorted(pinned)))} are kept" in r.err
    got = rows(r.run_dir)
    for g in got:
        s = g["step"]
        if s in pinned or (not keep and s < 2):  # the NaN's steps, and what the budget took
            np.testing.assert_array_equal(
                np.load(r.run_dir / g["dump_path"]), expected(s, g["role"])
            )
        else:
            assert g["dump_path"] is None, g
            if s > 7:  # after the NaN's step: the budget alone, and it is spent
                assert g["note"].startswith("not dumped"), g
            else:
                assert g["note"].startswith("dump dropped"), g
    # the origin's own dumps: its input is zeros, its output -inf
    (log_in, log_out) = (
        sorted(rows(r.run_dir, "numpy.log"), key=lambda g: g["role"])[0]["dump_path"],
        sorted(rows(r.run_dir, "numpy.log"), key=lambda g: g["role"])[1]["dump_path"],
    )
    assert not np.load(r.run_dir / log_in).any()
    assert np.isneginf(np.load(r.run_dir / log_out)).all()
    kept_files_match_the_rows(r.run_dir)
    assert meta(r.run_dir)["dumps"]["nan_steps_kept"] == sorted(pinned)


def test_on_nan_dump_without_a_nan_releases_what_it_held(tmp_path: Path) -> None:
    budget = 3 * 2 * (4000 + 128) + 1000
    r = run_script(
        tmp_path, NAN, "-1", env={"PPROBE_ON_NAN": "dump", "PPROBE_BUDGET": str(budget)}
    ).check()
    got = rows(r.run_dir)
    assert {g["step"] for g in got if g["dump_path"]} == {0, 1, 2}  # what the budget took
    held = [g for g in got if g["step"] >= 3]
    assert all(g["note"].startswith("dump dropped: held past the budget") for g in held)
    kept_files_match_the_rows(r.run_dir)
    d = meta(r.run_dir)["dumps"]
    assert disk_bytes(r.run_dir) == d["bytes_reserved"] <= budget
    assert d["held_bytes"] == 0 and d["nan_steps_kept"] == []


def test_a_bad_value_names_the_variable(tmp_path: Path) -> None:
    r = run_script(tmp_path, "import numpy as np\nnp.add(1, 2)\n",
                   env={"PPROBE_DUMP_KEEP": "steps:0"})  # fmt: skip
    assert "PPROBE_DUMP_KEEP='steps:0' is not valid; allowed: all, steps:K (K >= 1)" in r.err


# ---------------------------------------------------------------------- in process
def test_keep_setting_parses() -> None:
    assert config._keep("PPROBE_DUMP_KEEP", "all") == 0
    assert config._keep("PPROBE_DUMP_KEEP", " Steps:12 ") == 12
    assert config._keep("PPROBE_DUMP_KEEP", 3) == 3  # resolved, handed to a child
    for bad in ("steps:0", "steps:", "3", "bytes:10", "steps:-1"):
        with pytest.raises(config.ConfigError, match="PPROBE_DUMP_KEEP"):
            config._keep("PPROBE_DUMP_KEEP", bad)


@pytest.fixture
def step_back() -> Any:
    old = state.step
    yield
    state.step = old


def test_dumper_ring_in_process(tmp_path: Path, step_back: None) -> None:
    d = Dumper(str(tmp_path), 1 << 20, keep=2, host="h")
    names = {}
    seq = 0
    pid = os.getpid()
    for s in range(5):
        state.step = s
        for j in range(2):
            seq += 1
            names[seq] = (
                s,
                d.dump(np.full(100, s * 10 + j, np.int64), "op", "output", f"{pid}-{seq}"),
            )
    d.close()
    on_disk = {p.name for p in tmp_path.glob("*.npy")}
    assert on_disk == {n for (s, (n, _)) in names.values() if s >= 3}
    for _s, (n, note) in names.values():
        assert note is None and n is not None
    lines = (tmp_path / "dropped" / f"h-{os.getpid()}.csv").read_text().splitlines()
    assert lines == [f"{pid},0,1,2,keep,2", f"{pid},1,3,4,keep,2", f"{pid},2,5,6,keep,2"]
    assert d.used == 4 * (800 + 128)
    assert d.summary()["dropped_files"] == 6


def test_the_tensors_view_marks_dropped_ranges(tmp_path: Path) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("7,0,1,2,keep,2\n7,3,6,6,nan,1\n8,0,1,1,keep,2\n7,9,12,")  # a cut last line
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE raw AS SELECT * FROM (VALUES (7, 1, 'a.npy', NULL), (7, 2, 'b.npy', NULL),"
        " (7, 3, 'c.npy', NULL), (7, 6, 'd.npy', NULL), (8, 1, NULL, 'not dumped: x'),"
        " (8, 2, 'e.npy', NULL), (7, 12, 'f.npy', NULL)) t(pid, seq, dump_path, note)"
    )
    dumpkeep.register_view(con, "raw", [str(csv)])
    got = con.execute("SELECT pid, seq, dump_path, note FROM tensors ORDER BY pid, seq").fetchall()
    assert got == [
        (7, 1, None, "dump dropped: step 0 left the last 2 steps kept (PPROBE_DUMP_KEEP)"),
        (7, 2, None, "dump dropped: step 0 left the last 2 steps kept (PPROBE_DUMP_KEEP)"),
        (7, 3, "c.npy", None),
        (
            7,
            6,
            None,
            "dump dropped: held past the budget for PPROBE_ON_NAN=dump, released as "
            "no NaN came within 1 steps",
        ),  # fmt: skip
        (7, 12, "f.npy", None),  # the cut line is ignored
        (8, 1, None, "not dumped: x"),
        (8, 2, "e.npy", None),
    ]
