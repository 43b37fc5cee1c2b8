"""Child processes record into their parent's run, each into its own shard: subprocess,
multiprocessing fork / spawn / forkserver, and forked children that end with os._exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import meta, ops, run_script, shard_pids, sql

CHILDREN_PROG = """
    import json, multiprocessing as mp, os, subprocess, sys
    import numpy as np

    def work(q, tag):
        np.add(np.arange(3), tag)
        q.put(os.getpid())

    if __name__ == "__main__":
        pids = {"parent": os.getpid()}
        np.negative(np.arange(2))
        for k, method in enumerate(["fork", "spawn", "forkserver"], 1):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q, k))
            p.start()
            pids[method] = q.get()
            p.join()
            assert p.exitcode == 0
        out = subprocess.run(
            [sys.executable, "-c",
             "import os, numpy as np; np.add(np.arange(3), 4); print(os.getpid())"],
            check=True, capture_output=True, text=True)
        pids["subprocess"] = int(out.stdout)
        pid = os.fork()
        if pid == 0:
            np.add(np.arange(3), 5)    # rows still buffered (flush every second) ...
            os._exit(0)                # ... and no atexit in a forked child
        os.waitpid(pid, 0)
        pids["os._exit"] = pid
        print(json.dumps(pids))
"""


def test_children_record_into_the_same_run_each_in_its_own_shard(tmp_path: Path) -> None:
    r = run_script(tmp_path, CHILDREN_PROG, env={"PPROBE_MODE": "stats"}).check()
    pids = json.loads(r.out)
    assert len(set(pids.values())) == len(pids) == 6
    run_dir = r.run_dir
    assert len(r.runs) == 1  # one run folder for the whole tree of processes
    rows = ops(run_dir)
    by_pid: dict[int, list[str]] = {}
    for x in rows:
        by_pid.setdefault(x["pid"], []).append(f"{x['op']} {x['args'] or ''}".strip())
    assert by_pid[pids["parent"]] == ["numpy.arange 0=2", "numpy.negative"]
    for k, name in enumerate(["fork", "spawn", "forkserver", "subprocess", "os._exit"], 1):
        assert by_pid[pids[name]] == ["numpy.arange 0=3", f"numpy.add 1={k}"], name
    # each recording process has its own shard of each table, named by its pid
    assert shard_pids(run_dir, "ops") == shard_pids(run_dir, "tensors") == set(pids.values())
    # and its own procs/*.json; children are no run of their own
    procs = {json.loads(p.read_text())["pid"] for p in (run_dir / "procs").glob("*.json")}
    assert set(pids.values()) <= procs
    m = meta(run_dir)
    assert m["pid"] == pids["parent"] and m["exit"]["status"] == "ok"
    for p in (run_dir / "procs").glob("*.json"):
        proc = json.loads(p.read_text())
        if proc["pid"] in pids.values() and proc["pid"] != pids["parent"]:
            assert proc["end"] is not None and proc["rows_written"] == 2, proc


def test_forked_child_os_exit_keeps_rows_of_a_long_buffer(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import os
        import numpy as np
        pid = os.fork()
        if pid == 0:
            for i in range(5000):
                np.add(np.ones(2), i)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        print(pid, os.waitstatus_to_exitcode(status))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "60"},
    ).check()
    child, code = map(int, r.out.split())
    assert code == 3  # os._exit's status is kept
    rows = ops(r.run_dir, f"pid = {child}")
    assert len(rows) == 10000
    assert [x["args"] for x in rows if x["op"] == "numpy.add"] == [f"1={i}" for i in range(5000)]


def test_pool_workers_closed_and_joined_leave_their_rows(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import multiprocessing as mp
        import numpy as np
        def work(i):
            return float(np.add(np.arange(3), i).sum())
        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                pool = mp.get_context(method).Pool(2)
                print(pool.map(work, range(6)))
                pool.close()
                pool.join()
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    rows = ops(r.run_dir, "op = 'numpy.add'")
    assert sorted(x["args"] for x in rows) == sorted([f"1={i}" for i in range(6)] * 2)
    assert len({x["pid"] for x in rows}) >= 2


def test_pool_used_as_a_context_manager_keeps_worker_rows(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import multiprocessing as mp
        import numpy as np
        def work(i):
            return float(np.add(np.arange(3), i).sum())
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:   # __exit__ terminates: SIGTERM
                print(pool.map(work, range(6)))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    rows = ops(r.run_dir, "op = 'numpy.add'")
    assert len(rows) == 6  # workers flush on SIGTERM before dying of it
    assert len({x["pid"] for x in rows}) >= 1


def test_sigterm_flushes_and_the_process_still_dies_of_it(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from helpers import BOOTSTRAP, clean_env, write

    script = write(
        tmp_path / "prog.py",
        """
        import sys, time
        import numpy as np
        np.add(np.ones(3), 1)
        print("ready", flush=True)
        time.sleep(60)
        """,
    )
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PPROBE_MODE="log",
                    PYTHONPATH=str(BOOTSTRAP), PPROBE_FLUSH_SECONDS="600")  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                         text=True, cwd=tmp_path)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM  # same status as without pprobe
    run_dir = (tmp_path / "out" / "latest").resolve()
    assert [x["op"] for x in ops(run_dir)] == ["numpy.ones", "numpy.add"]
    assert meta(run_dir)["exit"]["status"] == "signal"


def test_sigterm_keeps_its_default_action_and_kills_during_a_long_c_call(tmp_path: Path) -> None:
    """No Python-level handler: getsignal says SIG_DFL, and a C call that holds the GIL (a
    regular expression backtracking for ~10 s) does not delay death past the grace period."""
    import signal
    import subprocess
    import sys
    import time

    from helpers import BOOTSTRAP, clean_env, write

    from pprobe.session import SIGTERM_GRACE

    script = write(
        tmp_path / "prog.py",
        """
        import re, signal
        import numpy as np
        np.add(np.ones(3), 1)
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        re.match(r"(a+)+$", "a" * 28 + "b")
        print("the C call ended", flush=True)
        """,
    )
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PPROBE_MODE="log",
                    PYTHONPATH=str(BOOTSTRAP))  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                         text=True, cwd=tmp_path)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "True"
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=SIGTERM_GRACE + 3)
    finally:
        p.kill()
    assert rc == -signal.SIGTERM
    assert time.monotonic() - t0 < SIGTERM_GRACE + 1.5
    assert p.stdout.read() == ""


def test_a_sigterm_handler_of_the_program_is_its_own(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from helpers import BOOTSTRAP, clean_env, write

    script = write(
        tmp_path / "prog.py",
        """
        import os, signal, sys, time
        import numpy as np
        def bye(signum, frame):
            print("handled", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        np.add(np.ones(3), 1)
        print("ready", flush=True)
        time.sleep(60)
        """,
    )
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PPROBE_MODE="log",
                    PYTHONPATH=str(BOOTSTRAP))  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                         text=True, cwd=tmp_path)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 7
    assert p.stdout.read().split() == ["handled", str(int(signal.SIGTERM))]
    run_dir = (tmp_path / "out" / "latest").resolve()
    assert [x["op"] for x in ops(run_dir)] == ["numpy.ones", "numpy.add"]
    assert meta(run_dir)["exit"] == {"status": "exited", "code": 7, "message": None}


@pytest.mark.parametrize("mode", ["log", "dump"])
def test_pprobe_threads_import_no_module(tmp_path: Path, mode: str) -> None:
    """A module imported on a pprobe thread holds importlib's lock on it while it loads: a
    child forked then would wait forever for a thread it lacks (CI saw a forked child's dumps
    hang so). The writer and dump threads must find every module they use already imported."""
    r = run_script(
        tmp_path,
        """
        import sys, threading, time
        seen = []

        def hook(event, args):
            if event == "import" and threading.current_thread().name.startswith("pprobe"):
                seen.append((threading.current_thread().name, args[0]))

        sys.addaudithook(hook)
        import numpy as np

        for k in range(3):
            for i in range(2000):
                np.negative(np.full(100, float(i)))
            time.sleep(1.0)  # the writer's timed flush runs on its thread
        print(sorted(set(seen)))
        """,
        env={"PPROBE_MODE": mode},
    ).check()
    assert r.out.strip() == "[]"
    assert len(ops(r.run_dir, "op = 'numpy.negative'")) == 6000


def test_children_forked_while_the_python_tables_are_written_do_not_hang(tmp_path: Path) -> None:
    """The pprobe-ext thread's first write imports numpy and pyarrow (0.1-1 s on a loaded
    machine); a child forked in that window must not inherit importlib's lock on them, held
    by a thread it lacks. The imports are slowed to 0.5 s each on that thread (a finder in
    front of the real one), and the program forks every 20 ms across them: each child
    records a row and exits, writing its own shard (its own imports)."""
    r = run_script(
        tmp_path,
        """
        import importlib.machinery, os, sys, threading, time

        class Slow:
            def find_spec(self, name, path, target=None):
                if name not in ("numpy", "pyarrow") or \\
                        threading.current_thread().name != "pprobe-ext":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                real = spec.loader.exec_module

                def exec_module(module):
                    time.sleep(0.5)
                    real(module)

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, Slow())
        import pprobe

        pprobe.record("t", {"a": -1})  # starts the pprobe-ext thread (it writes every 1 s)

        @pprobe.metric("m")  # sampled every 0.5 s on that thread: the flush's column way
        def m():
            return 1.5

        kids, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 3.0:
            pid = os.fork()
            if pid == 0:
                pprobe.record("t", {"a": len(kids)})
                sys.exit(0)  # atexit: the child writes its shard
            kids.append(pid)
            time.sleep(0.02)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
        print(len(kids), sorted(set(codes)))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_SAMPLE_SECONDS": "0.5"},
        timeout=90,
    ).check()
    n, codes = r.out.split(" ", 1)
    assert codes.strip() == "[0]"
    got = sql(r.run_dir, "SELECT a FROM python.t")
    assert sorted(x["a"] for x in got) == list(range(-1, int(n)))
    assert sql(r.run_dir, "SELECT count(*) AS n FROM python.metrics")[0]["n"] >= 3
