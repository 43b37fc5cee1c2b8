"""``python -m pprobe query``: table, csv and json output, bad SQL, the latest run by default;
the Parquet cache behind the views (made once, read on as a shard grows, truncated shards,
read-only runs, damaged files), always with the results of the in-memory path."""

from __future__ import annotations

import csv
import io
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from helpers import PYTHON, REPO, run, run_script, sql

PROG = """
    import numpy as np
    a = np.linspace(0.0, 1.0, 5)
    np.add(a, 1.5)
    np.multiply(a, np.array([2.0]))
    np.sum(np.array([1, 2, 3]))
"""
QUERY = (
    "SELECT o.seq, o.op, o.kind, t.role, t.shape, t.dtype, t.max, t.dump_path "
    "FROM ops o JOIN tensors t USING (pid, seq) ORDER BY o.seq, t.role, t.idx"
)


def query(tmp_path: Path, *args: str, cwd: Path | None = None, output: str | None = None):
    """``pprobe query``; without --run it reads $PPROBE_OUTPUT's latest run (``output``), or
    ./np_op_dumps when that is None."""
    return run(
        [PYTHON, "-m", "pprobe", "query", *args],
        tmp_path,
        probe=False,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PPROBE_OUTPUT": output},
    )


def test_table_csv_and_json_parse_back_to_the_query_result(tmp_path: Path) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "stats"}).check()
    run_dir = r.run_dir
    want = sql(run_dir, QUERY)
    assert len(want) == 10  # 6 calls: linspace 1, add 2, array 1, multiply 3, array 1, sum 2

    table = query(tmp_path, QUERY, "--run", str(run_dir)).check()
    lines = table.out.splitlines()
    assert lines[0].split() == list(want[0])
    assert set(lines[1]) <= {"-", " "}
    assert lines[-1] == f"({len(want)} rows)"
    body = lines[2:-1]
    assert len(body) == len(want)
    for line, row in zip(body, want):
        assert line.split()[:3] == [str(row["seq"]), row["op"], row["kind"]]
        assert "NULL" in line  # stats mode: no dump_path

    c = query(tmp_path, QUERY, "--run", str(run_dir), "--format", "csv").check()
    parsed = list(csv.DictReader(io.StringIO(c.out)))
    assert [list(p) for p in parsed[:1]] == [list(want[0])]
    assert len(parsed) == len(want)
    for p, w in zip(parsed, want):
        assert int(p["seq"]) == w["seq"] and p["op"] == w["op"] and p["dtype"] == w["dtype"]
        assert float(p["max"]) == w["max"]
        assert p["shape"] == str(w["shape"])
        assert p["dump_path"] == ""

    j = query(tmp_path, QUERY, "--run", str(run_dir), "--format", "json").check()
    got = json.loads(j.out)
    assert got == [{**w, "shape": w["shape"]} for w in want]


def test_max_rows_limits_the_table_only(tmp_path: Path) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check()
    q = "SELECT seq, op FROM ops ORDER BY seq"
    table = query(tmp_path, q, "--run", str(r.run_dir), "--max-rows", "2").check()
    assert len(table.out.splitlines()) == 2 + 2 + 1
    assert "not shown" in table.out.splitlines()[-1]
    j = query(tmp_path, q, "--run", str(r.run_dir), "--format", "json", "--max-rows", "2")
    assert len(json.loads(j.check().out)) == len(sql(r.run_dir, q))


def test_bad_sql_exits_non_zero_and_lists_views_and_columns(tmp_path: Path) -> None:
    from pprobe import schema

    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check()
    for bad in ("SELECT nope FROM ops", "SELEKT 1", "SELECT * FROM tensor"):
        q = query(tmp_path, bad, "--run", str(r.run_dir))
        assert q.rc != 0 and q.out == ""
        for name, sch in schema.TABLES.items():
            line = next(x for x in q.err.splitlines() if x.strip().startswith(name + "("))
            for col in sch.names:
                assert f"{col} " in line, (name, col)


def test_latest_run_is_the_default(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = work / "np_op_dumps"  # the default output folder, relative to the program's cwd
    first = run_script(tmp_path, PROG, output=out, cwd=work, env={"PPROBE_OUTPUT": None})
    second = run_script(
        tmp_path,
        "import numpy as np\nnp.ones(1)\n",
        name="p2.py",
        output=out,
        cwd=work,
        env={"PPROBE_OUTPUT": None},
    )
    first.check()
    second.check()
    assert len(second.runs) == 2
    q = "SELECT DISTINCT run_id FROM ops"
    for args, cwd, output in [
        ((), work, None),  # ./np_op_dumps
        ((), tmp_path, str(out)),  # $PPROBE_OUTPUT
        (("--run", str(out)), tmp_path, None),
    ]:
        j = query(tmp_path, q, *args, "--format", "json", cwd=cwd, output=output).check()
        assert json.loads(j.out) == [{"run_id": second.run_dir.name}]
    first_run = [p for p in second.runs if p != second.run_dir][0]
    j = query(tmp_path, q, "--run", str(first_run), "--format", "json").check()
    assert json.loads(j.out) == [{"run_id": first_run.name}]


def test_no_run_found_is_one_clear_error(tmp_path: Path) -> None:
    q = query(tmp_path, "SELECT 1", "--run", str(tmp_path / "nothing"))
    assert q.rc != 0 and "no pprobe run" in q.err and q.out == ""


# ---------------------------------------------------------------------------------------------
# The Parquet cache (pprobe/query.py): shards written here with pyarrow, queried in-process.
GROUP_BY = "SELECT op, count(*) AS n, sum(dur_ns) AS t FROM ops GROUP BY op ORDER BY op"
ALL_OPS = "SELECT * FROM ops ORDER BY pid, seq"
ALL_TENSORS = "SELECT * FROM tensors ORDER BY pid, seq, role, idx"


class Shard:
    """An ops (or tensors) stream shard written batch by batch, like pprobe's writer does."""

    def __init__(self, run_dir: Path, pid: int, table: str = "ops", sch: Any = None) -> None:
        import pyarrow as pa

        from pprobe import schema

        self.table = table
        self.pid = pid
        self.sch = sch if sch is not None else schema.TABLES[table]
        meta = {"pprobe.schema_version": "1", "run_id": run_dir.name, "pid": str(pid)}
        self.sch = self.sch.with_metadata(meta)
        self.path = run_dir / "log" / f"{table}-host-{pid}.arrows"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = pa.OSFile(str(self.path), "wb")
        self.w = pa.ipc.new_stream(
            self.f, self.sch, options=pa.ipc.IpcWriteOptions(compression="lz4")
        )
        self.seq = 0

    def batch(self, n: int = 100) -> None:
        import pyarrow as pa

        seqs = range(self.seq, self.seq + n)
        self.seq += n
        values = {
            "run_id": ["r"] * n,
            "host": ["host"] * n,
            "pid": [self.pid] * n,
            "seq": list(seqs),
            "ts_ns": [1_000 * s for s in seqs],
            "dur_ns": [s % 7 for s in seqs],
            "op": [f"numpy.op{s % 5}" for s in seqs],
            "kind": ["ufunc"] * n,
            "caller": [f"prog.py:{s % 11}" for s in seqs],
            "step": [s // 50 for s in seqs],
            "args": [None if s % 3 else f"axis={s % 2}" for s in seqs],
            "role": ["input" if s % 2 else "output" for s in seqs],
            "idx": ["0"] * n,
            "shape": [[s % 4, 3] for s in seqs],
            "dtype": ["float32"] * n,
            "min": [float(s) for s in seqs],
        }
        cols = [
            pa.array(values[f.name], f.type) if f.name in values else pa.nulls(n, f.type)
            for f in self.sch
        ]
        self.w.write_batch(pa.RecordBatch.from_arrays(cols, schema=self.sch))
        self.f.flush()

    def close(self) -> None:
        self.w.close()
        self.f.close()


def make_run(tmp_path: Path, shards: int = 2, batches: int = 3, name: str = "run") -> Path:
    run_dir = tmp_path / name
    for pid in range(1, shards + 1):
        for table in ("ops", "tensors"):
            s = Shard(run_dir, pid, table)
            for _ in range(batches):
                s.batch()
            s.close()
    return run_dir


def in_memory(run_dir: Path, q: str) -> list[tuple]:
    from pprobe import query

    con = query.connect(str(run_dir), cache=False)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


def cached(run_dir: Path, q: str) -> list[tuple]:
    from pprobe import query

    return query.run_sql(q, str(run_dir))[1]


def cache_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*.parquet")) if d.is_dir() else []


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The conversion jobs run (each writes one cache file)."""
    from pprobe import query

    ran: list[Any] = []
    real = query._run_job

    def spy(job: Any) -> Any:
        ran.append(job)
        return real(job)

    monkeypatch.setattr(query, "_run_job", spy)
    return ran


@pytest.fixture
def tmpdir_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile.gettempdir() inside tmp_path, so that the fallback cache folder is the test's."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def test_cache_is_made_once_then_reused(tmp_path: Path, jobs: list[Any], tmpdir_here: Path):
    run_dir = make_run(tmp_path)
    cache = run_dir / "log" / ".cache"
    want = in_memory(run_dir, GROUP_BY)
    assert cached(run_dir, GROUP_BY) == want
    # Only the view the SQL names is converted: one file per ops shard.
    assert len(jobs) == 2 and all("ops-" in n for n in cache_files(cache))
    files = {p: p.stat().st_mtime_ns for p in cache.glob("*.parquet")}
    jobs.clear()
    assert cached(run_dir, GROUP_BY) == want
    assert jobs == []  # unchanged shards: nothing converted, the same files
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.parquet")} == files
    assert cached(run_dir, ALL_TENSORS) == in_memory(run_dir, ALL_TENSORS)
    assert len(jobs) == 2 and len(cache_files(cache)) == 4
    assert not list(tmpdir_here.iterdir())  # the run folder was writable


def test_results_and_column_types_match_the_in_memory_path(tmp_path: Path) -> None:
    from pprobe import query

    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "stats"}).check()
    for q in (ALL_OPS, ALL_TENSORS, QUERY, GROUP_BY):
        assert cached(r.run_dir, q) == in_memory(r.run_dir, q), q
    con = query.connect(str(r.run_dir), cache=False)
    want = {v: con.execute(f"DESCRIBE {v}").fetchall() for v in query.VIEWS}
    con.close()
    for tables in (None, set()):  # filled views, and views named by no query (no rows)
        con = query.connect(str(r.run_dir), tables=tables)
        assert {v: con.execute(f"DESCRIBE {v}").fetchall() for v in query.VIEWS} == want
        con.close()


def test_views_named_in_schema_py() -> None:
    from pprobe import query, schema

    assert query.VIEWS == tuple(schema.TABLES)


def test_a_growing_shard_is_converted_from_where_the_cache_ends(
    tmp_path: Path, jobs: list[Any]
) -> None:
    run_dir = tmp_path / "run"
    live = Shard(run_dir, 7)
    for _ in range(3):
        live.batch()
    cache = run_dir / "log" / ".cache"
    assert cached(run_dir, "SELECT count(*) FROM ops") == [(300,)]
    first = cache_files(cache)
    assert len(first) == 1
    size = live.path.stat().st_size
    jobs.clear()

    live.batch(50)
    live.batch(50)
    assert cached(run_dir, ALL_OPS) == in_memory(run_dir, ALL_OPS)
    assert len(cached(run_dir, ALL_OPS)) == 400
    # Only the new bytes were read, into a second file; the first one is kept.
    assert [(j.start, j.end) for j in jobs] == [(first_end(first[0]), size_now(live))]
    assert jobs[0].start == size and set(first) < set(cache_files(cache))

    # A batch still being written (here: half of one) adds nothing; the rest comes later.
    whole = live.path.read_bytes()
    live.batch(30)
    full = live.path.read_bytes()
    with open(live.path, "wb") as f:
        f.write(full[: len(whole) + (len(full) - len(whole)) // 2])
    jobs.clear()
    assert len(cached(run_dir, ALL_OPS)) == 400 and jobs == []
    with open(live.path, "wb") as f:
        f.write(full)
    assert len(cached(run_dir, ALL_OPS)) == 430

    # The end-of-stream marker: no new rows, no conversion, the newest file renamed only.
    live.close()
    jobs.clear()
    assert len(cached(run_dir, ALL_OPS)) == 430 and jobs == []
    jobs.clear()
    assert len(cached(run_dir, ALL_OPS)) == 430 and jobs == []


class DictShard:
    """An ops shard written as pprobe's own writer writes it (pprobe.arrowipc.StreamWriter):
    the name columns dictionary-encoded, each batch after a delta of its new strings."""

    def __init__(self, run_dir: Path, pid: int) -> None:
        import os

        from pprobe import arrowipc as A
        from pprobe import logschema

        self.path = run_dir / "log" / f"ops-host-{pid}.arrows"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        meta = {"pprobe.schema_version": logschema.SCHEMA_VERSION, "run_id": run_dir.name,
                "pid": str(pid), "host": "host"}  # fmt: skip
        self.w = A.StreamWriter(fd, logschema.OPS, meta)
        self.pid, self.seq = pid, 0
        self.strings = [b""]  # the dictionary: entry 0 for null rows

    def sid(self, s: str) -> int:
        b = s.encode()
        if b not in self.strings:
            self.strings.append(b)
        return self.strings.index(b) - 1

    def batch(self, n: int = 100) -> None:
        from pprobe import arrowipc as A
        from pprobe import logschema

        seqs = np.arange(self.seq, self.seq + n)
        self.seq += n
        # call sites new in every batch (a delta), ops from a few, a column of nulls
        caller = np.array([self.sid(f"prog.py:{s // 10}") for s in seqs])
        op = np.array([self.sid(f"numpy.op{s % 5}") for s in seqs])
        cols = []
        for name, tp in logschema.OPS:
            if name == "seq":
                cols.append(A.ints(np, seqs, A.INT64))
            elif name == "pid":
                cols.append(A.const_ints(np, self.pid, A.INT64, n))
            elif name == "caller":
                cols.append(A.dict_indices(np, caller))
            elif name in ("op", "caller_function"):
                cols.append(A.dict_indices(np, op))
            elif name == "kind":
                cols.append(A.dict_indices(np, np.full(n, self.sid("ufunc"))))
            else:
                cols.append(A.nulls(np, tp, n))
        self.w.write_batch(A.Batch(logschema.OPS, n, cols, list(self.strings)))

    def close(self) -> None:
        self.w.close()


def test_a_growing_dictionary_encoded_shard_is_converted_from_where_the_cache_ends(
    tmp_path: Path, jobs: list[Any]
) -> None:
    """pprobe's writer's shards (dictionary deltas before the batches) read from the middle:
    the dictionaries before the new bytes are found, the batches there are not read again."""
    q = "SELECT seq, op, kind, caller, caller_function FROM ops ORDER BY seq"
    run_dir = tmp_path / "run"
    live = DictShard(run_dir, 7)
    for _ in range(3):
        live.batch()
    got = cached(run_dir, q)
    assert len(got) == 300 and got[0] == (0, "numpy.op0", "ufunc", "prog.py:0", "numpy.op0")
    assert got == in_memory(run_dir, q)
    size = live.path.stat().st_size
    jobs.clear()
    live.batch(50)
    live.batch(50)
    got = cached(run_dir, q)
    assert got == in_memory(run_dir, q) and len(got) == 400
    assert got[-1] == (399, "numpy.op4", "ufunc", "prog.py:39", "numpy.op4")
    assert [j.start for j in jobs] == [size]  # only the new bytes
    # a delta written but its batch cut short: nothing new yet, and no damage
    whole = live.path.read_bytes()
    live.batch(30)
    full = live.path.read_bytes()
    from pprobe import query

    src = pa.BufferReader(full[len(whole) :])
    assert pa.ipc.MessageReader.open_stream(src).read_next_message().type == "dictionary"
    # cut inside the delta, right after it, and in the middle of its batch
    for cut in (len(whole) + 20, len(whole) + src.tell(), len(whole) + src.tell() + 20):
        with open(live.path, "wb") as f:
            f.write(full[:cut])
        with warnings.catch_warnings():
            warnings.simplefilter("error", query.DamagedShardWarning)
            assert len(cached(run_dir, q)) == 400
            got, _ = query.read_shard(str(live.path))
        assert sum(b.num_rows for b in got) == 400
    with open(live.path, "wb") as f:
        f.write(full)
    live.close()
    assert cached(run_dir, q) == in_memory(run_dir, q)
    assert len(cached(run_dir, q)) == 430


def test_a_batch_whose_indices_run_past_its_dictionary_is_damage(tmp_path: Path) -> None:
    """Indices past the dictionary the stream has (a damaged shard): the batches before it
    are read, that one and the rest are not, and the damage is reported."""
    from pprobe import arrowipc as A
    from pprobe import logschema, query

    run_dir = tmp_path / "run"
    live = DictShard(run_dir, 3)
    live.batch(20)
    cols = [A.dict_indices(np, np.full(5, 1000)) if tp == A.DICT_UTF8 else A.nulls(np, tp, 5)
            for _, tp in logschema.OPS]  # fmt: skip
    live.w.write_batch(A.Batch(logschema.OPS, 5, cols, list(live.strings)))
    live.batch(20)
    live.close()
    with pytest.warns(query.DamagedShardWarning, match="20 rows before it"):
        got, early = query.read_shard(str(live.path))
    assert early and sum(b.num_rows for b in got) == 20
    with pytest.warns(query.DamagedShardWarning):
        assert cached(run_dir, "SELECT count(*) FROM ops") == [(20,)]


def first_end(name: str) -> int:
    return int(name.split(".")[3].split("-")[1])


def size_now(s: Shard) -> int:
    return s.path.stat().st_size


def test_many_increments_are_merged(tmp_path: Path, jobs: list[Any]) -> None:
    from pprobe import query

    run_dir = tmp_path / "run"
    live = Shard(run_dir, 3)
    cache = run_dir / "log" / ".cache"
    for i in range(3 * query.MAX_SMALL_PARTS):
        live.batch(10)
        assert cached(run_dir, GROUP_BY) == in_memory(run_dir, GROUP_BY)
        assert len(cache_files(cache)) <= query.MAX_SMALL_PARTS, i
    assert any(j.merge for j in jobs)
    assert cached(run_dir, "SELECT count(*) FROM ops") == [(10 * 3 * query.MAX_SMALL_PARTS,)]


def test_a_rewritten_shard_is_converted_again(tmp_path: Path, jobs: list[Any]) -> None:
    run_dir = make_run(tmp_path, shards=1, batches=2)
    assert len(cached(run_dir, ALL_OPS)) == 200
    # The same pid's shard written anew (another process), longer: its head differs.
    s = Shard(run_dir, 1)
    s.seq = 1000
    for _ in range(3):
        s.batch()
    s.close()
    jobs.clear()
    got = cached(run_dir, ALL_OPS)
    assert got == in_memory(run_dir, ALL_OPS) and [r[5] for r in got][:1] == [1000]
    assert len(got) == 300 and [j.start for j in jobs] == [jobs[0].start]
    assert len(cache_files(run_dir / "log" / ".cache")) == 1  # the old file was deleted


def test_large_shards_are_cut_into_segments_converted_in_parallel(
    tmp_path: Path, jobs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pprobe import query

    monkeypatch.setattr(query, "SEGMENT_BYTES", 4096)
    run_dir = make_run(tmp_path, shards=2, batches=12)
    assert cached(run_dir, ALL_OPS) == in_memory(run_dir, ALL_OPS)
    cache = run_dir / "log" / ".cache"
    assert len(jobs) > 4 and len(cache_files(cache)) == len(jobs)
    # A conversion killed before its last file: the files it left are used, the rest redone.
    last = max(cache.glob("ops-host-1.*.parquet"), key=lambda p: first_end(p.name))
    last.unlink()
    jobs.clear()
    assert cached(run_dir, ALL_OPS) == in_memory(run_dir, ALL_OPS)
    assert len(jobs) == 1 and jobs[0].start == int(last.name.split(".")[3].split("-")[0])


def test_a_truncated_shard_is_read_up_to_its_last_complete_batch(tmp_path: Path) -> None:
    from pprobe.query import read_shard

    run_dir = make_run(tmp_path, shards=2, batches=5)
    for table in ("ops", "tensors"):
        p = run_dir / "log" / f"{table}-host-2.arrows"
        data = p.read_bytes()
        p.write_bytes(data[: len(data) - 300])  # into the last batch (and no EOS marker)
        batches, truncated = read_shard(str(p))
        assert truncated and sum(b.num_rows for b in batches) == 400
    # A shard whose writer was killed before its schema was whole: no rows.
    (run_dir / "log" / "ops-host-3.arrows").write_bytes(b"\xff\xff\xff\xff\x10")
    for q in (ALL_OPS, ALL_TENSORS, QUERY):
        assert cached(run_dir, q) == in_memory(run_dir, q), q
    assert len(cached(run_dir, ALL_OPS)) == 900


def test_older_schema_shards_are_conformed(tmp_path: Path) -> None:
    import pyarrow as pa

    from pprobe import schema

    run_dir = make_run(tmp_path, shards=1)
    old = pa.schema([f for f in schema.OPS if f.name not in ("module_path", "phase")])
    old = old.set(old.get_field_index("depth"), pa.field("depth", pa.int64()))
    s = Shard(run_dir, 2, sch=old)
    s.batch()
    s.close()
    got = cached(run_dir, ALL_OPS)
    assert got == in_memory(run_dir, ALL_OPS) and len(got) == 400


def test_a_read_only_run_folder_caches_in_a_temporary_folder(
    tmp_path: Path, jobs: list[Any], tmpdir_here: Path
) -> None:
    from pprobe import query

    run_dir = make_run(tmp_path)
    log = run_dir / "log"
    (log / ".cache").write_text("")  # a file in the way (root ignores permission bits)
    for p in (log, run_dir):
        p.chmod(0o555)
    try:
        assert cached(run_dir, QUERY) == in_memory(run_dir, QUERY)
        tmp_cache = Path(query.cache_dirs(str(run_dir))[1])
        assert tmp_cache.parent.parent == tmpdir_here
        assert len(cache_files(tmp_cache)) == 4 and (tmp_cache.parent.stat().st_mode & 0o077) == 0
        jobs.clear()
        assert cached(run_dir, QUERY) == in_memory(run_dir, QUERY)
        assert jobs == []
    finally:
        for p in (log, run_dir):
            p.chmod(0o755)


def test_no_writable_folder_reads_shards_into_memory(
    tmp_path: Path, jobs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "log" / ".cache").write_text("")
    (tmp_path / "blocked").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "blocked"))
    assert cached(run_dir, QUERY) == in_memory(run_dir, QUERY)
    assert jobs == []


def test_a_run_path_with_glob_characters(tmp_path: Path, tmpdir_here: Path) -> None:
    from pprobe import query

    make_run(tmp_path, name="run1")  # what DuckDB's glob "run[12]" would also match
    run_dir = make_run(tmp_path, shards=1, name="run[12]")
    assert cached(run_dir, ALL_OPS) == in_memory(run_dir, ALL_OPS)
    assert len(cached(run_dir, ALL_OPS)) == 300
    assert query.cache_dirs(str(run_dir))[0].startswith(str(tmpdir_here))


def test_a_table_without_shards_is_an_empty_view_with_its_columns(tmp_path: Path) -> None:
    from pprobe import schema

    run_dir = tmp_path / "run"
    s = Shard(run_dir, 1)
    s.batch()
    s.close()
    assert cached(run_dir, "SELECT count(*) FROM tensors") == [(0,)]
    cols, rows = run_sql_cols(run_dir, "SELECT * FROM tensors")
    assert cols == schema.TENSORS.names and rows == []
    assert cached(run_dir, QUERY) == []


def run_sql_cols(run_dir: Path, q: str) -> tuple[list[str], list[tuple]]:
    from pprobe import query

    return query.run_sql(q, str(run_dir))


def test_a_damaged_cache_file_is_converted_again(tmp_path: Path, jobs: list[Any]) -> None:
    from pprobe.query import QueryError

    run_dir = make_run(tmp_path)
    cache = run_dir / "log" / ".cache"
    want = in_memory(run_dir, GROUP_BY)
    assert cached(run_dir, GROUP_BY) == want
    assert cached(run_dir, ALL_TENSORS) == in_memory(run_dir, ALL_TENSORS)
    for table, q in (("ops", GROUP_BY), ("tensors", ALL_TENSORS), ("tensors", GROUP_BY)):
        # A damaged file of the view the query reads, or of the view whose columns a view the
        # query does not read takes (tensors, for a GROUP BY over ops).
        victim = sorted(cache.glob(f"{table}-*.parquet"))[0]
        victim.write_bytes(b"not parquet")
        jobs.clear()
        assert cached(run_dir, q) == in_memory(run_dir, q)
        if q != GROUP_BY or table == "ops":
            assert len(jobs) == 1  # that shard only, converted again
        assert cached(run_dir, ALL_TENSORS) == in_memory(run_dir, ALL_TENSORS)
        assert b"not parquet" not in {p.read_bytes() for p in cache.glob("*.parquet")}
    # Bad SQL is still a QueryError listing the views, not a reason to convert again.
    jobs.clear()
    with pytest.raises(QueryError, match=r"ops\(run_id VARCHAR"):
        cached(run_dir, "SELECT nope FROM ops")
    with pytest.raises(QueryError, match="No files found"):
        cached(run_dir, f"SELECT * FROM read_parquet('{cache}/nothing.parquet')")
    assert jobs == []


def test_a_listing_without_the_shards_first_parts_is_not_taken_as_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query that lists the cache while another replaces the shard's first parts (merging
    small ones) may see only the newest part, named after the shard's current size and
    mtime. That part alone is not the shard: the query converts again and sees every row
    (it saw only the newest part's 40 rows, 1 run in 20, in the concurrent test below)."""
    from pprobe import query

    monkeypatch.setattr(query, "SEGMENT_BYTES", 1)  # a part per batch
    run_dir = tmp_path / "run"
    live = Shard(run_dir, 5)
    for _ in range(3):
        live.batch(40)
    cache = run_dir / "log" / ".cache"
    assert cached(run_dir, "SELECT count(*) FROM ops") == [(120,)]
    parts = sorted(cache.glob("*.parquet"), key=lambda p: int(p.name.split(".")[3].split("-")[0]))
    assert len(parts) == 3
    for p in parts[:2]:  # what such a listing shows: the newest part only
        p.unlink()
    got = [r[0] for r in cached(run_dir, "SELECT seq FROM ops ORDER BY seq")]
    assert got == list(range(120))


def test_concurrent_queries_of_a_live_run_see_whole_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries racing each other and the writer: each sees a prefix of whole batches."""
    import threading

    from pprobe import query

    monkeypatch.setattr(query, "SEGMENT_BYTES", 8192)
    run_dir = tmp_path / "run"
    live = Shard(run_dir, 5)
    live.batch(40)
    seen: list[list[int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.append([r[0] for r in cached(run_dir, "SELECT seq FROM ops ORDER BY seq")])
        except BaseException as e:  # reported below
            errors.append(e)
            raise

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(40):
        live.batch(40)
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(s == list(range(len(s))) and len(s) % 40 == 0 for s in seen)
    assert len({len(s) for s in seen}) > 2  # the queries did overlap the writing
    live.close()
    assert len(cached(run_dir, ALL_OPS)) == 41 * 40
    assert cached(run_dir, ALL_OPS) == in_memory(run_dir, ALL_OPS)


def test_the_cache_is_private_even_for_a_run_path_with_glob_characters(
    tmp_path: Path, tmpdir_here: Path
) -> None:
    """The issue's case: PPROBE_OUTPUT='out[1]' puts the cache in the temporary folder."""
    import os
    import stat

    from pprobe import query

    def modes(d: Path) -> set[int]:
        return {stat.S_IMODE(os.lstat(p).st_mode) for p in d.iterdir()}

    glob_run = make_run(tmp_path, shards=1, name="out[1]")
    plain_run = make_run(tmp_path, shards=1, name="plain")
    old = os.umask(0o022)
    try:
        for run_dir in (glob_run, plain_run):
            assert len(cached(run_dir, QUERY)) == 300
    finally:
        os.umask(old)
    tmp_cache = Path(query.cache_dirs(str(glob_run))[0])
    assert tmp_cache.parent.parent == tmpdir_here
    for d in (tmp_cache.parent, tmp_cache, plain_run / "log" / ".cache"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for d in (tmp_cache, plain_run / "log" / ".cache"):
        assert len(cache_files(d)) == 2 and modes(d) == {0o600}, d
