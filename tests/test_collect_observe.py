"""The collector's Prometheus metrics and JSON log lines, checked against what was sent."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from collect_helpers import Collector, free_port, run_folders, token_file
from helpers import run_script, sql
from test_collect import HEADER, PROG, _put

pytest.importorskip("prometheus_client")


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_and_json_log(tmp_path: Path) -> None:
    port = free_port()
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path),
                  extra=("--metrics-port", str(port), "--log-json")).start()  # fmt: skip
    try:
        r = run_script(tmp_path, PROG, "20", env=c.client_env(PPROBE_MODE="stats")).check()
        tok = c.token.read_text().strip()
        _put(c.url, tok, HEADER, batch_id=7)
        _put(c.url, tok, HEADER, batch_id=7)  # a duplicate
        with pytest.raises(Exception):
            _put(c.url, "not-the-token-at-all", HEADER)
        m = _metrics(port)
    finally:
        assert c.stop() == 0
    got = next(p for p in run_folders(c.output) if p.name == r.run_dir.name)
    n = {t: int(sql(got, f"SELECT count(*) AS n FROM {t}")[0]["n"])
         for t in ("ops", "tensors", "stacks", "python.progress")}  # fmt: skip
    assert m['pprobe_collect_rows_total{stream="ops"}'] == n["ops"]
    assert m['pprobe_collect_rows_total{stream="tensors"}'] == n["tensors"]
    assert m['pprobe_collect_rows_total{stream="python"}'] == n["python.progress"] + 3
    assert m["pprobe_collect_batches_deduplicated_total"] == 1
    assert m['pprobe_collect_errors_total{kind="auth"}'] >= 1
    assert m["pprobe_collect_clients_total"] == 2  # the program, and the test's own puts
    assert m["pprobe_collect_bytes_total"] > 0
    assert m['pprobe_collect_request_seconds_count{method="DoPut"}'] >= 3
    assert m['pprobe_collect_request_seconds_count{method="DoAction"}'] == 1  # one "end"
    events = [json.loads(line) for line in c.err().splitlines()]  # every line is JSON
    kinds = [e["event"] for e in events]
    for k in ("start", "run", "client", "client-end", "duplicates", "refused", "stopping",
              "stopped"):  # fmt: skip
        assert k in kinds, kinds
    assert all({"ts", "level", "event"} <= set(e) for e in events)
    end = next(e for e in events if e["event"] == "client-end")
    assert end["rows_sent"] == sum(n.values()) and end["rows_dropped"] == 0


def test_client_adds_no_module_the_program_did_not_ask_for(tmp_path: Path) -> None:
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path)).start()
    try:
        prog = """
        import sys, time
        import numpy as np
        a = np.ones(4)
        for _ in range(5):
            a = np.add(a, a)
        time.sleep(1.5)  # batches are sent meanwhile
        print(sorted(m for m in ("pandas", "pyarrow.flight") if m in sys.modules))
        """
        env = c.client_env(PPROBE_MODE="log", PPROBE_FLUSH_SECONDS="0.1")
        r = run_script(tmp_path, prog, env=env).check()
        assert r.out.strip() == "['pyarrow.flight']"  # imported on the sender thread only
        assert len(sql(run_folders(c.output)[0], "SELECT * FROM ops")) == 6
        r2 = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
        assert r2.out.strip() == "[]"  # without PPROBE_COLLECTOR, no flight at all
    finally:
        c.stop()
