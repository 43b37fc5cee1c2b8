"""The .npy dumps: names, values equal to a re-computation, values at call time, atomic files,
object and masked arrays, the byte budget (shared by a run's processes) and selective capture."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import meta, ops, run_script, tensors


@pytest.fixture(autouse=True)
def _one_file_per_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the one-file-per-dump storage (names, links, modes, symlinks) on
    disk; small dumps packed into pack files are tested in tests/test_dump_pack.py."""
    monkeypatch.setenv("PPROBE_DUMP_PACK", "0")


def _resolve(op: str):  # "numpy.linalg.svd" -> np.linalg.svd, "numpy.add.reduce" -> ...
    obj = np
    for part in op.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _no_tmp_left(run_dir: Path) -> None:
    left = [p.name for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert left == []


def test_dump_names_and_values_equal_a_recomputation(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        rng = np.random.default_rng(5)
        a = rng.standard_normal(6)
        b = rng.standard_normal(6) + 3
        m = rng.standard_normal((4, 3))
        i = rng.integers(-9, 9, size=(3, 3))
        np.add(a, b)
        np.divmod(a, b)
        np.linalg.svd(m)
        np.sum(m)
        np.add.reduce(m)
        np.multiply.outer(a, b)
        np.concatenate([a, b])
        np.matmul(i, i)
        np.sort(a)
        np.linalg.qr(m)
        np.frexp(b)
        np.cumsum(i)
        """,
    ).check()
    run_dir = r.run_dir
    rows = ops(run_dir, "kind NOT IN ('operator', 'method')")  # `+ 3`: test_numpy_operators
    recomputed = 0
    for row in rows:
        if row["op"] in ("numpy.random.default_rng",) or row["op"].startswith("numpy.random"):
            continue
        t = tensors(run_dir, f"seq = {row['seq']}")
        outs = [x for x in t if x["role"] == "output"]
        for x in t:
            which = (
                f"input{x['idx']}"
                if x["role"] == "input"
                else (f"output{x['idx']}" if len(outs) > 1 else "output")
            )
            assert x["dump_path"] == f"op_{row['op']}_{which}_{row['pid']}-{row['seq']}.npy"
            assert (run_dir / x["dump_path"]).is_file()
        ins = [x for x in t if x["role"] == "input"]
        if not ins:
            continue
        args: list = []
        for x in ins:  # "0", "1" positional; "0.0", "0.1": items of a list argument
            v = np.load(run_dir / x["dump_path"], allow_pickle=False)
            if "." in x["idx"]:
                pos = int(x["idx"].split(".")[0])
                while len(args) <= pos:
                    args.append([])
                args[pos].append(v)
            else:
                args.append(v)
        want = _resolve(row["op"])(*args)
        want = list(want) if isinstance(want, tuple) else [want]
        assert len(want) == len(outs), row["op"]
        for x, w in zip(outs, want):
            got = np.load(run_dir / x["dump_path"], allow_pickle=False)
            assert got.dtype == np.asarray(w).dtype and got.shape == np.shape(w)
            if row["op"] in ("numpy.linalg.svd", "numpy.linalg.qr"):
                np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)
            else:
                np.testing.assert_array_equal(got, w, strict=True)
        recomputed += 1
    assert recomputed == 12
    names = {row["op"] for row in rows}
    assert {"numpy.divmod", "numpy.linalg.svd", "numpy.frexp"} <= names
    files = {p.name for p in run_dir.glob("*.npy")}
    assert files == {x["dump_path"] for x in tensors(run_dir) if x["dump_path"]}
    _no_tmp_left(run_dir)


def test_dumps_hold_the_values_at_call_time(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        x = np.arange(5.0)
        np.add(x, 1, out=x)            # in place through out=
        y = np.ones(3)
        np.negative(y)
        y[:] = 7                       # changed after the call
        z = np.zeros(4)
        np.add.at(z, [0, 0, 3], 2.0)   # in place, returns None
        dst = np.zeros(2)
        np.copyto(dst, np.array([5.0, 6.0]))
        """,
    ).check()
    run_dir = r.run_dir

    def dumped(op: str, which: str) -> np.ndarray:
        (row,) = ops(run_dir, f"op = '{op}'")
        return np.load(run_dir / f"op_{op}_{which}_{row['pid']}-{row['seq']}.npy")

    np.testing.assert_array_equal(dumped("numpy.add", "input0"), np.arange(5.0))
    np.testing.assert_array_equal(dumped("numpy.add", "output"), np.arange(5.0) + 1)
    np.testing.assert_array_equal(dumped("numpy.negative", "input0"), np.ones(3))
    np.testing.assert_array_equal(dumped("numpy.negative", "output"), -np.ones(3))
    np.testing.assert_array_equal(dumped("numpy.add.at", "input0"), np.zeros(4))
    np.testing.assert_array_equal(dumped("numpy.copyto", "input0"), np.zeros(2))
    np.testing.assert_array_equal(dumped("numpy.copyto", "input1"), [5.0, 6.0])
    (out_row,) = tensors(run_dir, "idx = 'out'")
    assert out_row["dump_path"] is None and "out=" in out_row["note"]
    _no_tmp_left(run_dir)


def test_object_arrays_are_not_dumped_and_masked_arrays_say_what_was_saved(
    tmp_path: Path,
) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        # numpy.ma is loaded lazily here, while the probe is already dumping (a regression:
        # describing the calls numpy.ma's own import makes must not recurse).
        ma = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
        np.add(ma, 1)
        o = np.array([1, "a", None], dtype=object)
        np.concatenate([o, o])
        """,
    ).check()
    assert r.pprobe_lines() == []
    run_dir = r.run_dir
    (cat,) = ops(run_dir, "op = 'numpy.concatenate'")
    t = tensors(run_dir, f"seq = {cat['seq']}")
    assert [x["dtype"] for x in t] == ["object"] * 3
    for x in t:
        assert x["dump_path"] is None
        assert "object" in x["note"]
    assert not list(run_dir.glob("op_numpy.concatenate_*"))

    (add,) = ops(run_dir, "op = 'numpy.add'")
    t = tensors(run_dir, f"seq = {add['seq']}")
    for x in t:
        assert "mask" in x["note"]
        data = np.load(run_dir / x["dump_path"], allow_pickle=False)
        want = np.array([1.0, 2.0, 3.0]) + (1 if x["role"] == "output" else 0)
        np.testing.assert_array_equal(data[[0, 2]], want[[0, 2]])
    _no_tmp_left(run_dir)


def test_budget_stops_dumping_but_not_logging(tmp_path: Path) -> None:
    budget = 20_000
    r = run_script(
        tmp_path,
        """
        import numpy as np
        for i in range(50):
            np.add(np.full(200, float(i)), 1.0)   # 1,600 bytes per array
        """,
        env={"PPROBE_BUDGET": str(budget)},
    ).check()
    run_dir = r.run_dir
    assert len(ops(run_dir)) == 100  # logging goes on
    t = tensors(run_dir)
    files = list(run_dir.glob("*.npy"))
    assert 0 < len(files) < len(t)
    # Each output is the next input's content: stored once, as hard links to one file.
    inodes = {f.stat().st_ino: f.stat().st_size for f in files}
    assert len(inodes) < len(files)
    assert sum(inodes.values()) <= budget
    dumped = [x["dump_path"] is not None for x in t]
    first_miss = dumped.index(False)
    assert not any(dumped[first_miss:])  # stops for good
    for x in t[first_miss:]:
        assert "budget" in x["note"]
    m = meta(run_dir)
    assert m["dumps"]["exhausted"] is True
    assert m["dumps"]["files"] == len(inodes)
    assert m["dumps"]["files"] + m["dumps"]["links"] == len(files)
    assert any("PPROBE_BUDGET" in w for w in m["warnings"])
    lines = r.pprobe_lines()
    assert len(lines) == 1 and "PPROBE_BUDGET" in lines[0]


def test_budget_is_shared_by_the_processes_of_a_run(tmp_path: Path) -> None:
    budget = 3 * 1024 * 1024
    r = run_script(
        tmp_path,
        """
        import multiprocessing as mp, os, subprocess, sys
        import numpy as np
        CHILD = "import numpy as np\\nfor i in range(10): np.copy(np.full(25600, float(i)))"
        def work():
            for i in range(10):
                np.copy(np.full(25600, float(i)))   # 200 KiB in, 200 KiB out
        if __name__ == "__main__":
            np.copy(np.ones(1000))
            for k in range(2):
                subprocess.run([sys.executable, "-c", CHILD], check=True)
            p = mp.get_context("fork").Process(target=work)
            p.start(); p.join()
            print(os.getpid())
        """,
        env={"PPROBE_BUDGET": str(budget), "PPROBE_MODE": "dump"},
    ).check()
    run_dir = r.run_dir
    files = list(run_dir.glob("*.npy"))
    # np.copy's output has its input's content: one file, and a hard link to it
    inodes = {f.stat().st_ino: f.stat().st_size for f in files}
    assert len(inodes) < len(files)
    assert sum(inodes.values()) <= budget
    pids = {int(f.name.rsplit("_", 1)[1].split("-")[0]) for f in files}
    assert len(pids) >= 2  # more than one process dumped
    t = tensors(run_dir)
    assert len({x["pid"] for x in t}) == 4
    assert any(x["note"] and "budget" in x["note"] for x in t)
    assert len(ops(run_dir)) == 2 + 3 * 20
    # The run's metadata says the run's budget is used up, though a child used it up.
    m = meta(run_dir)
    assert m["dumps"]["exhausted"] is True
    procs = [json.loads(p.read_text()) for p in (run_dir / "procs").glob("*.json")]
    assert any(p["dumps"] and p["dumps"]["exhausted"] for p in procs if p["pid"] != m["pid"])


# ----------------------------------------------------------------------- selective capture
CAPTURE_PROG = """
    import numpy as np
    import pprobe
    f32 = np.ones(3, dtype=np.float32)
    f64 = np.ones(3, dtype=np.float64)
    i64 = np.ones((2, 2), dtype=np.int64)
    for step in range(6):
        pprobe.step(step)
        for i in range(4):
            np.add(f32, 1)
            np.multiply(f64, 2)
            np.linalg.norm(f32)
            np.matmul(i64, i64)
"""


def _capture_calls() -> list[tuple[str, int, str]]:
    """(op, step, dtype that decides PPROBE_DTYPES) of every call CAPTURE_PROG makes."""
    calls = [("numpy.ones", 0, d) for d in ("float32", "float64", "int64")]
    for step in range(6):
        for _ in range(4):
            calls += [
                ("numpy.add", step, "float32"),
                ("numpy.multiply", step, "float64"),
                ("numpy.linalg.norm", step, "float32"),
                ("numpy.matmul", step, "int64"),
            ]
    return calls


def _expected(env: dict[str, str]) -> list[tuple[str, int]]:
    """Apply the documented rules in their order: step window, include/exclude, then every-N /
    first-N per op (counting calls that passed the first two), then dtypes."""
    import fnmatch

    def hit(op: str, pats: str) -> bool:
        short = op.rsplit(".", 1)[-1]
        return any(
            fnmatch.fnmatchcase(op, p) or ("." not in p and fnmatch.fnmatchcase(short, p))
            for p in pats.split(",")
        )

    steps: set[int] = set()
    for part in env.get("PPROBE_STEPS", "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            steps |= set(range(int(lo), int(hi or lo) + 1))
    every = int(env.get("PPROBE_EVERY", 1))
    first = int(env.get("PPROBE_FIRST", 0))
    dtypes = set(filter(None, env.get("PPROBE_DTYPES", "").split(",")))
    seen: dict[str, int] = {}
    out = []
    for op, step, dtype in _capture_calls():
        if steps and step not in steps:
            continue
        if "PPROBE_INCLUDE" in env and not hit(op, env["PPROBE_INCLUDE"]):
            continue
        if "PPROBE_EXCLUDE" in env and hit(op, env["PPROBE_EXCLUDE"]):
            continue
        n = seen.get(op, 0)
        seen[op] = n + 1
        if (first and n >= first) or n % every:
            continue
        if dtypes and dtype not in dtypes:
            continue
        out.append((op, step))
    return out


@pytest.mark.parametrize(
    "env",
    [
        {"PPROBE_INCLUDE": "numpy.linalg.*,*matmul"},
        {"PPROBE_EXCLUDE": "add,numpy.ones"},
        {"PPROBE_EVERY": "3"},
        {"PPROBE_FIRST": "2"},
        {"PPROBE_STEPS": "2-3,5"},
        {"PPROBE_DTYPES": "float32"},
        {"PPROBE_STEPS": "1-4", "PPROBE_EVERY": "3", "PPROBE_INCLUDE": "*add,*multiply,*norm"},
        {"PPROBE_FIRST": "5", "PPROBE_DTYPES": "int64,float64", "PPROBE_EXCLUDE": "*ones"},
    ],
    ids=lambda e: ",".join(f"{k[7:]}={v}" for k, v in e.items()),
)
def test_selective_capture(tmp_path: Path, env: dict[str, str]) -> None:
    r = run_script(tmp_path, CAPTURE_PROG, env=env).check()
    rows = ops(r.run_dir)
    want = _expected(env)
    assert 0 < len(want) < len(_capture_calls())
    assert [(x["op"], x["step"]) for x in rows] == want
    # Dumps follow the rows: exactly the captured calls have files.
    prefixes = {f"{x['pid']}-{x['seq']}" for x in rows}
    files = {p.name.rsplit("_", 1)[1][: -len(".npy")] for p in r.run_dir.glob("*.npy")}
    assert files == prefixes
    assert meta(r.run_dir)["config"]["every"] == int(env.get("PPROBE_EVERY", 1))


def test_steps_window_also_applies_to_dumps_of_every_process(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import os
        import numpy as np
        import pprobe
        for step in range(4):
            pprobe.step(step)
            np.add(np.ones(2), step)
        pid = os.fork()
        if pid == 0:
            pprobe.step(2)
            np.add(np.ones(2), 10)
            pprobe.step(3)
            np.add(np.ones(2), 11)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        env={"PPROBE_STEPS": "2"},
    ).check()
    rows = ops(r.run_dir)
    assert {x["step"] for x in rows} == {2}
    assert sorted(x["args"] for x in rows if x["op"] == "numpy.add") == ["1=10", "1=2"]
    assert len({x["pid"] for x in rows}) == 2
    assert len(list(r.run_dir.glob("*.npy"))) == sum(
        1 for x in tensors(r.run_dir) if x["dump_path"]
    )
    assert os.path.isdir(r.run_dir)
