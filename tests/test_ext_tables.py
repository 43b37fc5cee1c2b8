"""The extension API's tables and metrics (schema ``python``), end to end and in process.

End-to-end tests run scripts through the bootstrap and read the run with pprobe's SQL; the
expected rows are computed here from the same formulas the scripts use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import run_script, sql

from pprobe.ext import tables


def rows(run_dir: Path, q: str) -> list[dict]:
    return sql(run_dir, q)


# ------------------------------------------------------------------ end to end
TRAIN = """
    import numpy as np
    import pprobe
    from pprobe import metric, register_table, table

    state = {"loss": 8.0, "calls": 0}

    @table("training_state")
    def training_state():
        state["calls"] += 1
        return {"loss": state["loss"], "lr": 0.5 ** state["calls"], "tag": f"c{state['calls']}"}

    @metric("gpu_utilization")
    def gpu():
        return 10 * state["calls"]

    register_table("arrow_data", {"id": 0, "value": -1.0})  # replaced below
    register_table("arrow_data", [{"id": 1, "value": 10.0}, {"id": 2, "value": 20.0}])
    register_table("arrow_tbl", __import__("pyarrow").table({"k": ["a", "b"], "v": [1, 2]}))
    for i in range(STEPS):
        np.add(np.ones(3), i)
        state["loss"] /= 2
        pprobe.step()
    print(state["calls"])
"""


@pytest.mark.parametrize("every", [1, 2])
def test_table_and_metric_sampled_every_n_steps_and_at_exit(tmp_path: Path, every: int) -> None:
    steps = 5
    r = run_script(
        tmp_path,
        TRAIN.replace("STEPS", str(steps)),
        env={"PPROBE_MODE": "log", "PPROBE_SAMPLE_STEPS": str(every)},
    ).check()
    run = r.run_dir
    # Boundaries 1..steps (step old -> old+1); sampled at each `every`-th, then at exit.
    sampled_steps = [b - 1 for b in range(1, steps + 1) if b % every == 0] + [steps]
    calls = int(r.out.strip()) + 1  # printed before the exit's sample
    assert calls == len(sampled_steps)
    got = rows(run, "SELECT * FROM python.training_state ORDER BY ts_ns")
    assert [g["step"] for g in got] == sampled_steps
    assert [g["lr"] for g in got] == [0.5**c for c in range(1, calls + 1)]
    assert [g["tag"] for g in got] == [f"c{c}" for c in range(1, calls + 1)]
    losses = [8.0 / 2 ** min(s + 1, steps) for s in sampled_steps]
    assert [g["loss"] for g in got] == losses
    pid = json.loads((run / "meta.json").read_text())["pid"]
    run_id = run.name
    assert {(g["pid"], g["run_id"], g["rank"]) for g in got} == {(pid, run_id, None)}
    m = rows(run, "SELECT * FROM python.metrics WHERE name = 'gpu_utilization' ORDER BY ts_ns")
    assert [x["value"] for x in m] == [10.0 * c for c in range(1, calls + 1)]
    assert [x["step"] for x in m] == sampled_steps
    a = rows(run, "SELECT id, value FROM python.arrow_data ORDER BY id")
    assert a == [{"id": 1, "value": 10.0}, {"id": 2, "value": 20.0}]
    t = rows(run, "SELECT k, v, pid FROM python.arrow_tbl ORDER BY k")
    assert t == [{"k": "a", "v": 1, "pid": pid}, {"k": "b", "v": 2, "pid": pid}]
    # the ops are still there, next to them
    assert rows(run, "SELECT count(*) AS n FROM ops WHERE op = 'numpy.add'")[0]["n"] == steps


def test_query_cli_reads_python_tables(tmp_path: Path) -> None:
    r = run_script(tmp_path, TRAIN.replace("STEPS", "2"), env={"PPROBE_MODE": "log"}).check()
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "query", "--run", str(r.run_dir), "--format", "json",
         "SELECT step, lr FROM python.training_state ORDER BY step"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(p.stdout) == [{"step": 0, "lr": 0.5}, {"step": 1, "lr": 0.25},
                                    {"step": 2, "lr": 0.125}]  # fmt: skip


def test_record_types_inferred_and_unified_across_flushes(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        import pprobe
        from pprobe.ext import tables
        pprobe.record("ev", {"a": 1, "b": "x", "flag": True, "v": [1, 2], "f": np.float32(0.5)})
        tables.flush()
        pprobe.record("ev", {"a": 2.5, "b": "y", "new": None})   # a becomes double
        tables.flush()
        pprobe.record("ev", [{"a": 3, "b": 7, "new": "n"}])      # b: int after string
        pprobe.record_custom_data({"module": "Linear", "out_shape": [4, 2]})
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    got = rows(r.run_dir, "SELECT a, b, flag, v, f, new FROM python.ev ORDER BY ts_ns")
    assert got == [
        {"a": 1.0, "b": "x", "flag": True, "v": [1, 2], "f": 0.5, "new": None},
        {"a": 2.5, "b": "y", "flag": None, "v": None, "f": None, "new": None},
        {"a": 3.0, "b": "7", "flag": None, "v": None, "f": None, "new": "n"},
    ]
    shards = sorted(p.name for p in (r.run_dir / "log" / "python").iterdir())
    assert len([s for s in shards if s.startswith("ev-")]) == 3  # a new shard per new schema
    c = rows(r.run_dir, "SELECT module, out_shape FROM python.custom_data")
    assert c == [{"module": "Linear", "out_shape": [4, 2]}]


def test_rows_flushed_before_a_kill_are_kept(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import os, signal, time
        import pprobe
        from pprobe.ext import tables
        for i in range(5):
            pprobe.record("progress", {"i": i, "sq": i * i})
        while tables.pending or not tables._sinks:  # written by the pprobe-ext thread
            time.sleep(0.01)
        with tables._write_lock:  # its first write done
            pass
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "0.05"},
    )
    assert r.rc == -9
    got = rows(r.run_dir, "SELECT i, sq FROM python.progress ORDER BY i")
    assert got == [{"i": i, "sq": i * i} for i in range(5)]


def test_sampled_on_a_time_interval(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import time
        from pprobe import table
        seen = []
        @table("beat")
        def beat():
            seen.append(len(seen))
            return {"n": len(seen)}
        while len(seen) < 3:    # sampled by pprobe's thread: no step, no exit yet
            time.sleep(0.01)
        print(len(seen))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_SAMPLE_SECONDS": "0.05"},
        timeout=60,
    ).check()
    n = rows(r.run_dir, "SELECT n FROM python.beat ORDER BY n")
    assert [x["n"] for x in n][:3] == [1, 2, 3]  # then one more at exit, maybe one in between
    assert n[-1]["n"] >= 4


def test_a_raising_table_is_reported_once_then_switched_off(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import pprobe
        from pprobe import table, metric
        calls = []
        @table("bad")
        def bad():
            calls.append(1)
            raise ValueError("boom")
        @metric("bad_metric")
        def bad_metric():
            return "not a number"
        for i in range(8):
            pprobe.step()
        print(len(calls), sum([1 for _ in range(3)]))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    calls = int(r.out.split()[0])
    assert calls == tables.MAX_FAILURES  # switched off: no more calls, the exit's included
    lines = [x for x in r.err.splitlines() if "table 'bad'" in x]
    assert len(lines) == 2, r.err  # first failure, then switched off
    assert "ValueError: boom" in lines[0] and "switched off" in lines[1]
    errs = rows(r.run_dir, "SELECT source, event, error, failures FROM python.errors "
                           "ORDER BY source, failures")  # fmt: skip
    assert errs == [
        {"source": "metric 'bad_metric'", "event": "raised", "error": "ValueError", "failures": 1},
        {"source": "metric 'bad_metric'", "event": "switched off", "error": "ValueError",
         "failures": tables.MAX_FAILURES},
        {"source": "table 'bad'", "event": "raised", "error": "ValueError", "failures": 1},
        {"source": "table 'bad'", "event": "switched off", "error": "ValueError",
         "failures": tables.MAX_FAILURES},
    ]  # fmt: skip


def test_processes_write_their_own_shards(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text("import pprobe, os\npprobe.record('who', {'role': 'child'})\n")
    r = run_script(
        tmp_path,
        f"""
        import os, subprocess, sys
        import pprobe
        pprobe.record("who", {{"role": "parent"}})
        p = subprocess.run([sys.executable, {str(child)!r}])
        pid = os.fork()
        if pid == 0:
            pprobe.record("who", {{"role": "forked"}})
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.getpid())
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    got = rows(r.run_dir, "SELECT role, pid FROM python.who ORDER BY role")
    assert [g["role"] for g in got] == ["child", "forked", "parent"]
    assert len({g["pid"] for g in got}) == 3
    assert [g["pid"] for g in got if g["role"] == "parent"] == [int(r.out)]


def test_without_extensions_nothing_is_loaded(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import sys
        import numpy as np
        import pprobe
        from pprobe import recorder
        for i in range(3):
            np.add(np.ones(2), 1)
            pprobe.step()
        print(sorted(m for m in sys.modules if m.startswith("pprobe.ext")), recorder.step_listeners)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert r.out.strip() == "[] []"
    assert not (r.run_dir / "log" / "python").exists()
    assert rows(r.run_dir, "SELECT count(*) AS n FROM python.metrics") == [{"n": 0}]


# ------------------------------------------------------------------ in process
def test_type_inference() -> None:
    import numpy as np

    t = tables.build_table(
        [
            {"i": 1, "f": 1, "s": "a", "b": True, "l": [1, 2], "n": None, "np": np.int32(3)},
            {"i": 2, "f": 2.5, "s": None, "b": False, "l": [[1]], "x": {"k": 1}, "np": np.ones(2)},
        ],
        [],
    )
    types = {f.name: str(f.type) for f in t.schema}
    assert types == {"i": "int64", "f": "double", "s": "string", "b": "bool",
                     "l": "list<item: string>", "n": "null", "np": "string",
                     "x": "string"}  # fmt: skip
    assert t.column("f").to_pylist() == [1.0, 2.5]
    assert t.column("x").to_pylist() == [None, "{'k': 1}"]


@pytest.mark.parametrize(
    "a,b,want",
    [
        (pa.int64(), pa.float64(), pa.float64()),
        (pa.bool_(), pa.int64(), pa.int64()),
        (pa.null(), pa.string(), pa.string()),
        (pa.string(), pa.int64(), pa.string()),
        (pa.list_(pa.int64()), pa.list_(pa.float64()), pa.list_(pa.float64())),
        (pa.list_(pa.int64()), pa.int64(), pa.string()),
    ],
)
def test_unify_types(a: pa.DataType, b: pa.DataType, want: pa.DataType) -> None:
    assert tables.unify_types(a, b) == want
    assert tables.unify_types(b, a) == want


def test_conform_keeps_rows_of_an_older_schema() -> None:
    old = pa.table({"a": [1, 2], "v": [[1], [2, 3]]})
    sch = pa.schema([("a", pa.float64()), ("v", pa.string()), ("z", pa.int64())])
    got = tables.conform(old, sch)
    assert got.to_pylist() == [
        {"a": 1.0, "v": "[1]", "z": None},
        {"a": 2.0, "v": "[2, 3]", "z": None},
    ]


@pytest.mark.parametrize("name", ["1x", "a-b", "", "a.b", None])
def test_bad_table_names(name: object) -> None:
    with pytest.raises(tables.ExtensionError, match="not valid"):
        tables.register_table(name, [])  # type: ignore[arg-type]


def test_reserved_and_bad_rows() -> None:
    with pytest.raises(tables.ExtensionError, match="pprobe's own"):
        tables.register_table("metrics", [])
    with pytest.raises(tables.ExtensionError, match="a row is a dict"):
        tables.record("t_bad", 5)
    with pytest.raises(tables.ExtensionError, match="a row is a dict"):
        tables.record("t_bad", [1])


def test_record_keeps_its_calls_values_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """record() defers the standard columns off the program's thread: the rows still hold
    the values, step and rank of the call (the program's dict changed later, or the step
    moved, changes nothing), in the order recorded, and the taps get them as rows."""
    from pprobe import state

    tables.clear_rows()
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(tables, "taps", [lambda t, rows: seen.append((t, len(rows)))])
    monkeypatch.setattr(state, "step", 41)
    row = {"loss": 1.5, "tags": "a"}
    rows = [{"k": 1}, {"k": 2}]
    tables.record("t_deferred", row)
    tables.record("t_deferred", rows)
    row["loss"] = -1.0
    rows[0]["k"] = 99
    monkeypatch.setattr(state, "step", 42)
    tables.record("t_deferred", {"loss": 2.5})
    assert tables.pending.get("t_deferred") is None  # nothing done on the caller's thread
    tables._drain()
    got = tables.pending.pop("t_deferred")
    assert [(r["step"], r.get("loss"), r.get("k")) for r in got] == [
        (41, 1.5, None), (41, None, 1), (41, None, 2), (42, 2.5, None)]  # fmt: skip
    assert got[0]["ts_ns"] <= got[1]["ts_ns"] <= got[3]["ts_ns"]
    assert seen == [("t_deferred", 1), ("t_deferred", 2), ("t_deferred", 1)]
    assert tables._recorded == []


def test_deferred_makers_make_their_rows_at_the_take_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """defer((make, args)): nothing is made on the caller's thread; at the take each maker
    makes its rows with the standard columns of its own call, in the order deferred (a maker
    that carries state sees them in order), between plain rows; one that raises is reported
    and makes no rows, and the others are kept."""
    from pprobe import _report, state

    tables.clear_rows()
    reported: list[str] = []
    monkeypatch.setattr(_report, "internal_error", lambda where, exc, **kw: reported.append(where))
    made: list[int] = []
    total = {"n": 0}

    def make(k: int) -> list[dict[str, Any]]:
        made.append(k)
        total["n"] += k  # state carried from row to row: the order matters
        return [{"k": k, "running": total["n"]}]

    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(state, "step", 7)
    tables.defer("t_made", (make, (1,)))
    tables.defer("t_made", [{"k": 0}])
    monkeypatch.setattr(state, "step", 8)
    tables.defer("t_made", (broken, ()))
    tables.defer("t_made", (make, (2,)))
    tables.defer("t_made", (lambda: [], ()))  # no rows
    assert made == [] and tables.pending.get("t_made") is None
    tables._drain()
    got = tables.pending.pop("t_made")
    assert [(r["step"], r["k"], r.get("running")) for r in got] == [
        (7, 1, 1), (7, 0, None), (8, 2, 3)]  # fmt: skip
    assert reported == ["making the rows of python.t_made"]
    assert tables._recorded == []


def test_a_steps_samples_leave_the_collector_one_tracked_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sample() keeps a step's values where the garbage collector soon stops tracking them
    (they would otherwise be scanned by every older-generation collection until the flush),
    and a source that raises gives no value while the others still do."""
    import gc

    from pprobe import state

    tables.clear_rows()
    monkeypatch.setattr(tables, "sources", {})
    monkeypatch.setattr(tables, "taps", [])
    monkeypatch.setattr(tables, "_todo", ())
    monkeypatch.setattr(state, "step", 7)
    monkeypatch.setattr(tables, "note_failure", lambda *a: None)
    n = {"i": 0}

    def bad() -> float:
        raise RuntimeError("no")

    with tables._lock:
        for kind, name, fn in (("table", "t_gc", lambda: {"loss": 0.5, "n": n["i"]}),
                               ("metric", "m_bad", bad),
                               ("metric", "m_ok", lambda: n["i"] * 2)):  # fmt: skip
            tables.sources[(kind, name)] = tables.Source(kind, name, fn)
        tables._sources_changed()
    for i in range(3):
        n["i"] = i
        tables.sample("step")
    if tables._untrack is not None:  # the native core: the entries are never tracked at all
        assert not any(gc.is_tracked(e) or gc.is_tracked(e[4]) for e in tables._raw)
    gc.collect()  # a collection that meets a sample untracks what holds plain values only
    assert len(tables._raw) == 3
    for entry in tables._raw:
        # the table's dict (a copy, plain values) and the metrics' numbers are untracked; the
        # values tuple stays tracked only because it holds a dict (CPython keeps a tuple of
        # dicts tracked); a sample of metrics alone leaves just the entry
        assert [type(v) for v in entry[4]] == [dict, object, float]
        assert not gc.is_tracked(entry[4][0]), entry
    tables._drain()
    got = tables.pending
    assert [(r["step"], r["n"], r["loss"]) for r in got.pop("t_gc")] == [
        (7, i, 0.5) for i in range(3)
    ]
    assert [(r["name"], r["value"]) for r in got.pop("metrics")] == [
        ("m_ok", 0.0),
        ("m_ok", 2.0),
        ("m_ok", 4.0),
    ]
    assert not got
    with tables._lock:  # metrics alone: the values tuple is untracked too
        del tables.sources[("table", "t_gc")]
        tables._sources_changed()
    tables.sample("step")
    gc.collect()
    assert not gc.is_tracked(tables._raw[-1][4]), tables._raw[-1]
    tables.clear_rows()


if os.name != "posix":  # pragma: no cover
    pytest.skip("fork", allow_module_level=True)


def test_register_table_dataframe_as_given_and_replaced(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    r = run_script(
        tmp_path,
        """
        import pandas as pd
        from pprobe import register_table
        register_table("frame", pd.DataFrame({"id": [1, 2, 3], "value": [10.0, 20.0, 30.0]}))
        register_table("frame", pd.DataFrame({"id": [7], "name": ["x"]}))   # replaces it
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    got = sql(r.run_dir, "SELECT * EXCLUDE (run_id, pid, rank, step, ts_ns) FROM python.frame")
    assert got == [{"id": 7, "name": "x"}]


# ---------------------------------------------------------------- the flush's column way
def _sampled(batch: list) -> list:
    """Samples given as (step, rank, ts_ns, [(source, value), ...]) in ``_raw``'s shape:
    (step, rank, ts_ns, sources, values), one sources tuple per set of sources (as ``_todo``
    is between two registrations)."""
    todos: dict[tuple[int, ...], tuple] = {}
    out = []
    for step, rank, ts, pairs in batch:
        todo = tuple(p[0] for p in pairs)
        todo = todos.setdefault(tuple(map(id, todo)), todo)
        out.append((step, rank, ts, todo, tuple(p[1] for p in pairs)))
    return out


def _rows_way(batch: list) -> dict[str, pa.Table]:
    """What the rows way (``_drain`` then ``build_table``) makes of sampled values."""
    tables.clear_rows()
    tables._raw.extend(_sampled(batch))
    tables._drain()
    got = {t: tables.build_table(r, list(tables.STD_COLUMNS)) for t, r in tables.pending.items()}
    tables.clear_rows()
    return got


def _columns_way(batch: list) -> dict[str, pa.Table]:
    """What the flush makes of them without taps: whole columns, the rest through rows."""
    tables.clear_rows()
    got = tables._columns_of(_sampled(batch))
    for t, r in tables.pending.items():
        assert t not in got
        got[t] = tables.build_table(r, list(tables.STD_COLUMNS))
    tables.clear_rows()
    return got


def _src(kind: str, name: str) -> tables.Source:
    return tables.Source(kind, name, lambda: None)


def _batches() -> dict[str, list]:
    import numpy as np

    st, m1, m2 = _src("table", "state"), _src("metric", "loss"), _src("metric", "lr")
    other = _src("table", "other")
    same = [(s, 7 if s % 2 else None, 1000 + s,
             [(st, {"loss": s / 3, "n": s, "tag": f"t{s % 2}"}), (m1, s * 0.5), (m2, None)])
            for s in range(6)]  # fmt: skip
    return {
        "same sources every step": same,
        "one source, one key": [(s, None, s, [(st, {"x": s})]) for s in range(4)],
        "a user column named like pprobe's": [
            (s, 0, s, [(st, {"step": 100 + s, "a": 1.5})]) for s in range(3)
        ],
        "numpy values and an empty row": [
            (s, 0, s, [(st, {"v": np.float32(s), "w": np.arange(2) + s}), (other, {})])
            for s in range(3)
        ],
        "keys that change": [(0, 0, 0, [(st, {"a": 1})]), (1, 0, 1, [(st, {"a": 2, "b": "x"})])],
        "a list of rows and a metric": [
            (s, 0, s, [(st, [{"i": s}, {"i": -s}]), (m1, float(s))]) for s in range(3)
        ],
        "a source missing at one step": [same[0], (9, 7, 9, [(m2, 2.0)]), same[2]],
        "a source that gave no value at one step (off, or it raised)": [
            same[0],
            (9, 7, 9, [same[1][3][0], (m1, tables._SKIP), (m2, 2.0)]),
            same[2],
        ],
        "int keys": [(0, 0, 0, [(st, {1: "a"})]), (1, 0, 1, [(st, {1: "b"})])],
    }


@pytest.mark.parametrize("case", list(_batches()))
def test_the_column_way_makes_the_tables_the_rows_way_makes(case: str) -> None:
    batch = _batches()[case]
    rows, cols = _rows_way(batch), _columns_way(batch)
    assert sorted(rows) == sorted(cols)
    for t in rows:
        assert cols[t].schema == rows[t].schema, (t, cols[t].schema, rows[t].schema)
        assert cols[t].to_pylist() == rows[t].to_pylist(), t


def _chunk(run_id: object, rank: object, step: object, ts: int, cols: dict) -> tuple:
    return ({"run_id": run_id, "pid": 42, "rank": rank, "step": step, "ts_ns": ts}, cols)


def _chunk_cases() -> dict[str, list]:
    names = ["w", "b", None, "w", "b", "w", "w", "b"]  # few values repeated, one None
    two = {"param": ["a", "b"], "v": [1.0, 2.5]}
    return {
        "standard values the same or one per chunk": [
            _chunk("r1", None, s, 10 + s, {"param": names, "n": list(range(8))}) for s in range(5)
        ],
        "a rank set at the third chunk": [
            _chunk("r1", None if s < 2 else 3, s, s, dict(two)) for s in range(4)
        ],
        "a step given by the caller": [
            _chunk("r1", 0, 9, s, {"step": [s, s], **two}) for s in range(3)
        ],
        "a step unknown then known": [_chunk("r1", 0, None, 0, two), _chunk("r1", 0, 4, 1, two)],
        "run ids that differ": [_chunk("r1", 0, 1, 0, two), _chunk("r2", 0, 1, 1, two)],
        "an int beyond int64 in a standard column": [
            _chunk("r1", 0, 1 << 70, 0, two),
            _chunk("r1", 0, 1, 1, two),
        ],
        "every standard value missing": [_chunk(None, None, None, 0, two)] * 2,
        "strings mostly None": [_chunk("r1", 0, 1, 0, {"t": [None] * 7 + ["x"]})] * 3,
    }


@pytest.mark.parametrize("case", list(_chunk_cases()))
def test_column_chunks_make_the_table_their_rows_make(case: str) -> None:
    """The flush's table of column chunks (standard columns repeated per chunk, strings
    encoded once per distinct value) equals build_table over the same rows."""
    parts = _chunk_cases()[case]
    got = tables._table_of_cols(parts)
    want = tables.build_table(
        [r for chunk in parts for r in tables._chunk_rows(chunk)], list(tables.STD_COLUMNS)
    )
    assert got.schema == want.schema, (got.schema, want.schema)
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize(
    "vals",
    [
        [None] * 5,
        ["run"] * 9,
        ["w", "b", None, "w", "b", "w", "w", "b"] * 5,  # few values: each encoded once
        ["w", "b"] * 20,
        [f"v{i}" for i in range(30)] + [None],  # many values: encoded one by one
        ["é", "日本", "\ud800", "é"] * 4,  # a lone surrogate is replaced, as by encode()
        [],
    ],
)
def test_string_columns_hold_the_values_given(vals: list) -> None:
    """The writer's string arrays (built from buffers) equal pyarrow's own conversion."""
    import numpy as np

    from pprobe.writer import _texts

    want = [None if v is None else v.encode("utf-8", "replace").decode() for v in vals]
    got = _texts(pa, np, vals)
    assert got.type == pa.string()
    assert got.to_pylist() == want == pa.array(want, pa.string()).to_pylist()


def test_rows_given_by_column_are_written_as_the_same_rows(tmp_path: Path) -> None:
    """The built-in hooks' column way (tables._add_columns) writes the table their rows
    would: same columns in the same order, types and values, across flushes and with a
    standard column (step) given by the caller winning; with a tap they reach it as rows."""
    r = run_script(
        tmp_path,
        """
        import pprobe
        from pprobe.ext import tables
        from pprobe.hooks import builtin

        for k in range(3):
            cols = {"hook": ["h"] * 2, "step": [k, k], "param": ["w", "b"],
                    "numel": [6, 0], "norm": [1.5 * k, float("nan")],
                    "nan_count": [0, k]}
            builtin.record_columns("by_cols", cols)
            builtin.record("by_rows", builtin.rows_of(cols))
            if k == 1:
                tables.flush()
        tables.flush()  # what a tap added now sees starts here
        seen = []
        tables.taps.append(lambda t, rows: seen.append((t, len(rows), rows[0]["param"])))
        builtin.record_columns("by_cols", {"hook": ["x"], "param": ["p"]})
        assert seen == []  # the program's thread only appends; the drain makes the rows
        tables._drain()
        print(seen)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert r.out.strip() == "[('by_cols', 1, 'p')]"
    q = "SELECT * EXCLUDE (ts_ns) FROM python.{} ORDER BY ts_ns, param"
    a, b = sql(r.run_dir, q.format("by_cols")), sql(r.run_dir, q.format("by_rows"))
    assert [list(x) for x in a[:6]] == [list(x) for x in b]  # the same columns, in order
    assert [str(x) for x in a[:6]] == [str(x) for x in b]  # NaN == NaN as text
    assert [x["step"] for x in b] == [0, 0, 1, 1, 2, 2] and a[6]["param"] == "p"


def test_the_native_step_listener_samples_as_on_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder's step listener is the native core's twin of ``on_step`` where the core
    is built (``_native.ext_on_step``): the same values kept, the same failures noted, the
    ending step in ``state.step`` while the functions run (as pprobe's own code), every
    ``sample_steps`` boundaries."""
    from pprobe import core, state

    listener = tables._step_listener()
    if core.native is None:
        assert listener is tables.on_step
        return
    assert listener is core.native.ext_on_step
    seen: list[tuple[int, bool]] = []
    noted: list[str] = []

    def calls(kind: str) -> Any:
        n = {"i": 0}

        def fn() -> Any:
            n["i"] += 1
            seen.append((state.step, state.local.depth >= state.INTERNAL))
            return {"metric_int": n["i"], "metric_str": "2.5", "metric_none": None,
                    "table_dict": {"a": n["i"], "b": "x"}, "table_rows": [{"a": 1}, {"a": 2}],
                    "table_none": None}[kind]  # fmt: skip

        return fn

    def bad() -> float:
        raise RuntimeError("no")

    def run(step_fn: Any) -> list[tuple]:
        tables.clear_rows()
        monkeypatch.setattr(tables, "sources", {})
        monkeypatch.setattr(tables, "_todo", ())
        monkeypatch.setattr(tables, "_steps_seen", 0)
        monkeypatch.setattr(tables, "_every", 2)
        monkeypatch.setattr(tables, "note_failure", lambda what, s, e: noted.append(what))
        if step_fn is listener:  # the core calls what ext_setup was given

            def python_twin(old: int, new: int) -> None:
                fell_back.append(old)
                tables.on_step(old, new)

            core.native.ext_setup(vars(tables), vars(state), python_twin,
                                  tables._sampled_value, lambda w, s, e: noted.append(w),
                                  tables._SKIP)  # fmt: skip
        with tables._lock:
            for kind in ("metric_int", "metric_str", "metric_none", "table_dict",
                         "table_rows", "table_none"):  # fmt: skip
                k = kind.split("_")[0]
                tables.sources[(k, kind)] = tables.Source(k, kind, calls(kind))
            tables.sources[("metric", "bad")] = tables.Source("metric", "bad", bad)
            off = tables.Source("metric", "off", calls("metric_int"))
            off.off = True
            tables.sources[("metric", "off")] = off
            tables._sources_changed()
        monkeypatch.setattr(state, "step", 10)
        for s in range(10, 16):
            step_fn(s, s + 1)
            assert state.step == 10  # put back after the sample
        step_fn(12, 12)  # no boundary
        return [(e[0], e[1], [v if v is not tables._SKIP else "SKIP" for v in e[4]])
                for e in tables._raw]  # fmt: skip

    fell_back: list[int] = []
    native_got, native_seen, native_noted = run(listener), list(seen), list(noted)
    assert fell_back == []  # the core sampled every boundary itself
    seen.clear()
    noted.clear()
    python_got = run(tables.on_step)
    assert native_got == python_got
    assert [type(v) for v in native_got[0][2]] == [float, float, type(None), dict, list,
                                                    type(None), str, str]  # fmt: skip
    assert native_got[0][2][:2] == [1.0, 2.5]  # int -> float, "2.5" -> float, as float()
    assert native_seen == seen and all(internal for _, internal in seen)
    assert [s for s, _ in seen[::6]] == [11, 13, 15]  # every 2nd boundary: the ending step
    assert native_noted == noted == ["metric 'bad'"] * 3
    tables.clear_rows()
    core.native.ext_setup(vars(tables), vars(state), tables.on_step, tables._sampled_value,
                          tables.note_failure, tables._SKIP)  # fmt: skip
