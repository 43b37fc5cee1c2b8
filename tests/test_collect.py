"""pprobe collect: many processes stream their log to one Arrow Flight collector (issue 16).

End to end: a collector runs in a subprocess, probed programs run through the bootstrap with
PPROBE_COLLECTOR set and keep their local copy, and the collected run is checked against the
local one (the independent record of what the program did). Unit tests cover the breaker,
the backoff, the spool and the header checks in-process.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from collect_helpers import Collector, run_folders, token_file, wait_for
from helpers import PYTHON, meta, run_script, sql

from pprobe.collect import breaker, spool, wire
from pprobe.collect.server import safe_name

PROG = """
import sys, time
import numpy as np
import pprobe

n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
a = np.arange(8.0)
for i in range(n):
    a = np.add(a, 1.0)
    b = np.multiply(a, 2.0)
    pprobe.record("progress", {"i": i, "total": float(b.sum())})
    if pause:
        time.sleep(pause)
print(float(a.sum()))
"""


def _key_rows(run_dir: Path | str) -> list[tuple]:
    return [
        (r["pid"], r["seq"], r["op"], r["status"], r["rank"])
        for r in sql(run_dir, "SELECT pid, seq, op, status, rank FROM ops ORDER BY pid, seq")
    ]


def _tensor_rows(run_dir: Path | str) -> list[tuple]:
    q = "SELECT pid, seq, role, idx, dtype, mean FROM tensors ORDER BY pid, seq, role, idx"
    return [tuple(r.values()) for r in sql(run_dir, q)]


@pytest.fixture
def coll(tmp_path: Path):
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path)).start()
    yield c
    if c.proc is not None and c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait(30)


# ------------------------------------------------------------------ end to end
def test_streams_ops_tensors_and_python_tables(tmp_path: Path, coll: Collector) -> None:
    r = run_script(tmp_path, PROG, "30", env=coll.client_env(PPROBE_MODE="stats")).check()
    local = r.run_dir
    runs = run_folders(coll.output)
    assert [p.name for p in runs] == [local.name]  # one run folder, named by the run id
    got = runs[0]
    want = _key_rows(local)
    assert len(want) == 3 * 30 + 2  # arange, (add, multiply, sum) x 30, sum
    assert _key_rows(got) == want  # every op row, once, same content
    assert _tensor_rows(got) == _tensor_rows(local)
    q = "SELECT i, total FROM python.progress ORDER BY i"
    assert sql(got, q) == sql(local, q) and len(sql(got, q)) == 30
    # shards per host and pid, in the local layout
    pid = meta(local)["pid"]
    host = meta(local)["host"]
    assert (got / "log" / f"ops-{host}-{pid}.arrows").is_file()
    assert (got / "log" / f"tensors-{host}-{pid}.arrows").is_file()
    # the client's figures in its local meta.json, and the collector's procs/*.json
    c = meta(local)["collector"]
    assert c["rows_dropped"] == 0 and c["spooled_batches"] == 0 and c["breaker"] == "closed"
    stacks = int(sql(local, "SELECT count(*) AS n FROM stacks")[0]["n"])  # the call stacks
    assert sql(got, "SELECT count(*) AS n FROM stacks")[0]["n"] == stacks
    assert c["rows_sent"] == len(want) + len(_tensor_rows(local)) + 30 + stacks
    proc = json.loads((got / "procs" / f"{host}-{pid}.json").read_text())
    assert proc["end"]["exit"]["status"] == "ok" and proc["end"]["rows_dropped"] == 0
    assert proc["process"]["pid"] == pid and proc["process"]["argv"][0].endswith("prog.py")
    assert proc["rows"] == {"ops": 92, "tensors": len(_tensor_rows(local)), "stacks": stacks,
                            "python.progress": 30}  # fmt: skip
    m = meta(got)
    assert m["collected"] and m["exit"]["status"] == "ok" and m["processes"] == 1
    assert (coll.output / "LATEST").read_text().strip() == local.name
    # `pprobe query DIR/<run>` and `--run DIR` (LATEST) both work on the collected folder
    q = subprocess.run(
        [PYTHON, "-m", "pprobe", "query", "SELECT count(*) AS n FROM ops", "--run",
         str(coll.output), "--format", "json"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"n": 92}]
    assert coll.stop() == 0  # SIGTERM: a clean exit
    assert "stopped" in coll.err()
    assert _key_rows(got) == want


def test_local_copy_dropped(tmp_path: Path, coll: Collector) -> None:
    env = coll.client_env(PPROBE_MODE="log", PPROBE_COLLECTOR_LOCAL="drop")
    r = run_script(tmp_path, PROG, "10", env=env).check()
    assert not list((r.run_dir / "log").glob("ops-*.arrows"))  # no local shard
    assert meta(r.run_dir)["collector"]["local"] == "drop"
    got = run_folders(coll.output)[0]
    assert [x[2] for x in _key_rows(got)][1:4] == [
        "numpy.add",
        "numpy.multiply",
        "numpy.ndarray.sum",
    ]
    assert len(_key_rows(got)) == 32


def test_dumps_sent(tmp_path: Path, coll: Collector) -> None:
    import numpy as np

    import pprobe

    env = coll.client_env(PPROBE_MODE="dump", PPROBE_COLLECTOR_DUMPS="1")
    r = run_script(tmp_path, PROG, "3", env=env).check()
    got = run_folders(coll.output)[0]
    paths = [x["dump_path"] for x in sql(got, "SELECT dump_path FROM tensors")]
    assert paths and all(paths)
    for p in paths:  # every dump a collected row names is there, with the local bytes
        # (the local dump may be in a pack file: pprobe.load reads it; the collected one is a file)
        np.testing.assert_array_equal(np.load(got / p), pprobe.load(str(r.run_dir / p)))


# ------------------------------------------------------------------ security
def _raw_client(
    url: str, token: str | None
) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
    headers = [(b"authorization", wire.bearer(token))] if token else []
    return flight.FlightClient(url), flight.FlightCallOptions(headers=headers, timeout=10)


def _put(url: str, token: str | None, header: dict, batch_id: int = 0) -> None:
    client, opts = _raw_client(url, token)
    b = pa.record_batch({"x": [1, 2, 3]})
    w, _r = client.do_put(flight.FlightDescriptor.for_command(json.dumps(header)), b.schema, opts)
    w.write_with_metadata(b, pa.py_buffer(wire.batch_meta(batch_id)))
    w.done_writing()
    w.close()


HEADER = {"run": "r1", "host": "h", "pid": 1, "rank": None, "stream": "python.t", "client": "c1"}


def test_without_a_valid_token_every_call_is_refused(tmp_path: Path, coll: Collector) -> None:
    for tok in (None, "wrong-token-wrong-token", coll.token.read_text().strip() + "x"):
        with pytest.raises(flight.FlightUnauthenticatedError):
            _put(coll.url, tok, HEADER)
        client, opts = _raw_client(coll.url, tok)
        body = json.dumps({"run": "r1", "host": "h", "pid": 1}).encode()
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.do_action(flight.Action("end", body), opts))
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights(options=opts))
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_actions(opts))
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(b"r1"), opts).read_all()
    assert run_folders(coll.output) == []  # nothing was written
    # a probed program with a wrong token: refused, it still ends well, its rows spooled
    bad = token_file(tmp_path, "bad")
    env = coll.client_env(PPROBE_MODE="log", PPROBE_COLLECTOR_TOKEN_FILE=str(bad),
                          PPROBE_COLLECTOR_DRAIN_SECONDS="1")  # fmt: skip
    r = run_script(tmp_path, PROG, "5", env=env).check()
    assert run_folders(coll.output) == []
    c = meta(r.run_dir)["collector"]
    assert c["rows_sent"] == 0 and c["spooled_batches"] >= 1
    assert "Unauthenticated" in c["last_error"] or "token" in c["last_error"]
    assert bad.read_text().strip() not in r.err + json.dumps(meta(r.run_dir))  # never printed
    _put(coll.url, coll.token.read_text().strip(), HEADER)  # and the right token works
    assert [p.name for p in run_folders(coll.output)] == ["r1"]
    assert "refused" in coll.err()


def test_run_ids_and_hosts_cannot_escape_the_output(tmp_path: Path, coll: Collector) -> None:
    tok = coll.token.read_text().strip()
    outside = tmp_path / "outside"
    outside.mkdir()
    (coll.output / "planted").symlink_to(outside, target_is_directory=True)
    for i, (run, host) in enumerate(
        [
            ("../escaped", "h"),
            (str(outside / "abs"), "h"),
            ("a\x00b", "h"),
            ("ok", "../../../h"),
            ("ok", "/etc"),
            (".", ".."),
            ("..", "h"),
        ]  # fmt: skip
    ):
        _put(coll.url, tok, {**HEADER, "run": run, "host": host, "client": f"c{i}"})
    with pytest.raises(flight.FlightServerError, match="refused"):
        _put(coll.url, tok, {**HEADER, "run": "planted"})  # a symlink is not followed
    with pytest.raises(flight.FlightServerError, match="refused"):
        _put(coll.url, tok, {**HEADER, "stream": "../ops"})
    assert list(outside.iterdir()) == []
    for p in coll.output.rglob("*"):  # every file is a plain one, inside the output folder
        assert p.resolve().is_relative_to(coll.output.resolve()) or p.name == "planted"
    names = {p.name for p in coll.output.iterdir()}
    assert names >= {"_.._escaped", "ok", "a_b", "_.", "_.."}
    hosts = {p.name for p in (coll.output / "ok" / "log" / "python").iterdir()}
    assert hosts == {"t-_.._.._.._h-1-0.arrows", "t-_etc-1-0.arrows"}


def test_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path),
                  extra=("--tls-cert", str(cert), "--tls-key", str(key))).start()  # fmt: skip
    try:
        assert c.url.startswith("grpc+tls://")
        env = c.client_env(PPROBE_MODE="log", PPROBE_COLLECTOR_TLS_ROOT=str(cert))
        r = run_script(tmp_path, PROG, "4", env=env).check()
        assert _key_rows(run_folders(c.output)[0]) == _key_rows(r.run_dir)
        # plaintext to a TLS collector fails (and the client spools)
        env = c.client_env(PPROBE_MODE="log", PPROBE_COLLECTOR_DRAIN_SECONDS="1",
                           PPROBE_COLLECTOR=c.url.replace("grpc+tls", "grpc"))  # fmt: skip
        r2 = run_script(tmp_path, PROG, "4", env=env).check()
        assert meta(r2.run_dir)["collector"]["rows_sent"] == 0
    finally:
        c.stop()


# ------------------------------------------------------------------ units
def test_breaker_states_with_a_fake_clock() -> None:
    now = [0.0]
    b = breaker.Breaker(failures=3, reset_s=5.0, clock=lambda: now[0])
    assert b.allow() and b.state == breaker.CLOSED
    b.failure()
    b.failure()
    assert b.state == breaker.CLOSED and b.allow()
    b.failure()
    assert b.state == breaker.OPEN and not b.allow() and b.wait_s() == 5.0
    now[0] = 4.9
    assert not b.allow()
    now[0] = 5.0
    assert b.allow() and b.state == breaker.HALF_OPEN
    b.failure()  # a failed trial opens it again at once
    assert b.state == breaker.OPEN and not b.allow()
    now[0] = 10.0
    assert b.allow()
    b.success()
    assert b.state == breaker.CLOSED and b.failures == 0 and b.opened == 2


def test_backoff_is_exponential_with_full_jitter() -> None:
    rng = random.Random(1)
    for attempt in range(8):
        cap = min(2.0, 0.05 * 2**attempt)
        xs = [breaker.backoff(attempt, rng=rng) for _ in range(200)]
        assert all(0 <= x <= cap for x in xs)
        assert max(xs) > cap * 0.8 and min(xs) < cap * 0.2  # spread over the whole range


def test_spool_round_trip_and_bound(tmp_path: Path) -> None:
    b = pa.record_batch({"x": list(range(100))})
    one = len(spool.encode({**HEADER, "batch": 0}, b))
    sp = spool.Spool.open(str(tmp_path / "sp"), "h-1", limit=one * 3 + 10)
    for i in range(5):
        sp.put({**HEADER, "batch": i}, b)
    assert len(sp) == 3 and sp.rows_dropped == 200 and sp.batches_dropped == 2
    names = sp.names()
    h, got = sp.get(names[0])
    assert h["batch"] == 0 and h["run"] == "r1" and got.equals(b)
    sp.remove(names[0])
    assert len(sp) == 2 and sp.used == 2 * one
    assert sorted(os.path.basename(p) for p in spool.walk(str(tmp_path))) == names[1:]
    assert oct((tmp_path / "sp" / "h-1").stat().st_mode & 0o777) == "0o700"


def test_headers_are_checked() -> None:
    ok = wire.parse_command(wire.command({**HEADER, "stream": "ops"}))
    assert ok["stream"] == "ops"
    for bad in (b"not json", b"[]", json.dumps({**HEADER, "pid": "1"}).encode(),
                json.dumps({**HEADER, "stream": "log/../x"}).encode(),
                json.dumps({**HEADER, "client": "../x"}).encode(),
                json.dumps({**HEADER, "run": ""}).encode()):  # fmt: skip
        with pytest.raises(wire.BadHeader):
            wire.parse_command(bad)
    assert safe_name("../a/b\x00c") == "_.._a_b_c"
    assert safe_name("x" * 500) != safe_name("x" * 499) and len(safe_name("x" * 500)) == 120


def test_usage_errors(tmp_path: Path) -> None:
    def cli(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, "-m", "pprobe", "collect", *a], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)  # fmt: skip

    for args, msg in [((), "--output"), (("--output", "o", "--listen", "nope"), "HOST:PORT"),
                      (("--output", "o", "--tls-cert", "c"), "go together"),
                      (("--resend", "sp"), "--to")]:  # fmt: skip
        p = cli(*args)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    import socket

    with socket.socket() as s:  # a port in use: one line, not a traceback
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = cli("--output", "o", "--listen", f"127.0.0.1:{port}")
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"pprobe collect: cannot listen on 127.0.0.1:{port} (the port is in use, "
        "or the address is not one of this host's)"
    ]


def test_bad_collector_url_names_the_setting(tmp_path: Path) -> None:
    r = run_script(
        tmp_path, "print(1)", env={"PPROBE_COLLECTOR": "http://x:1", "PPROBE_STRICT": "1"}
    )
    assert r.rc != 0 and "PPROBE_COLLECTOR" in r.err and "grpc://" in r.err


__all__ = ["wait_for"]


def test_forwarder_and_server_in_process(tmp_path: Path) -> None:
    """The client's sender against an in-process collector: queued batches and an earlier
    spool are sent, an unreadable spool file is set aside, the figures add up."""
    import io

    from pprobe.collect.client import Forwarder
    from pprobe.collect.observe import Log, Metrics
    from pprobe.collect.server import Collector as Server
    from pprobe.config import Config

    tok = token_file(tmp_path)
    log = io.StringIO()
    secret = tok.read_text().strip()
    srv = Server("grpc://127.0.0.1:0", str(tmp_path / "c"), secret, Log(stream=log), Metrics())
    try:
        cfg = Config(collector=f"grpc://127.0.0.1:{srv.port}", collector_token_file=str(tok),
                     collector_drain_seconds=30.0)  # fmt: skip
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o700)
        f = Forwarder(cfg, "run1", str(run_dir), "h")
        sp = f._open_spool()
        assert sp is not None
        h = {**HEADER, "run": "run1", "client": f.client_id, "stream": "python.t"}
        sp.put({**h, "batch": 10**6}, pa.record_batch({"x": [100]}))  # left from before
        (Path(sp.folder.path) / "zzz-junk.arrow").write_bytes(b"not arrow")
        f.start()
        for i in range(5):
            f.submit("python.t", pa.record_batch({"x": [i]}))
        s = f.close({"status": "ok", "code": 0})
    finally:
        srv.shutdown()
        srv.close_all()
    assert s["rows_sent"] == 6 and s["spooled_batches"] == 0 and s["rows_dropped"] == 0
    got = sorted(r["x"] for r in sql(tmp_path / "c" / "run1", "SELECT x FROM python.t"))
    assert got == [0, 1, 2, 3, 4, 100]
    assert (Path(sp.folder.path) / "zzz-junk.arrow.bad").is_file()
    assert "client-end" in log.getvalue()


def test_batches_taken_by_a_stuck_sender_are_spooled_at_close(tmp_path: Path) -> None:
    """A sender stuck in a call (a collector that never answers) holds batches it took from
    the queue; close() spools them all, the groups it has not tried yet included, and none
    twice when the call returns later."""
    import threading

    from pprobe.collect.client import Forwarder
    from pprobe.config import Config

    tok = token_file(tmp_path)
    cfg = Config(collector="grpc://127.0.0.1:9", collector_token_file=str(tok))
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    f = Forwarder(cfg, "run1", str(run_dir), "h")
    entered, release = threading.Event(), threading.Event()

    def stuck(group: list) -> bool:  # the call that hangs, then fails
        entered.set()
        release.wait(30)
        return False

    f._send = stuck  # type: ignore[method-assign]
    items = [(f._header("ops"), pa.record_batch({"seq": [0, 1]})),
             (f._header("tensors"), pa.record_batch({"seq": [0], "idx": [0]})),
             (f._header("ops"), pa.record_batch({"seq": [2]}))]  # fmt: skip
    t = threading.Thread(target=f._deliver, args=(items,))
    t.start()
    assert entered.wait(30)
    f._spool_queue(with_inflight=True)  # what close() does when the sender is stuck
    sp = f._open_spool()
    assert sp is not None
    spooled = sorted((h["stream"], b.num_rows) for h, b in map(sp.get, sp.names()))
    assert spooled == [("ops", 1), ("ops", 2), ("tensors", 1)]
    release.set()
    t.join(30)
    assert len(sp.names()) == 3  # the sender spooled nothing again


FORK = """
import os, time
import numpy as np
a = np.add(np.ones(3), 1)
time.sleep(0.5)  # the parent's batches go out first: gRPC has run when it forks
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        b = np.multiply(a, k + 3)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
c = np.subtract(a, 1)
"""


def test_forked_children_hand_their_batches_to_the_parent(tmp_path: Path, coll: Collector) -> None:
    env = coll.client_env(PPROBE_MODE="log", PPROBE_FLUSH_SECONDS="0.05")
    r = run_script(tmp_path, FORK, env=env, timeout=60).check()
    local = r.run_dir
    want = _key_rows(local)
    assert len({x[0] for x in want}) == 3  # the parent and two forked children
    got = run_folders(coll.output)[0]
    assert _key_rows(got) == want
    assert not list((local / ".spool").rglob("*.arrow"))  # the parent sent the children's
    m = meta(got)
    assert m["processes"] == 3 and m["exit"]["status"] == "ok"  # every process's end arrived


def test_dumps_sent_as_stored_by_their_codec(tmp_path: Path, coll: Collector) -> None:
    """With pprobe.codecs (PPROBE_DUMP_CODEC), a collected dump is the very file the program
    stored, and pprobe.load decodes it alike."""
    pytest.importorskip("pprobe.codecs")
    import numpy as np

    import pprobe
    from pprobe import codecs

    env = coll.client_env(PPROBE_MODE="dump", PPROBE_COLLECTOR_DUMPS="1", PPROBE_DUMP_CODEC="int8")
    r = run_script(tmp_path, PROG, "3", env=env).check()
    got = run_folders(coll.output)[0]
    rows = sql(got, "SELECT dump_path, dump_codec FROM tensors")
    assert rows and {x["dump_codec"] for x in rows} <= {"int8", "zstd"}
    for x in rows:
        local = codecs.read_bytes(r.run_dir / x["dump_path"])  # a file or a pack entry
        assert (got / x["dump_path"]).read_bytes() == local
        np.testing.assert_array_equal(
            pprobe.load(got / x["dump_path"]), pprobe.load(r.run_dir / x["dump_path"])
        )
