"""``python -m pprobe query``: table, csv and json output, bad SQL, the latest run by default."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

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


def query(tmp_path: Path, *args: str, cwd: Path | None = None):
    return run(
        [PYTHON, "-m", "pprobe", "query", *args],
        tmp_path,
        probe=False,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO)},
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
    for args, cwd in [((), work), (("--run", str(out)), tmp_path)]:
        j = query(tmp_path, q, *args, "--format", "json", cwd=cwd).check()
        assert json.loads(j.out) == [{"run_id": second.run_dir.name}]
    first_run = [p for p in second.runs if p != second.run_dir][0]
    j = query(tmp_path, q, "--run", str(first_run), "--format", "json").check()
    assert json.loads(j.out) == [{"run_id": first_run.name}]


def test_no_run_found_is_one_clear_error(tmp_path: Path) -> None:
    q = query(tmp_path, "SELECT 1", "--run", str(tmp_path / "nothing"))
    assert q.rc != 0 and "no pprobe run" in q.err and q.out == ""
