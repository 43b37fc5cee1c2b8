"""The log writer under load: busy threads do not starve it, memory is bounded (wait or drop
when the buffer is full), kill -9 loses at most about a flush interval, fork never waits long,
and the writer imports nothing the program did not import but pyarrow (no pandas)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BOOTSTRAP, REPO, clean_env, meta, ops, run_script, sql

BUSY = """
import sys, threading, time
import numpy as np
n_threads = int(sys.argv[1])
seconds = float(sys.argv[2])
t_end = time.time() + seconds

def work():
    a = np.ones(64)
    while time.time() < t_end:
        a = np.add(a, 1.0) * 0.5

ts = [threading.Thread(target=work) for _ in range(n_threads - 1)]
for t in ts: t.start()
print("ready", time.time(), flush=True)
work()
for t in ts: t.join()
print("done", flush=True)
"""


def _start(tmp_path: Path, n_threads: int, seconds: float, **env: str) -> tuple:
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    out = tmp_path / "out"
    e = clean_env(PYTHONPATH=str(BOOTSTRAP), PPROBE_OUTPUT=str(out), PPROBE_MODE="log", **env)
    p = subprocess.Popen(
        [sys.executable, str(script), str(n_threads), str(seconds)],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline().split()
    assert line and line[0] == "ready", p.stderr.read() if p.stderr else ""
    return p, out, float(line[1])


def _run_dir(out: Path) -> Path:
    return next(d for d in out.iterdir() if d.is_dir() and not d.is_symlink())


def _rows_on_disk(run_dir: Path) -> tuple[int, float]:
    """(op rows readable now, wall time of the last one)"""
    r = sql(run_dir, "SELECT count(*) AS n, max(ts_ns) AS last FROM ops")
    return int(r[0]["n"]), (r[0]["last"] or 0) / 1e9


@pytest.mark.parametrize("n_threads", [1, 3])
def test_busy_threads_do_not_starve_the_writer_and_kill_9_loses_little(
    tmp_path: Path, n_threads: int
) -> None:
    p, out, t0 = _start(tmp_path, n_threads, 30, PPROBE_FLUSH_SECONDS="0.5")
    try:
        time.sleep(3.0)
        seen_at = time.time()
        n, last = _rows_on_disk(_run_dir(out))  # a live query while the threads spin
        assert n > 1000, n
        assert seen_at - last < 2.5, (seen_at - last, n)
        time.sleep(1.0)
        killed_at = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait()
        n2, last2 = _rows_on_disk(_run_dir(out))
        assert n2 > n
        assert killed_at - last2 < 2.0, killed_at - last2  # about a flush interval lost
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_memory_is_bounded_by_the_buffer_setting(tmp_path: Path) -> None:
    # Three threads record far faster than one writer can write: the buffer's bound holds.
    r = run_script(
        tmp_path,
        BUSY.replace('print("done", flush=True)', "")
        + "import resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n",
        "3",
        "6",
        env={"PPROBE_MODE": "log", "PPROBE_BUFFER_ROWS": "20000"},
    ).check()
    peak_mb = int(r.out.split()[-1])
    base = run_script(
        tmp_path,
        "import numpy, pyarrow, resource\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n",
        probe=False,
    ).check()
    base_mb = int(base.out.split()[-1])
    assert peak_mb - base_mb < 120, (peak_mb, base_mb)
    m = meta(r.run_dir)
    assert m["rows_dropped"] == 0
    assert m["rows_written"] == len(ops(r.run_dir)) > 20000


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_a_full_buffer_waits_or_drops_and_counts(tmp_path: Path, policy: str) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        a = np.ones(4)
        for i in range(6000):
            np.add(a, 1.0)
        """,
        env={
            "PPROBE_MODE": "log",
            "PPROBE_BUFFER_ROWS": "1000",
            "PPROBE_BUFFER_FULL": policy,
            "PPROBE_FLUSH_SECONDS": "60",
            "PPROBE_FLUSH_ROWS": "1000000",
        },
    ).check()
    rows = ops(r.run_dir, "op = 'numpy.add'")
    m = meta(r.run_dir)
    if policy == "wait":
        assert len(rows) == 6000 and m["rows_dropped"] == 0
        assert not ops(r.run_dir, "op = 'pprobe.rows_dropped'")
    else:
        assert m["rows_dropped"] > 0
        assert len(rows) + m["rows_dropped"] >= 6000
        notes = ops(r.run_dir, "op = 'pprobe.rows_dropped'")
        assert notes and sum(int(x["args"].split("=")[1]) for x in notes) == m["rows_dropped"]
        assert any("PPROBE_BUFFER_FULL" in w for w in m["warnings"])


def test_fork_while_other_threads_record_does_not_hang(tmp_path: Path) -> None:
    prog = """
    import os, threading, time
    import numpy as np
    stop = False
    def work():
        a = np.ones(4)
        while not stop:
            np.add(a, 1.0)
    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts: t.start()
    t0 = time.time()
    for i in range(20):
        pid = os.fork()
        if pid == 0:
            np.add(np.ones(2), 1.0)
            os._exit(0)
        os.waitpid(pid, 0)
    stop = True
    for t in ts: t.join()
    print(round(time.time() - t0, 2))
    """
    r = run_script(
        tmp_path, prog, env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "0.05"}, timeout=120
    ).check()
    assert float(r.out.split()[-1]) < 30  # unprobed: about 1 s; it used to hang


def test_the_writer_imports_only_pyarrow(tmp_path: Path) -> None:
    # pandas is installed by the test extras: pyarrow.array() would import it lazily.
    pytest.importorskip("pandas")
    prog = """
    import json, sys, time
    import numpy as np
    a = np.ones(64)
    for i in range(3000):
        a = np.add(a, 1.0) * 0.5
    np.savez(__import__("io").BytesIO(), a=a)
    time.sleep(1.0)          # a flush happens (PPROBE_FLUSH_SECONDS=0.2)
    print(json.dumps(sorted(sys.modules)))
    """
    plain = run_script(tmp_path, prog, probe=False).check()
    probed = run_script(tmp_path, prog, env={"PPROBE_FLUSH_SECONDS": "0.2"}).check()
    assert ops(probed.run_dir)  # it wrote the log
    # What pprobe's writer side imports by itself (pyarrow and its dependencies, pprobe's own
    # modules and the standard modules they use), in a fresh interpreter without numpy.
    allowed = subprocess.run(
        [sys.executable, "-c",
         "import json, sys; b = set(sys.modules)\n"
         "import pyarrow, pyarrow.ipc, pyarrow._compute, wrapt\n"
         "import pprobe.session, pprobe.writer, pprobe.dumps, pprobe.query\n"
         "import importlib.util as u\n"  # the dumps' content hash (a dependency)
         "_ = u.find_spec('xxhash') and __import__('xxhash')\n"
         "import sysconfig; sysconfig.get_config_var('Py_GIL_DISABLED')\n"  # the build check
         "print(json.dumps(sorted(set(sys.modules) - b)))"],
        capture_output=True, text=True, check=True, env=clean_env(), cwd=str(REPO),
    )  # fmt: skip
    before = set(json.loads(plain.out.splitlines()[-1]))
    extra = set(json.loads(probed.out.splitlines()[-1])) - before
    extra -= set(json.loads(allowed.stdout))
    own = ("pprobe", "_pprobe_boot", "sitecustomize", "usercustomize")
    extra = {m for m in extra if m.split(".")[0] not in own}
    assert "pandas" not in extra
    assert not extra, sorted(extra)
