"""Live SQL: pprobe.sql in the program, pprobe query --live on a running one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BOOTSTRAP, clean_env, run_script, write

PROG = """
    import json
    import numpy as np
    import pprobe
    from pprobe import table

    n = {"calls": 0}

    @table("live_state")
    def live_state():
        n["calls"] += 1
        return {"calls": n["calls"]}

    for i in range(7):
        np.multiply(np.ones(3), i)
    pprobe.record("ev", [{"i": i} for i in range(4)])
    ops = pprobe.sql("SELECT count(*) AS n FROM ops WHERE op = 'numpy.multiply'")
    ev = pprobe.sql("SELECT sum(i)::BIGINT AS s FROM python.ev")
    st = pprobe.sql("SELECT calls FROM python.live_state")
    mode = pprobe.sql("SELECT value FROM information_schema.df_settings WHERE name = 'mode'")
    print(json.dumps([ops.to_pylist(), ev.to_pylist(), st.to_pylist(), mode.to_pylist(),
                      type(ev.df()).__name__, len(ops)]))
"""


def test_sql_in_process_sees_unflushed_rows(tmp_path: Path) -> None:
    # Nothing would be flushed before exit: a day between flushes, a huge batch size.
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "86400",
                                        "PPROBE_FLUSH_ROWS": "1000000"}).check()  # fmt: skip
    ops, ev, st, mode, df, n = json.loads(r.out)
    assert ops == [{"n": 7}] and ev == [{"s": 6}] and mode == [{"value": "log"}]
    assert st == [{"calls": 1}, {"calls": 2}, {"calls": 3}]  # sampled on demand per query
    assert df == "DataFrame" and n == 1


def test_sql_without_a_run(tmp_path: Path) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE": "0"}).check()
    ops, ev, st, mode, _df, _n = json.loads(r.out)
    assert ops == [{"n": 0}] and ev == [{"s": 6}] and mode == [{"value": "dump"}]
    assert st == [{"calls": 1}, {"calls": 2}, {"calls": 3}]


def test_query_live_reads_a_running_program(tmp_path: Path) -> None:
    go = tmp_path / "go"
    ready = tmp_path / "ready"
    script = write(
        tmp_path / "prog.py",
        f"""
        import os, time
        import numpy as np
        import pprobe
        from pprobe.ext import tables
        for i in range(5):
            np.subtract(np.ones(2), i)
            pprobe.record("progress", {{"i": i}})
        pprobe.active_run_dir() and open({str(ready)!r}, "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
        """,
    )
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(BOOTSTRAP),
                    PPROBE_MODE="log", PPROBE_FLUSH_SECONDS="0.05")  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

        def query(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "pprobe", "query", "--live", *args, "--format", "json",
                 "SELECT (SELECT count(*) FROM python.progress) AS rows, (SELECT count(*) FROM "
                 "ops WHERE op = 'numpy.subtract') AS ops"],
                capture_output=True, text=True, env=env, cwd=tmp_path,
            )  # fmt: skip

        got = None
        while time.monotonic() < deadline:  # until the writer threads have flushed them
            q = query("--pid", str(p.pid), "--run", str(tmp_path / "out"))
            assert q.returncode == 0, q.stderr
            got = json.loads(q.stdout)
            if got == [{"rows": 5, "ops": 5}]:
                break
            time.sleep(0.05)
        assert got == [{"rows": 5, "ops": 5}]
        assert f"is running (pid {p.pid}); no live endpoint: reading the rows flushed so far" in (
            q.stderr
        )
        assert "newest shard written" in q.stderr and len(q.stderr.splitlines()) == 1
    finally:
        go.touch()
        p.wait(timeout=60)
    q = query("--run", str(tmp_path / "out" / "latest"))
    assert "is not running (ended)" in q.stderr
    bad = subprocess.run([sys.executable, "-m", "pprobe", "query", "--live", "--pid", "1",
                          "--run", str(tmp_path / "out"), "SELECT 1"], capture_output=True,
                         text=True, env=env)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("pprobe query: no run of process 1")


def test_live_endpoint_answers_and_refuses(tmp_path: Path) -> None:
    go, ready = tmp_path / "go", tmp_path / "ready"
    script = write(
        tmp_path / "prog.py",
        f"""
        import os, time
        import numpy as np
        import pprobe
        for i in range(6):
            np.subtract(np.ones(2), i)
            pprobe.record("progress", {{"i": i}})
        open({str(ready)!r}, "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
        """,
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the endpoint")
    for transport in ("unix", "tcp"):
        ready.unlink(missing_ok=True)
        go.unlink(missing_ok=True)
        # A day between flushes: only the endpoint can see these rows while the program runs.
        env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(BOOTSTRAP),
                        PPROBE_MODE="log", PPROBE_FLUSH_SECONDS="86400",
                        PPROBE_FLUSH_ROWS="1000000", PPROBE_LIVE=transport)  # fmt: skip
        p = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

            def query(
                sql: str, p: subprocess.Popen = p, env: dict = env
            ) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [sys.executable, "-m", "pprobe", "query", "--live", "--pid", str(p.pid),
                     "--run", str(tmp_path / "out"), "--format", "json", sql],
                    capture_output=True, text=True, env=env, cwd=tmp_path,
                )  # fmt: skip

            q = query("SELECT (SELECT count(*) FROM python.progress) AS rows, (SELECT count(*) "
                      "FROM ops WHERE op = 'numpy.subtract') AS ops")  # fmt: skip
            assert q.returncode == 0, q.stderr
            assert json.loads(q.stdout) == [{"rows": 6, "ops": 6}]
            assert (
                q.stderr.strip()
                == f"pprobe query: live: asked process {p.pid} (its rows up to now)"
            )
            info = next((tmp_path / "out" / "latest" / "live").glob("*.json"))
            assert oct(info.stat().st_mode & 0o777) == "0o600"
            assert json.loads(info.read_text())["transport"] in (transport, "tcp")
            for bad, why in [
                (f"SELECT * FROM read_text('{secret}')", "read_text() is refused"),
                (f"SELECT * FROM '{secret}'", "a quoted path as a table is refused"),
                (f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'", "COPY is refused"),
                (f"ATTACH '{tmp_path / 'x.db'}'", "ATTACH is refused"),
                ("INSTALL httpfs", "INSTALL is refused"),
                ("SELECT 1; SELECT 2", "one statement per request"),
            ]:
                q = query(bad)
                assert q.returncode == 2 and why in q.stderr, (bad, q.stderr)
            assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.db").exists()
            q = query("SELECT nope FROM ops")
            assert q.returncode == 2 and "nope" in q.stderr
        finally:
            go.touch()
            p.wait(timeout=60)
        assert not list((tmp_path / "out" / "latest" / "live").glob("*.sock"))


def test_check_sql_in_process() -> None:
    from pprobe.ext.endpoint import Refused, check_sql

    assert check_sql("  select 'a;b' AS x ; ") == "select 'a;b' AS x"
    assert check_sql("WITH t AS (SELECT 1) SELECT * FROM t")
    for bad in ("PRAGMA version", "SET threads=1", "CREATE TABLE t(a int)",
                "SELECT * FROM glob('/*')", "SELECT * FROM read_parquet('/x.parquet')",
                "SELECT * FROM (FROM '/etc/hosts')", ""):  # fmt: skip
        with pytest.raises(Refused):
            check_sql(bad)


def test_locked_connection_reads_nothing_outside_the_run(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import pprobe
        from pprobe.ext.live import run_locked
        pprobe.record("t", {"a": 1})
        print(run_locked("SELECT a FROM python.t"))
        try:
            run_locked("SELECT * FROM read_text('/etc/hostname')")  # past check_sql: DuckDB
        except Exception as e:
            print(type(e).__name__, "file system operations are disabled" in str(e))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert r.out.splitlines() == ["(['a'], [(1,)])", "QueryError True"]


def test_program_ends_its_own_way_while_a_query_runs(tmp_path: Path) -> None:
    """A query still running when the program ends is interrupted: exit code 0, no abort."""
    ready = tmp_path / "ready"
    script = write(
        tmp_path / "prog.py",
        f"""
        import os, time
        import pprobe
        open({str(ready)!r}, "w").close()
        time.sleep(2)
        """,
    )
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(BOOTSTRAP),
                    PPROBE_MODE="log", PPROBE_LIVE="tcp")  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not ready.exists():
        time.sleep(0.02)
    slow = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"
    q = subprocess.run([sys.executable, "-m", "pprobe", "query", "--live", "--pid", str(p.pid),
                        "--run", str(tmp_path / "out"), slow], capture_output=True, text=True,
                       env=env, timeout=120)  # fmt: skip
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "terminate" not in err and "FATAL" not in err
    assert q.returncode == 2
    assert "the program stopped before the query ended" in q.stderr, q.stderr
