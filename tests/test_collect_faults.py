"""pprobe collect under faults: a collector killed and restarted, one that never comes back,
a spool that fills up, batches sent twice. Rows are checked against the program's local copy
(PPROBE_COLLECTOR_LOCAL=keep, the default), the independent record of what it did."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pyarrow as pa
from collect_helpers import Collector, run_folders, token_file, wait_for
from helpers import PYTHON, meta, run, sql, write
from test_collect import HEADER, PROG, _key_rows, _put, _tensor_rows

from pprobe.collect import spool

FAST = {
    "PPROBE_MODE": "stats",
    "PPROBE_FLUSH_SECONDS": "0.05",
    "PPROBE_COLLECTOR_BREAKER_FAILURES": "2",
    "PPROBE_COLLECTOR_BREAKER_SECONDS": "0.3",
}


def _start_prog(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    from helpers import BOOTSTRAP, clean_env

    script = write(tmp_path / "prog.py", PROG)
    e = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(BOOTSTRAP), **env)
    return subprocess.Popen([PYTHON, str(script), *args], cwd=str(tmp_path), env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _local_run(tmp_path: Path) -> Path:
    return (tmp_path / "out" / "latest").resolve()


def _ops_count(run_dir: Path) -> int:
    try:
        return int(sql(run_dir, "SELECT count(*) AS n FROM ops")[0]["n"])
    except Exception:
        return 0


def test_collector_killed_and_restarted_every_row_once(tmp_path: Path) -> None:
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path)).start()
    p = _start_prog(tmp_path, {**c.client_env(**FAST),
                               "PPROBE_COLLECTOR_DRAIN_SECONDS": "60"}, "300", "0.02")  # fmt: skip
    try:
        wait_for(lambda: run_folders(c.output) and _ops_count(run_folders(c.output)[0]) > 20)
        live = _ops_count(run_folders(c.output)[0])  # queried while the job runs
        c.kill()  # kill -9, mid-run
        time.sleep(1.0)  # the program goes on; its batches spool
        c.start()  # the same port and output folder
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
    local = _local_run(tmp_path)
    got = run_folders(c.output)[0]
    want = _key_rows(local)
    assert len(want) == 3 * 300 + 2 and 0 < live < len(want)
    assert _key_rows(got) == want  # every row exactly once
    assert _tensor_rows(got) == _tensor_rows(local)
    q = "SELECT i FROM python.progress ORDER BY i"
    assert [r["i"] for r in sql(got, q)] == list(range(300))
    m = meta(local)["collector"]
    assert m["failed_sends"] >= 1 and m["spooled_batches"] == 0 and m["rows_dropped"] == 0
    assert m["breaker_opened"] >= 1 and m["breaker"] == "closed"
    assert not list((local / ".spool").rglob("*.arrow"))  # the spool was sent and emptied
    assert c.stop() == 0


def test_duplicates_are_dropped_across_collector_restarts(tmp_path: Path) -> None:
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path)).start()
    tok = c.token.read_text().strip()
    h = {**HEADER, "stream": "python.t"}
    for i in (0, 1, 1, 0):
        _put(c.url, tok, h, batch_id=i)
    c.kill()
    shard = c.output / "r1" / "log" / "python" / "t-h-1-0.arrows"
    with open(shard, "ab") as f:  # a batch the killed collector only half wrote
        f.write(b"\xff\xff\xff\xff\x80\x00\x00\x00" + b"\x00" * 40)
    c.start()
    for i in (1, 0, 2):
        _put(c.url, tok, h, batch_id=i)
    _put(c.url, tok, {**h, "client": "other"}, batch_id=0)  # another client's batch 0
    assert c.stop() == 0
    assert [r["x"] for r in sql(c.output / "r1", "SELECT x FROM python.t")] == [1, 2, 3] * 4
    assert "truncated" in c.err() and "duplicates" in c.err()


def test_collector_that_never_comes_back(tmp_path: Path) -> None:
    # A "collector" that accepts connections and never answers: every call would hang
    # without the client's bounds.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    url = f"grpc://127.0.0.1:{hole.getsockname()[1]}"
    tok = token_file(tmp_path)
    env = {**FAST, "PPROBE_COLLECTOR": url, "PPROBE_COLLECTOR_TOKEN_FILE": str(tok),
           "PPROBE_COLLECTOR_DRAIN_SECONDS": "1"}  # fmt: skip
    try:
        r = run([PYTHON, str(write(tmp_path / "prog.py", PROG)), "40", "0.01"], tmp_path,
                env=env, timeout=60).check()  # fmt: skip
    finally:
        hole.close()
    local = r.run_dir
    m = meta(local)["collector"]
    assert m["rows_sent"] == 0 and m["spooled_batches"] >= 1 and m["rows_dropped"] == 0
    # every row is in the spool, once
    seen: dict[str, list] = {}
    for path in spool.walk(str(local / ".spool")):
        h, b = spool.decode(Path(path).read_bytes())
        seen.setdefault(h["stream"], []).append(b)
    ops = pa.Table.from_batches(seen["ops"]).sort_by([("pid", "ascending"), ("seq", "ascending")])
    assert list(zip(ops["pid"].to_pylist(), ops["seq"].to_pylist(), ops["op"].to_pylist())) == [
        x[:3] for x in _key_rows(local)
    ]
    # the tensors' rows too (a batch missing here was lost before the spool, not in the resend)
    want_t = _tensor_rows(local)
    assert want_t, "the program records tensors: the check below would be empty"
    tens = pa.Table.from_batches(seen["tensors"]).sort_by(
        [(c, "ascending") for c in ("pid", "seq", "role", "idx")]
    )
    cols = ["pid", "seq", "role", "idx", "dtype", "mean"]
    assert [tuple(r.values()) for r in tens.select(cols).to_pylist()] == want_t
    # `pprobe collect --resend` sends it to a collector that is there, exactly once
    copy = tmp_path / "spool-copy"
    shutil.copytree(local / ".spool", copy)
    c = Collector(tmp_path, tmp_path / "collected", tok).start()
    for src in (local / ".spool", copy):
        p = subprocess.run(
            [PYTHON, "-m", "pprobe", "collect", "--resend", str(src), "--to", c.url,
             "--token-file", str(tok)], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert "0 failed" in p.stdout
    assert not list(spool.walk(str(local / ".spool")))  # sent files are removed
    got = run_folders(c.output)[0]
    assert got.name == local.name
    assert _key_rows(got) == _key_rows(local) and _tensor_rows(got) == _tensor_rows(local)
    assert c.stop() == 0


def test_full_spool_drops_and_counts(tmp_path: Path) -> None:
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path))  # not started yet
    env = {**c.client_env(**FAST), "PPROBE_COLLECTOR_SPOOL_BYTES": "1",
           "PPROBE_COLLECTOR_DRAIN_SECONDS": "60"}  # fmt: skip
    p = _start_prog(tmp_path, env, "300", "0.02")
    try:
        wait_for(lambda: (tmp_path / "out" / "latest").exists())
        time.sleep(1.0)  # batches fail, the breaker opens, the spool (1 byte) drops them
        c.start()
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
        c.stop()
    local = _local_run(tmp_path)
    m = meta(local)["collector"]
    total = sum(
        int(sql(local, f"SELECT count(*) AS n FROM {t}")[0]["n"])
        for t in ("ops", "tensors", "stacks", "python.progress")
    )
    assert m["rows_dropped"] > 0 and m["rows_sent"] > 0
    assert m["rows_sent"] + m["rows_dropped"] == total  # nothing else lost
    got = run_folders(c.output)[0]
    kept = sum(
        int(sql(got, f"SELECT count(*) AS n FROM {t}")[0]["n"])
        for t in ("ops", "tensors", "stacks", "python.progress")
    )
    assert kept == m["rows_sent"]
    dropped_lines = [x for x in c.err().splitlines() if "rows-dropped" in x]
    assert dropped_lines and f"rows={m['rows_dropped']}" in dropped_lines[0]
    assert meta(got)["rows_dropped"] == m["rows_dropped"]
    assert json.loads(next((got / "procs").glob("*.json")).read_text())["end"]["rows_dropped"] \
        == m["rows_dropped"]  # fmt: skip
