"""The "see a run" commands on runs made by the bootstrap: ``pprobe ls``, ``summary``, ``show``,
``pprobe.show`` and ``pprobe.load``. Expected texts are computed from the run (its shards read
with pyarrow, its meta.json), never typed in."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PYTHON, REPO, Result, meta, npy_files, run, run_script, sql

import pprobe
from pprobe import callview, packs, textout

PROG = """
    import numpy as np
    import pprobe
    x = np.arange(12.0).reshape(3, 4)
    for i in range(3):
        pprobe.step()
        y = np.exp(x) + 1
        z = y.sum(axis=0)
        w = np.log(z - z)          # -inf: the first non-finite output
    v = np.sqrt(np.array([-1.0, 4.0]))   # NaN
    print("done")
"""


def cli(tmp_path: Path, *args: str, output: Path | None = None, cwd: Path | None = None) -> Result:
    """``python -m pprobe ...`` with its output piped (plain text)."""
    return run(
        [PYTHON, "-m", "pprobe", *args],
        tmp_path,
        probe=False,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PPROBE_OUTPUT": str(output) if output else None},
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Result:
    tmp = tmp_path_factory.mktemp("see")
    return run_script(tmp, PROG).check()


def _tables(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row of both views, read from the shards with pyarrow (not DuckDB)."""
    from pprobe.query import load_tables

    return {k: v.to_pylist() for k, v in load_tables(str(run_dir)).items()}


# ------------------------------------------------------------------------------------ ls
def test_ls_lists_runs_with_their_facts_and_a_killed_run_says_it_died(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_script(tmp_path, PROG).check()
    run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check()
    killed = run_script(
        tmp_path,
        """
        import os, signal, time
        import numpy as np
        for i in range(50):
            np.add(np.ones(3), i)
        time.sleep(0.5)                  # the writer flushes (PPROBE_FLUSH_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        name="killed.py",
        env={"PPROBE_FLUSH_SECONDS": "0.05"},
    )
    assert killed.rc == -signal.SIGKILL
    runs = killed.runs
    assert len(runs) == 3

    r = cli(tmp_path, "ls", str(out), "--format", "json").check()
    data = json.loads(r.out)
    assert data["output"] == str(out)
    got = {x["id"]: x for x in data["runs"]}
    assert [x["id"] for x in data["runs"]] == [p.name for p in runs]  # oldest first
    for p in runs:
        m = meta(p)
        x = got[p.name]
        n_ops = sql(p, "SELECT count(*) AS n FROM ops")[0]["n"]
        assert x["op_rows"] == n_ops > 0
        assert x["argv"] == m["argv"]
        assert x["start"] == m["start"]
        assert x["processes"] == 1 and x["ranks"] == []
        assert x["coverage"] == m["coverage"]["coverage"]
        assert x["latest"] == (p == killed.run_dir)
        files = npy_files(p)  # dump files and pack entries (PPROBE_DUMP_PACK)
        if m["config"]["mode"] == "dump":
            assert x["dumps"]["files"] + x["dumps"]["links"] == len(files) > 0
            plain = [p / f for f in files if (p / f).is_file()]
            written = sum(f.stat().st_size for f in plain if f.stat().st_nlink == 1)
            written += packs.stats(str(p))["bytes"]  # the packed dumps' bytes
            assert x["dumps"]["bytes"] >= written > 0
            assert x["dumps"]["budget_left"] == m["config"]["budget"] - x["dumps"]["bytes"]
        else:
            assert files == [] and x["dumps"]["enabled"] is False
    ok, log, dead = (got[p.name] for p in runs)
    assert ok["exit"] == log["exit"] == "ok" and ok["state"] == "ended"
    assert dead["state"] == "died" and dead["exit"].startswith("died")
    assert meta(runs[2])["exit"]["status"] == "running"  # what meta.json alone says

    text = cli(tmp_path, "ls", str(out)).check().out
    lines = text.splitlines()
    assert lines[0] == f"Runs in {out}:"
    assert lines[1].split()[:2] == ["run", "start"]
    for line, p in zip(lines[2:5], runs):
        assert line.split()[0] == p.name
        assert str(got[p.name]["op_rows"]) in line.split()
    assert "died" in lines[4] and lines[4].split()[1] == "*"
    assert lines[-1] == "* the latest run"

    s = json.loads(cli(tmp_path, "summary", str(runs[2]), "--format", "json").check().out)
    assert s["run"]["exit"] == dead["exit"] and s["ops"]["rows"] == dead["op_rows"]
    assert s["dumps"]["files"] == dead["dumps"]["files"] > 0  # counted on disk
    assert s["not_captured"][-1] == "rows after the last flush: the process died without finishing"

    # PPROBE_OUTPUT is the default output folder
    assert json.loads(cli(tmp_path, "ls", "--format", "json", output=out).check().out) == data


def test_ls_bad_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = cli(tmp_path, "ls", str(tmp_path / "nowhere"))
    assert r.rc == 2 and r.out == ""
    assert r.err.strip().splitlines() == [f"pprobe ls: no output folder at {tmp_path / 'nowhere'}"]


# ------------------------------------------------------------------------------- summary
def expected_summary(run_dir: Path, top: int = 10) -> str:
    """The plain text of ``pprobe summary``, computed from the shards and meta.json."""
    t = _tables(run_dir)
    m = meta(run_dir)
    ops, tens = t["ops"], t["tensors"]
    calls: Counter[str] = Counter(o["op"] for o in ops)
    dur: defaultdict[str, int] = defaultdict(int)
    for o in ops:
        dur[o["op"]] += o["dur_ns"]
    by_calls = sorted(calls, key=lambda k: (-calls[k], k))[:top]
    by_time = sorted(calls, key=lambda k: (-dur[k], k))[:top]
    steps = sorted({o["step"] for o in ops})
    fs = textout.fmt_seconds
    fb = textout.fmt_bytes
    d = m["dumps"]
    pct = 100.0 * d["bytes_written"] / d["budget"]
    lines = [
        f"Run {run_dir.name}",
        f"  folder     {run_dir}",
        f"  argv       {' '.join(m['argv'])}",
        "  exit       ok",
        f"  duration   {fs(m['end'] - m['start'])}",
        f"  mode       {m['config']['mode']}",
        "  processes  1 (ranks -)",
        f"  op rows    {len(ops)} ({fs(sum(dur.values()) / 1e9)} in ops)",
        f"  steps      {len(steps)} ({steps[0]}..{steps[-1]})",
        f"  dumps      {d['files']} files ({d['links']} links), {fb(d['bytes_written'])} of "
        f"{fb(d['budget'])} budget ({pct:.1f} %), {fb(d['budget'] - d['bytes_written'])} left",
        "  errors     none",
    ]
    bad = [x for x in tens if x["role"] == "output" and (x["nan_count"] or x["inf_count"])]
    when = {(o["pid"], o["seq"]): o for o in ops}
    first = min(bad, key=lambda x: (when[x["pid"], x["seq"]]["ts_ns"], x["seq"], x["idx"]))
    fo = when[first["pid"], first["seq"]]
    lines += [
        f"NaN/inf: {len(bad)} outputs of {len({(x['pid'], x['seq']) for x in bad})} calls "
        f"({sum(x['nan_count'] for x in bad)} NaN, {sum(x['inf_count'] for x in bad)} inf values)",
        f"  first   {fo['op']} seq {fo['seq']} (show {fo['pid']}-{fo['seq']}) step {fo['step']}",
        f"  caller  {fo['caller']}",
        f"  output  {first['idx']}: {first['nan_count']} NaN, {first['inf_count']} inf, "
        f"dump {first['dump_path']}",
    ]
    for title, order in (("Top ops by calls", by_calls), ("Top ops by time", by_time)):
        rows = [(k, str(calls[k]), fs(dur[k] / 1e9)) for k in order]
        w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("op", "calls", "time"))]
        lines.append(f"{title}:")
        lines.append(f"  {'op'.ljust(w[0])}  {'calls'.rjust(w[1])}  {'time'.rjust(w[2])}")
        lines += [f"  {a.ljust(w[0])}  {b.rjust(w[1])}  {c.rjust(w[2])}" for a, b, c in rows]
    lines += [
        "Top modules by time:",
        "  (no module paths: torch nn.Module calls only)",
        "Not captured:",
        "  - torch: not imported by the program (or its probe failed to install)",
        "  - calls made inside recorded calls: PPROBE_NESTED=0",
    ]
    return "\n".join(lines) + "\n"


def test_summary_text_is_the_gold_text_computed_from_the_run(made: Result, tmp_path: Path) -> None:
    r = cli(tmp_path, "summary", str(made.run_dir)).check()
    assert r.out == expected_summary(made.run_dir)
    # the output folder means its latest run; --top cuts the lists
    r3 = cli(tmp_path, "summary", str(made.output), "--top", "3").check()
    assert r3.out == expected_summary(made.run_dir, top=3)


def test_summary_json_shape(made: Result, tmp_path: Path) -> None:
    s = json.loads(cli(tmp_path, "summary", str(made.run_dir), "--format", "json").check().out)
    assert set(s) == {
        "run",
        "ops",
        "top_ops_by_calls",
        "top_ops_by_time",
        "top_modules",
        "steps",
        "nan_inf",
        "dumps",
        "errors",
        "not_captured",
    }
    t = _tables(made.run_dir)
    assert s["ops"]["rows"] == len(t["ops"])
    assert s["steps"] == {"count": 4, "first": 0, "last": 3}
    assert {x["op"]: x["calls"] for x in s["top_ops_by_calls"]} == dict(
        Counter(o["op"] for o in t["ops"])
    )
    first = s["nan_inf"]["first"]
    assert first["op"] == "numpy.log" and first["inf_count"] == 4 and first["step"] == 1
    assert s["nan_inf"]["nan"] == 1  # sqrt(-1)
    assert s["errors"] == [] and s["top_modules"] == []
    assert s["dumps"]["bytes"] == meta(made.run_dir)["dumps"]["bytes_written"]


def test_summary_of_a_filtered_log_mode_run_says_what_was_not_captured(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        PROG,
        env={"PPROBE_MODE": "log", "PPROBE_EXCLUDE": "numpy.exp", "PPROBE_COVERAGE": "namespace"},
    ).check()
    s = cli(tmp_path, "summary", str(r.run_dir)).check().out
    assert "NaN/inf: none in outputs (not measured in log mode)" in s
    assert "  - array statistics and dumps: mode log (PPROBE_MODE=stats or dump)" in s
    assert "  - calls outside the filters: exclude=numpy.exp" in s
    assert "  - NumPy operators (a + b) and ndarray methods: coverage namespace (np.* only)" in s
    assert "  dumps      none (mode log)" in s
    assert "numpy.exp" not in s.split("Not captured:")[0]


def test_summary_bad_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = cli(tmp_path, "summary", str(tmp_path / "nope"))
    assert r.rc == 2 and r.out == ""
    assert len(r.err.strip().splitlines()) == 1
    assert r.err.startswith("pprobe summary: no pprobe run found at")


# ---------------------------------------------------------------------------------- show
def _call(run_dir: Path, op: str) -> dict[str, Any]:
    return sql(run_dir, f"SELECT * FROM ops WHERE op = '{op}' ORDER BY seq LIMIT 1")[0]


def test_show_prints_row_source_and_each_array(made: Result, tmp_path: Path) -> None:
    row = _call(made.run_dir, "numpy.exp")
    pid, seq = row["pid"], row["seq"]
    arrays = sql(made.run_dir, f"SELECT * FROM tensors WHERE pid = {pid} AND seq = {seq}")
    inp = next(a for a in arrays if a["role"] == "input")
    out = next(a for a in arrays if a["role"] == "output")
    x = np.arange(12.0).reshape(3, 4)
    for key in (str(seq), f"{pid}-{seq}", out["dump_path"]):
        text = cli(tmp_path, "show", key, "--run", str(made.run_dir)).check().out
        lines = text.splitlines()
        assert lines[0] == f"numpy.exp  seq {seq}  pid {pid}  (prefix {pid}-{seq})"
        assert f"  caller    {row['caller']} in <module>" in lines
        assert "  source    y = np.exp(x) + 1" in lines
        assert f"  step      {row['step']}" in lines
        want_in = (
            f"input 0: float64[3, 4]  cpu  min 0 max 11 mean 5.5 std {x.std():.6g}  finite  "
            "[0, 1, 2, 3, 4, 5, ...]"
        )
        e = np.exp(x)
        few = ", ".join(f"{v:.4g}" for v in e.ravel()[:6])
        want_out = (
            f"output 0: float64[3, 4]  cpu  min 1 max {e.max():.6g} mean {e.mean():.6g} "
            f"std {e.std():.6g}  finite  [{few}, ...]"
        )
        assert want_in in lines and want_out in lines
        assert lines.index(want_in) < lines.index(want_out)
        assert f"  dump  {made.run_dir / inp['dump_path']}" in lines

    values = cli(tmp_path, "show", str(seq), "--run", str(made.run_dir), "--values").check().out
    assert np.array2string(x, separator=", ").splitlines()[0] in values.replace("    ", "", 1)

    j = json.loads(
        cli(tmp_path, "show", str(seq), "--run", str(made.run_dir), "--format", "json").check().out
    )
    assert j["row"]["op"] == "numpy.exp" and j["prefix"] == f"{pid}-{seq}"
    assert [a["role"] for a in j["arrays"]] == ["input", "output"]
    assert j["arrays"][0]["values"] == list(range(6))
    assert j["source"] == "y = np.exp(x) + 1"

    # infinities are JSON strings, so the output stays strict JSON
    log = _call(made.run_dir, "numpy.log")
    jl = cli(tmp_path, "show", str(log["seq"]), "--run", str(made.run_dir), "--format", "json")
    assert json.loads(jl.check().out)["arrays"][1]["values"] == ["-inf"] * 4


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("99999", "no call with seq 99999 in "),
        ("1-2", "no call with seq 2 in "),
        ("abc", "'abc' is not a seq (17), a dump prefix (4242-17) or a dump file name"),
    ],
)
def test_show_bad_seq_is_one_line_and_exit_2(
    made: Result, tmp_path: Path, key: str, says: str
) -> None:
    r = cli(tmp_path, "show", key, "--run", str(made.run_dir))
    assert r.rc == 2 and r.out == ""
    assert len(r.err.strip().splitlines()) == 1
    assert r.err.startswith(f"pprobe show: {says}")


def test_pprobe_show_and_load_in_python(made: Result) -> None:
    run_dir = str(made.run_dir)
    row = _call(made.run_dir, "numpy.log")
    pid, seq = row["pid"], row["seq"]
    c = pprobe.show(seq, run=run_dir)
    assert isinstance(c, callview.Call) and c.row["op"] == "numpy.log"
    assert str(c).splitlines()[0].startswith("numpy.log  seq")
    h = c._repr_html_()
    assert h.startswith("<div>") and "numpy.log" in h and "<table>" in h and "-inf" in h

    z = np.exp(np.arange(12.0).reshape(3, 4)) + 1
    z = z.sum(axis=0)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(pprobe.load(seq, run=run_dir), np.log(z - z))
    np.testing.assert_array_equal(pprobe.load(f"{pid}-{seq}", run=run_dir, role="input"), z - z)
    trow = sql(run_dir, f"SELECT * FROM tensors WHERE seq = {seq} AND role = 'input'")[0]
    np.testing.assert_array_equal(pprobe.load(trow, run=run_dir), z - z)
    path = os.path.join(run_dir, trow["dump_path"])
    np.testing.assert_array_equal(pprobe.load(path), z - z)
    with pytest.raises(callview.NotFound, match="has no output 7"):
        pprobe.load(seq, run=run_dir, idx=7)
    with pytest.raises(callview.NotFound, match="no call with seq 123456"):
        pprobe.show(123456, run=run_dir)


def test_pprobe_load_row_of_a_log_mode_run_says_why_there_is_no_dump(tmp_path: Path) -> None:
    r = run_script(
        tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n", env={"PPROBE_MODE": "log"}
    )
    run_dir = str(r.check().run_dir)
    trow = sql(run_dir, "SELECT * FROM tensors LIMIT 1")[0]
    with pytest.raises(callview.NotFound, match="has no dump"):
        pprobe.load(trow, run=run_dir)


# ---------------------------------------------------------------------------- unit tests
def test_parse_key() -> None:
    assert callview.parse_key(17) == (None, 17)
    assert callview.parse_key("17") == (None, 17)
    assert callview.parse_key("4242-17") == (4242, 17)
    assert callview.parse_key("/x/op_numpy.add_input0_4242-17.npy") == (4242, 17)
    assert callview.parse_key("op_torch.add_output_12-3.bfloat16.npy") == (12, 3)
    for bad in ("x", "1-2-3", True, "-5"):
        with pytest.raises(ValueError):
            callview.parse_key(bad)


def test_formatters() -> None:
    assert textout.fmt_bytes(0) == "0 B"
    assert textout.fmt_bytes(1536) == "1.5 KiB"
    assert textout.fmt_bytes(1024**3 - 10) == "1.0 GiB"
    assert textout.fmt_seconds(2.5e-6) == "2.5 us"
    assert textout.fmt_seconds(0.25) == "250.0 ms"
    assert textout.fmt_seconds(75) == "1m15s"
    assert textout.fmt_seconds(3725) == "1h02m05s"
    assert callview.few_values(np.arange(3)) == "[0, 1, 2]"
    assert callview.few_values(np.array([0.5, np.nan, -np.inf])) == "[0.5, nan, -inf]"
    assert callview.few_values(np.zeros(10)).endswith(", ...]")


def test_doc_plain_layout() -> None:
    d = textout.Doc()
    d.title("T")
    d.kv([("a", "1"), ("long", "2")])
    d.table("X", ["name", "n"], [["ab", 3], ["c", 12]], right={1})
    d.table("Y", ["name"], [], empty="(nothing)")
    d.bullets("B", ["one"])
    assert d.plain() == (
        "T\n  a     1\n  long  2\nX:\n  name   n\n  ab     3\n  c     12\nY:\n  (nothing)\n"
        "B:\n  - one\n"
    )


def test_nothing_of_this_is_imported_into_a_probed_program(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import sys
        import numpy as np
        np.add(np.ones(2), 1)
        mods = ("pprobe.see_cli", "pprobe.runsummary", "pprobe.callview", "pprobe.runlist",
                "pprobe.textout", "rich", "duckdb")
        print([m for m in mods if m in sys.modules])
        """,
    ).check()
    assert r.out.strip() == "[]"


# -------------------------------------------------------------------------------- export
def test_export_parquet_partitioned_by_step_reads_back_in_duckdb_and_pyarrow(
    made: Result, tmp_path: Path
) -> None:
    import duckdb
    import pyarrow.dataset as ds

    dest = tmp_path / "exp"
    r = cli(tmp_path, "export", str(made.run_dir), str(dest)).check()
    t = _tables(made.run_dir)
    assert f"ops: {len(t['ops'])} rows" in r.out and "partitioned by step" in r.out
    steps = sorted({o["step"] for o in t["ops"]})
    assert sorted(p.name for p in (dest / "ops").iterdir()) == [f"step={s}" for s in steps]
    con = duckdb.connect()
    got = con.execute(
        f"SELECT seq, op, step FROM read_parquet('{dest}/ops/**/*.parquet', "
        "hive_partitioning=true) ORDER BY seq"
    ).fetchall()
    assert got == sorted((o["seq"], o["op"], o["step"]) for o in t["ops"])
    tens = ds.dataset(dest / "tensors", format="parquet", partitioning="hive").to_table()
    assert tens.num_rows == len(t["tensors"])
    step_of = {o["seq"]: o["step"] for o in t["ops"]}
    for row in tens.select(["seq", "step", "max"]).to_pylist():
        assert row["step"] == step_of[row["seq"]]
    # a folder that is not empty is refused
    again = cli(tmp_path, "export", str(made.run_dir), str(dest))
    assert (
        again.rc == 2
        and again.err.strip() == f"pprobe export: {dest} exists and is not an empty folder"
    )


def test_export_csv(made: Result, tmp_path: Path) -> None:
    import csv

    dest = tmp_path / "csv"
    cli(tmp_path, "export", str(made.run_dir), str(dest), "--format", "csv").check()
    t = _tables(made.run_dir)
    with open(dest / "ops.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["op"] for r in sorted(rows, key=lambda r: int(r["seq"]))] == [
        o["op"] for o in sorted(t["ops"], key=lambda o: o["seq"])
    ]
    with open(dest / "tensors.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == len(t["tensors"])


# ------------------------------------------------------------------------------------ gc
def test_gc_lists_first_then_deletes_old_runs_never_the_latest_or_a_symlink(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    for _ in range(3):
        run_script(tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n").check()
    runs = Result(0, "", "", out).runs
    assert len(runs) == 3
    # a symlink to a run-like folder elsewhere is never a candidate, nor followed
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "log").mkdir(parents=True)
    (elsewhere / "meta.json").write_text("{}")
    (out / "zz-link").symlink_to(elsewhere)

    dry = cli(tmp_path, "gc", str(out), "--keep", "1").check()
    assert dry.out.splitlines()[0].startswith(f"pprobe gc: 2 runs to delete in {out}")
    assert [line.split()[0] for line in dry.out.splitlines()[1:3]] == [runs[0].name, runs[1].name]
    assert dry.out.splitlines()[-1] == "nothing deleted: pass --yes to delete these runs"
    assert all(p.exists() for p in runs)

    j = json.loads(cli(tmp_path, "gc", str(out), "--older-than", "0", "--format", "json").out)
    assert [x["id"] for x in j["delete"]] == [runs[0].name, runs[1].name]
    assert j["spared"] == [{"id": runs[2].name, "why": "the latest run"}]
    assert j["dry_run"] is True and all(p.exists() for p in runs)

    done = cli(tmp_path, "gc", str(out), "--keep", "0", "--yes").check()
    assert done.out.splitlines()[-1].startswith("deleted 2 runs")
    assert [p.exists() for p in runs] == [False, False, True]
    assert (elsewhere / "meta.json").exists() and (out / "zz-link").is_symlink()


def test_gc_never_deletes_a_live_run(tmp_path: Path) -> None:
    from pprobe import gc

    out = tmp_path / "out"
    run_script(tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n").check()
    run_script(tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n").check()
    first = Result(0, "", "", out).runs[0]
    m = json.loads((first / "meta.json").read_text())
    m["exit"] = {"status": "running"}
    m["pid"] = os.getpid()  # this test's process: alive
    (first / "meta.json").write_text(json.dumps(m))
    delete, spared = gc.plan(str(out), keep=0)
    assert delete == []
    assert [(i.id, why) for i, why in spared][0] == (first.name, "live (running)")


def test_summary_top_modules_of_a_torch_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    r = run_script(
        tmp_path,
        """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        for i in range(3):
            m(torch.randn(5, 4)).sum()
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    s = json.loads(cli(tmp_path, "summary", str(r.run_dir), "--format", "json").check().out)
    ops = _tables(r.run_dir)["ops"]
    calls: Counter[str] = Counter(o["module_path"] for o in ops if o["module_path"])
    assert len(calls) >= 3
    assert {x["module"]: x["calls"] for x in s["top_modules"]} == dict(calls)
    ns: defaultdict[str, int] = defaultdict(int)
    for o in ops:
        if o["module_path"]:
            ns[o["module_path"]] += o["dur_ns"]
    assert [x["module"] for x in s["top_modules"]] == sorted(ns, key=lambda k: (-ns[k], k))


def test_doc_renders_as_rich_text_on_a_terminal() -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    d = textout.Doc()
    d.title("Run [x]")  # rich markup in data is printed as is
    d.kv([("mode", "dump")])
    d.table("Top", ["op", "calls"], [["numpy.add", 3]], right={1})
    d.bullets("Not captured", ["nested calls"])
    f = Tty()
    d.print(f)
    text = f.getvalue()
    assert "Run [x]" in text and "numpy.add" in text and "nested calls" in text
    assert "\x1b[" in text or "─" in text or "━" in text  # rich styling or box drawing
    plain = io.StringIO()
    d.print(plain)
    assert plain.getvalue() == d.plain()
