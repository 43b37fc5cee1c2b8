"""Damaged and foreign shards never crash a query: a damaged batch ends its shard's readable
part with one warning naming the shard and the rows kept (pprobe/query.py ``_checked``).

The fuzz test damages copies of a real run (random bytes, truncation, foreign files) and
queries them in subprocesses, so that a segfault in pyarrow or DuckDB is a test failure."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, REPO, clean_env, run_script

PROG = """
    import numpy as np
    a = np.ones(4)
    for i in range(1200):
        a = np.add(a, i % 7) * 0.5
"""
SEEDS = 72
PER_PROCESS = 24

#: Queries each damaged run in-process and prints one JSON line per run folder.
DRIVER = """
import json, sys, warnings
from pprobe.query import DamagedShardWarning, run_sql
for d in sys.argv[1:]:
    res = {"dir": d}
    for attempt in ("convert", "cached"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DamagedShardWarning)
            res[attempt] = [
                run_sql("SELECT count(*) FROM ops", d)[1][0][0],
                run_sql("SELECT count(*) FROM tensors", d)[1][0][0],
                run_sql("SELECT count(*) FROM ops JOIN tensors USING (pid, seq)", d)[1][0][0],
            ]
        res[attempt + "_warnings"] = sorted({str(w.message) for w in caught})
    print(json.dumps(res), flush=True)
"""


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: several batches per shard (flushed every 200 rows), statistics."""
    tmp = tmp_path_factory.mktemp("base")
    r = run_script(tmp, PROG, env={"PPROBE_MODE": "stats", "PPROBE_FLUSH_ROWS": "200"}).check()
    d = r.run_dir
    assert len(_shards(d)) == 2
    return d


def _shards(run: Path) -> list[Path]:
    """The ops and tensors shards (the queries below read those views, not ``stacks``)."""
    return sorted(p for p in (run / "log").glob("*.arrows") if not p.name.startswith("stacks-"))


def _damage(src: Path, dst: Path, seed: int) -> str:
    """A copy of the run with one kind of damage picked by ``seed``; says what it did."""
    rng = random.Random(seed)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".cache"))
    shard = rng.choice(_shards(dst))
    data = bytearray(shard.read_bytes())
    kind = ["overwrite", "overwrite", "truncate", "flip", "foreign"][seed % 5]
    if kind == "overwrite":  # 512 random bytes anywhere (the issue: at 60-95%)
        at = rng.randrange(0, len(data) - 512)
        data[at : at + 512] = rng.randbytes(512)
    elif kind == "flip":  # a few bits
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    else:
        foreign = dst / "log" / f"{shard.name.split('-')[0]}-foreign-{seed}.arrows"
        choice = seed // 5 % 4
        if choice == 0:
            foreign.write_bytes(rng.randbytes(rng.randint(0, 4096)))
        elif choice == 1:
            foreign.write_text('{"not": "arrow"}\n' * 50)
        elif choice == 2:  # a valid stream of another schema
            import pyarrow as pa

            t = pa.table({"seq": pa.array(["x", "y"]), "pid": pa.array([1.5, 2.5])})
            with pa.OSFile(str(foreign), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
                w.write_table(t)
        else:  # the other shard's bytes, cut into
            other = sorted((dst / "log").glob("*.arrows"))[0].read_bytes()
            foreign.write_bytes(other[: rng.randrange(len(other))] + rng.randbytes(300))
        return f"foreign {foreign.name} ({choice})"
    shard.write_bytes(bytes(data))
    return f"{kind} {shard.name}"


def test_damaged_and_foreign_shards_never_crash_a_query(base_run: Path, tmp_path: Path) -> None:
    from helpers import sql

    whole = {
        "ops": sql(base_run, "SELECT count(*) AS n FROM ops")[0]["n"],
        "tensors": sql(base_run, "SELECT count(*) AS n FROM tensors")[0]["n"],
    }
    assert whole["ops"] == 2401  # np.ones, then 1200 x (add, multiply)
    what = {}
    for seed in range(SEEDS):
        what[str(tmp_path / f"r{seed}")] = _damage(base_run, tmp_path / f"r{seed}", seed)
    dirs = list(what)
    env = clean_env(PYTHONPATH=str(REPO))
    seen = 0
    for i in range(0, len(dirs), PER_PROCESS):
        batch = dirs[i : i + PER_PROCESS]
        p = subprocess.run(
            [PYTHON, "-c", DRIVER, *batch], env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, (p.returncode, p.stderr[-3000:], p.stdout[-2000:])
        for line in p.stdout.splitlines():
            res = json.loads(line)
            seen += 1
            note = what[res["dir"]]
            # The cache gives what the conversion gave, and says so again.
            assert res["cached"] == res["convert"], note
            assert res["cached_warnings"] == res["convert_warnings"], note
            ops, tensors, joined = res["convert"]
            for msg in res["convert_warnings"]:
                assert res["dir"] in msg and "is damaged at byte" in msg, msg
            if note.startswith("truncate"):
                assert ops <= whole["ops"] and tensors <= whole["tensors"], note
            if note.startswith("foreign"):  # the run's own shards are whole; it adds at most
                assert whole["ops"] <= ops <= 2 * whole["ops"], note  # a copy's rows
                assert whole["tensors"] <= tensors <= 2 * whole["tensors"], note
            lost = ops < whole["ops"] or tensors < whole["tensors"]
            if lost and not note.startswith("truncate"):
                assert res["convert_warnings"], f"rows lost without a warning: {note} {res}"
    assert seen == SEEDS


def test_damage_in_the_first_batch_is_a_warning_not_silent_zero_rows(
    base_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base_run, run, ignore=shutil.ignore_patterns(".cache"))
    shard = next((run / "log").glob("ops-*.arrows"))
    data = bytearray(shard.read_bytes())
    import pyarrow as pa

    with pa.OSFile(str(shard)) as f:
        reader = pa.ipc.MessageReader.open_stream(f)
        reader.read_next_message()  # the schema
        first = f.tell()
        reader.read_next_message()  # the first batch
        second = f.tell()
    mid = (first + second) // 2
    data[mid : mid + 64] = b"\xa5" * 64  # inside the first batch's body
    shard.write_bytes(bytes(data))
    for attempt in range(2):  # converted, then read from the cache: the same line each time
        r = subprocess.run(
            [PYTHON, "-m", "pprobe", "query", "SELECT count(*) AS n FROM ops", "--run", str(run)],
            env=clean_env(PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert r.stderr.splitlines() == [
            f"pprobe query: warning: {shard} is damaged at byte {first} of {len(data)}: "
            "the 0 rows before it are read, the rest of this shard is not"
        ], attempt
        assert r.stdout.split()[2] == "0"
