"""The Arrow log: stream shards that survive kill -9, the documented columns, and statistics
that equal a NumPy re-computation."""

from __future__ import annotations

import glob
import json
import math
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    BOOTSTRAP,
    PYTHON,
    clean_env,
    load_dump,
    meta,
    npy_files,
    ops,
    run_script,
    sql,
    tensors,
    write,
)

OPS_COLUMNS = [
    "run_id", "seq", "pid", "rank", "thread", "ts_ns", "dur_ns", "framework", "op", "kind",
    "caller", "step", "depth", "parent",
]  # fmt: skip
TENSOR_COLUMNS = [
    "pid", "seq", "role", "idx", "shape", "dtype", "min", "max", "mean", "std", "nan_count",
    "inf_count", "dump_path",
]  # fmt: skip


def test_kill_9_keeps_every_flushed_batch(tmp_path: Path) -> None:
    from pprobe.query import read_shard

    script = write(
        tmp_path / "prog.py",
        """
        import time
        import numpy as np
        i = 0
        while True:
            np.add(np.full(1000, float(i)), 1.0)
            i += 1
            time.sleep(0.0005)
        """,
    )
    out = tmp_path / "out"
    env = clean_env(PYTHONPATH=str(BOOTSTRAP), PPROBE_OUTPUT=str(out), PPROBE_FLUSH_SECONDS="0.05")
    proc = subprocess.Popen(
        [PYTHON, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen = 0
    try:
        deadline = time.monotonic() + 60
        while seen < 300 and time.monotonic() < deadline:
            time.sleep(0.02)
            for shard in glob.glob(str(out / "*" / "log" / "ops-*.arrows")):
                batches, _ = read_shard(shard)
                seen = sum(b.num_rows for b in batches)
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert seen >= 300, f"only {seen} rows flushed in 60 s\n{err.decode()}"

    run_dir = (out / "latest").resolve()
    rows = ops(run_dir)
    # Batches are written whole and in order: what is readable is a prefix of the calls.
    assert len(rows) >= seen
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert [r["op"] for r in rows] == ["numpy.full", "numpy.add"] * (len(rows) // 2) + [
        "numpy.full"
    ] * (len(rows) % 2)
    # Tensor rows are written before their op rows: every visible op has its tensors.
    t = tensors(run_dir)
    per_seq: dict[int, list[str]] = {}
    for x in t:
        per_seq.setdefault(x["seq"], []).append(f"{x['role']}{x['idx']}")
    for r in rows:
        want = ["output0"] if r["op"] == "numpy.full" else ["input0", "output0"]
        assert sorted(per_seq[r["seq"]]) == want
    # No half-written .npy is ever visible: every one loads whole, with the right values.
    files = npy_files(run_dir)  # files and pack entries (PPROBE_DUMP_PACK)
    assert len(files) >= seen
    for f in files:
        a = load_dump(run_dir / f)
        assert a.shape == (1000,) and np.all(a == a[0])


def test_documented_columns_and_their_values(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import json, os, threading, time
        import numpy as np
        import pprobe
        t0 = time.time_ns()
        a = np.ones((2, 3), dtype=np.float32)      # step 0
        pprobe.step()
        b = np.add(a, 1)                           # step 1
        pprobe.step(5)
        np.sum(b, axis=0)                          # step 5
        t1 = time.time_ns()
        print(json.dumps({"pid": os.getpid(), "t0": t0, "t1": t1}))
        """,
        env={"RANK": "3", "WORLD_SIZE": "4", "PPROBE_MODE": "dump"},
    ).check()
    info = json.loads(r.out)
    run_dir = r.run_dir
    cols = {c["column_name"] for c in sql(run_dir, "DESCRIBE ops")}
    assert set(OPS_COLUMNS) <= cols
    tcols = {c["column_name"] for c in sql(run_dir, "DESCRIBE tensors")}
    assert set(TENSOR_COLUMNS) <= tcols

    rows = ops(run_dir)
    m = meta(run_dir)
    assert [x["op"] for x in rows] == ["numpy.ones", "numpy.add", "numpy.sum"]
    assert [x["kind"] for x in rows] == ["function", "ufunc", "function"]
    assert [x["step"] for x in rows] == [0, 1, 5]
    for x in rows:
        assert x["run_id"] == m["run_id"] == run_dir.name
        assert x["pid"] == info["pid"] == m["pid"]
        assert x["rank"] == 3
        assert x["thread"] == "MainThread"
        assert x["framework"] == "numpy"
        assert (x["depth"], x["parent"]) == (0, None)
        assert info["t0"] <= x["ts_ns"] <= x["ts_ns"] + x["dur_ns"] <= info["t1"]
        assert x["dur_ns"] >= 0
        assert x["caller"].startswith(str(tmp_path / "prog.py") + ":")
    assert rows[0]["seq"] < rows[1]["seq"] < rows[2]["seq"]
    assert rows[0]["ts_ns"] <= rows[1]["ts_ns"] <= rows[2]["ts_ns"]

    t = tensors(run_dir, f"seq = {rows[1]['seq']}")
    assert [(x["role"], x["idx"], x["shape"], x["dtype"]) for x in t] == [
        ("input", "0", [2, 3], "float32"),
        ("output", "0", [2, 3], "float32"),
    ]
    for x in t:
        assert x["pid"] == info["pid"]
        assert load_dump(run_dir / x["dump_path"]).shape == tuple(x["shape"])
    assert m["rank"] == 3


STATS_PROG = """
    import pickle, sys
    import numpy as np
    arrays = [
        np.array([1.0, np.nan, np.inf, -np.inf, -2.5, 4.0]),
        np.array([np.nan, np.inf], dtype=np.float32),
        np.linspace(-3, 7, 50, dtype=np.float16),
        np.arange(-5, 20, dtype=np.int64) ** 3,
        np.array([250, 3, 7], dtype=np.uint8),
        np.array([True, False, True, True]),
        np.array([3 + 4j, 1 - 1j, -2j]),
        np.array([], dtype=np.float64),
        np.array(2.5),
        np.array(["a", "bc"]),
        np.array([1, "x"], dtype=object),
        np.zeros(2, dtype=[("a", "f4"), ("b", "i2")]),
        np.random.default_rng(3).standard_normal((7, 9)),
    ]
    for a in arrays:
        np.copy(a)
    with open(sys.argv[1], "wb") as f:
        pickle.dump(arrays, f)
"""


def expected_stats(a: np.ndarray) -> tuple:
    """(min, max, mean, std, nan_count, inf_count) as the log documents them: min..std over
    the finite values (magnitudes for complex), NULL for non-numeric dtypes."""
    if a.dtype.kind not in "biufc" or a.dtype.names:
        return (None,) * 6
    x = np.abs(a) if a.dtype.kind == "c" else a
    x = x.astype(np.float64).ravel()
    nan = int(np.isnan(x).sum())
    inf = int(np.isinf(x).sum())
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return (None, None, None, None, nan, inf)
    return (
        float(finite.min()),
        float(finite.max()),
        float(finite.mean()),
        float(finite.std()),
        nan,
        inf,
    )


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_statistics_equal_a_numpy_recomputation(tmp_path: Path, mode: str) -> None:
    r = run_script(tmp_path, STATS_PROG, str(tmp_path / "arrays.pkl"), env={"PPROBE_MODE": mode})
    r.check()
    arrays = pickle.loads((tmp_path / "arrays.pkl").read_bytes())
    rows = ops(r.run_dir, "op = 'numpy.copy'")
    assert len(rows) == len(arrays)
    for row, a in zip(rows, arrays):
        t = tensors(r.run_dir, f"seq = {row['seq']}")
        assert [x["role"] for x in t] == ["input", "output"]
        for x in t:
            assert x["dtype"] == str(a.dtype)
            assert x["shape"] == list(a.shape)
            got = tuple(x[k] for k in ("min", "max", "mean", "std", "nan_count", "inf_count"))
            want = expected_stats(a)
            assert got[4:] == want[4:], (a, got, want)
            for g, w in zip(got[:4], want[:4]):
                if w is None:
                    assert g is None, (a, got, want)
                else:
                    assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12), (a, got, want)


def test_log_mode_has_shapes_but_no_statistics_or_dumps(tmp_path: Path) -> None:
    r = run_script(tmp_path, STATS_PROG, str(tmp_path / "a.pkl"), env={"PPROBE_MODE": "log"})
    t = tensors(r.check().run_dir)
    assert t and all(x["min"] is None and x["nan_count"] is None for x in t)
    assert all(x["dump_path"] is None for x in t)
    assert not npy_files(r.run_dir)
    assert {x["dtype"] for x in t} >= {"float64", "int64", "bool", "object", "<U2"}


def test_one_shard_per_process_named_by_pid(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import os, subprocess, sys
        import numpy as np
        np.add(np.ones(1), 1)
        pid = os.fork()
        if pid == 0:
            np.add(np.ones(1), 2)
            os._exit(0)
        os.waitpid(pid, 0)
        subprocess.run([sys.executable, "-c", "import numpy as np; np.add(np.ones(1), 3)"],
                       check=True)
        print(os.getpid(), pid)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    import pyarrow as pa

    parent, child = map(int, r.out.split())
    shards = sorted(glob.glob(str(r.run_dir / "log" / "*.arrows")))
    by_pid: dict[int, list[str]] = {}
    for s in shards:
        name = os.path.basename(s)
        table, rest = name.split("-", 1)
        pid = int(rest.rsplit("-", 1)[1].split(".")[0])
        by_pid.setdefault(pid, []).append(table)
        with pa.OSFile(s, "rb") as f:
            reader = pa.ipc.open_stream(f)
            assert reader.schema.metadata[b"pid"] == str(pid).encode()
            for b in reader:
                assert set(b.column("pid").to_pylist()) <= {pid}
    assert len(by_pid) == 3 and parent in by_pid and child in by_pid
    assert all(sorted(v) == ["ops", "stacks", "tensors"] for v in by_pid.values())
    counts = sql(r.run_dir, "SELECT pid, count(*) AS n FROM ops GROUP BY pid")
    assert sorted(c["n"] for c in counts) == [2, 2, 2]
