"""Stress of the recording core: 8 threads of mixed NumPy ops, forks and toggling, at once.

The program below runs 8 threads, each a seeded random mix of NumPy ops (ufuncs with ``out=``
and under ``np.errstate``, ndarray operators and methods, ufunc methods, ``__array_function__``
dispatchers, NumPy Python functions, and calls that raise), while its main thread forks
children that each make one NumPy call and end with ``os._exit``. Each thread prints a
checksum of its first ``REQUIRED`` results and the exceptions it caught: the output must be
bit-identical with and without the probe, and the log must hold every thread, every status
and every child.

The threads make their first ``REQUIRED`` calls at full speed, all released at once; then
they pause 1 ms after each call until the main thread is done (about 2 s). Without the pause,
8 threads of small ops make rows faster than the writer thread (a ninth of the GIL) turns
them into Arrow batches: the backlog grows to hundreds of thousands of rows, and each
``os.fork()`` and ``pprobe.disable()`` waits for the whole flush in progress (the fork hook
takes the writer's lock), seconds at a time and longer at each fork in log mode. That limit
is not what this test is about; the pause keeps each run to a few seconds.

Toggling the probe while the threads run: ``pprobe.enable()`` / ``pprobe.disable()`` are the
in-code API "without the bootstrap" (README, Use). In a bootstrap-started process
``disable()`` ends the bootstrap's run and each later ``enable()`` starts a new run folder
(``Run.create_or_join``), which the README does not describe. So the toggling is its own run
of the program, without the bootstrap: ``with pprobe.probe(mode="log"):`` around every other
fork, while the threads keep running, each block being one run folder.

The engine is chosen with ``PPROBE_CORE`` (python / native); the native one is skipped where
``pprobe._native`` does not import. The bootstrap runs are in stats mode and in dump mode (the
native core records both itself; in dump mode every thread's arrays also go through the one
dumper, its budget lock and its queue).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import (
    BOOTSTRAP,
    PYTHON,
    REPO,
    Result,
    clean_env,
    meta,
    ops,
    run_script,
    shard_pids,
    sql,
)

N_THREADS = 8
N_FORKS = 6
REQUIRED = 200  # as in the program

STRESS_PROG = r"""
import json, os, random, signal, sys, threading, time, warnings
import numpy as np

TOGGLE = sys.argv[1] == "toggle"
N_THREADS = 8
N_FORKS = 6
REQUIRED = 200  # calls per thread, at full speed, that make its checksum
PACE = 0.001  # then a pause after each call until told to stop (see the test's docstring)
DURATION = 2.0  # seconds the main thread keeps the threads busy
CHILD_TIMEOUT = 20.0  # for all the forked children together: a hang fails, never blocks

# Warnings the program would see are part of its output (np.errstate keeps them away).
warnings.simplefilter("always")
warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
seen_warnings = []
warnings.showwarning = lambda msg, cat, *a, **k: seen_warnings.append(f"{cat.__name__}: {msg}")


def arrays(rng):
    n = rng.randint(1, 40)
    a = np.arange(n, dtype=np.float64) * rng.uniform(-2.0, 2.0) + rng.randint(-5, 5)
    b = np.linspace(-1.0, 3.0, n)
    return n, a, b


def c_add(rng):
    _, a, b = arrays(rng)
    return np.add(a, b)


def c_multiply_out(rng):
    _, a, b = arrays(rng)
    o = np.empty_like(a)
    r = np.multiply(a, b, out=o)
    assert r is o
    return o


def c_sqrt_negative(rng):
    _, a, _ = arrays(rng)
    with np.errstate(invalid="ignore"):
        r = np.sqrt(a - 3.0)  # NaN for the negative entries, no RuntimeWarning
    return np.where(np.isnan(r), -1.0, r)


def c_operators(rng):
    _, a, b = arrays(rng)
    c = a + b
    c += 1
    return -c + (a < b)


def c_matmul(rng):
    k = rng.randint(1, 6)
    m = np.arange(k * k, dtype=np.float64).reshape(k, k) / (k + 1)
    return m @ m.T


def c_methods(rng):
    n, a, _ = arrays(rng)
    return a.reshape(1, n).astype(np.float32).sum()


def c_ufunc_methods(rng):
    _, a, b = arrays(rng)
    return np.add.reduce(a) + np.add.accumulate(b)


def c_dispatchers(rng):
    _, a, b = arrays(rng)
    c = np.concatenate([a, b])
    return np.sum(c) + np.mean(c)


def c_python_functions(rng):
    k = rng.randint(1, 5)
    return np.ones((k, 2)) + np.eye(k, 2)


def c_broadcast_error(rng):
    return np.ones(3) + np.ones(4)  # ValueError


def c_reshape_error(rng):
    n, a, _ = arrays(rng)
    return np.reshape(a, (n + 1, 2))  # ValueError


def c_casting_error(rng):
    x = np.arange(rng.randint(1, 5))
    return np.add(x, 1.5, out=x)  # an int64 out cannot take float64: a TypeError subclass


def c_seen_contents(rng):
    # 4 KiB and more, few distinct contents: in dump mode every thread meets contents seen
    # before (links, statistics from the native core's table), also while another thread
    # changes its own array in place
    a = np.full((rng.randint(8, 12), 64), float(rng.randint(0, 2)))
    b = np.negative(a)
    b += a.T.T
    return np.sum(np.maximum(a, b).T, axis=0)


CALLS = [
    c_add, c_multiply_out, c_sqrt_negative, c_operators, c_matmul, c_methods,
    c_ufunc_methods, c_dispatchers, c_python_functions, c_broadcast_error, c_reshape_error,
    c_casting_error, c_seen_contents,
]  # fmt: skip


def worker(i, start, stop, results):
    rng = random.Random(1000 + i)
    total, errors, done = 0.0, {}, 0
    start.wait()
    while done < REQUIRED or not stop.is_set():
        try:
            r = rng.choice(CALLS)(rng)
            value = float(np.asarray(r, dtype=np.float64).sum())
            key = None
        except (ValueError, TypeError) as e:
            key = f"{type(e).__name__}: {e}"
        if done < REQUIRED:
            if key is None:
                total += value
            else:
                errors[key] = errors.get(key, 0) + 1
        done += 1
        if done >= REQUIRED:
            time.sleep(PACE)
    results[i] = (total, sorted(errors.items()))


def fork(k, children):
    time.sleep(DURATION / N_FORKS)
    pid = os.fork()
    if pid == 0:
        try:
            np.add(np.arange(3), k)
            code = 0
        except BaseException:
            code = 3
        os._exit(code)
    children.append(pid)


def fork_all(children):
    for k in range(N_FORKS):
        if TOGGLE and k % 2 == 0:
            import pprobe

            with pprobe.probe(mode="log"):
                fork(k, children)
        else:
            fork(k, children)


def main():
    start = threading.Barrier(N_THREADS + 1)
    stop = threading.Event()
    results = [None] * N_THREADS
    threads = [
        threading.Thread(target=worker, args=(i, start, stop, results), name=f"stress-{i}")
        for i in range(N_THREADS)
    ]
    for t in threads:
        t.start()
    start.wait()
    children = []
    try:
        fork_all(children)
    finally:  # the threads end even when the main thread fails
        stop.set()
        for t in threads:
            t.join()

    statuses = []
    deadline = time.monotonic() + CHILD_TIMEOUT
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                statuses.append("hung")
                break
            time.sleep(0.01)
    with open("children.json", "w") as f:
        json.dump({"parent": os.getpid(), "children": children}, f)

    for i, (total, errors) in enumerate(results):
        print(f"stress-{i} {total!r} {errors!r}")
    print("children", statuses)
    print("warnings", seen_warnings)
    sys.exit(0 if statuses == [0] * N_FORKS else 1)


main()
"""

#: Exceptions the threads' raising calls leave in ``status``, with the op that raised.
RAISED = {
    ("numpy.ndarray.__add__", "ValueError"),  # np.ones(3) + np.ones(4)
    ("numpy.reshape", "ValueError"),
    ("numpy.add", "UFuncTypeError"),  # out= casting: _UFuncOutputCastingError.__name__
}


def _pythonpath(*extra: Path) -> str:
    """This checkout's pprobe first, whichever pprobe the interpreter has installed."""
    return os.pathsep.join(str(p) for p in (*extra, REPO))


@pytest.fixture(params=["python", "native"])
def core(request: pytest.FixtureRequest) -> str:
    """The engine; :func:`_engine_env` sets it for the program."""
    engine: str = request.param
    if engine == "native":
        p = subprocess.run(
            [PYTHON, "-c", "import pprobe._native"],
            env=clean_env(PYTHONPATH=_pythonpath()),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if p.returncode != 0:
            pytest.skip(f"no native engine here: {p.stderr.strip().splitlines()[-1:]}")
    return engine


def _engine_env(engine: str) -> dict[str, str]:
    from pprobe import config

    if engine == "python" and "PPROBE_CORE" not in {*config.BY_ENV, *config.OTHER_ENV}:
        # Before the native engine, PPROBE_CORE is an unknown variable (a configuration
        # error): the Python engine is then the only one, chosen by leaving it unset.
        return {}
    return {"PPROBE_CORE": engine}


def _check_engine(run_dir: Path, engine: str) -> None:
    """Where meta.json names the engine (``core``), it is the one asked for, no fallback."""
    for proc in [meta(run_dir), *_procs(run_dir).values()]:
        if "core" in proc:
            assert proc["core"]["engine"] == engine, proc["core"]


def _stress(tmp_path: Path, name: str, *, probe: bool, toggle: bool, env: dict[str, str]) -> Result:
    cwd = tmp_path / name
    path = _pythonpath(BOOTSTRAP) if probe else _pythonpath()
    return run_script(
        cwd,
        STRESS_PROG,
        "toggle" if toggle else "plain",
        probe=probe,
        env={**env, "PYTHONPATH": path},
        timeout=120,  # a fork or an exit that hangs fails the test, not CI
    ).check()


def _children(r: Result) -> dict:
    return json.loads((r.output.parent / "children.json").read_text())


def _procs(run_dir: Path) -> dict[int, dict]:
    """pid -> procs/{host}-{pid}.json"""
    procs = [json.loads(p.read_text()) for p in (run_dir / "procs").glob("*.json")]
    return {p["pid"]: p for p in procs}


def _check_log(run_dir: Path) -> None:
    """What every run folder must hold, however its threads were cut by forks or toggles."""
    assert sql(run_dir, "SELECT count(*) AS n FROM ops WHERE op IS NULL") == [{"n": 0}]
    dup = sql(run_dir, "SELECT pid, seq FROM ops GROUP BY pid, seq HAVING count(*) > 1")
    assert dup == []
    orphans = sql(
        run_dir,
        "SELECT count(*) AS n FROM tensors t WHERE NOT EXISTS "
        "(SELECT 1 FROM ops o WHERE o.pid = t.pid AND o.seq = t.seq)",
    )
    assert orphans == [{"n": 0}]
    statuses = {(x["op"], x["status"]) for x in sql(run_dir, "SELECT DISTINCT op, status FROM ops")}
    unexpected = {s for s in statuses if s[1] != "ok" and s not in RAISED}
    assert not unexpected
    for pid, proc in _procs(run_dir).items():
        assert proc["errors"] == [] and proc["exit"]["status"] != "running", pid


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_threads_forks_and_toggles_record_everything_and_change_nothing(
    tmp_path: Path, core: str, mode: str
) -> None:
    env = {
        **_engine_env(core),
        "PPROBE_MODE": mode,
        "PPROBE_FLUSH_ROWS": "512",
        "PPROBE_FLUSH_SECONDS": "0.05",
    }
    plain = _stress(tmp_path, "plain", probe=False, toggle=False, env=env)
    probed = _stress(tmp_path, "probed", probe=True, toggle=False, env=env)
    toggled = _stress(tmp_path, "toggled", probe=False, toggle=True, env=env)

    lines = plain.out.splitlines()
    assert len(lines) == N_THREADS + 2
    assert lines[-2] == "children " + repr([0] * N_FORKS)
    assert lines[-1] == "warnings []"
    assert probed.out == plain.out
    assert toggled.out == plain.out
    for r in (probed, toggled):
        assert r.pprobe_lines() == []

    # The bootstrap run: one run folder, every thread, every status, every child.
    run_dir = probed.run_dir
    assert len(probed.runs) == 1
    _check_log(run_dir)
    _check_engine(run_dir, core)
    m = meta(run_dir)
    assert m["exit"]["status"] == "ok" and m["errors"] == []
    forks = _children(probed)
    parent = forks["parent"]
    threads = sql(
        run_dir,
        f"SELECT thread, count(*) AS n FROM ops WHERE pid = {parent} GROUP BY thread",
    )
    per_thread = {x["thread"]: x["n"] for x in threads}
    workers = {f"stress-{i}" for i in range(N_THREADS)}
    assert workers <= set(per_thread)
    assert all(per_thread[t] >= REQUIRED for t in workers), per_thread  # REQUIRED calls each
    statuses = {(x["op"], x["status"]) for x in ops(run_dir, f"pid = {parent}")}
    assert RAISED <= statuses
    assert shard_pids(run_dir) >= {parent, *forks["children"]}
    procs = _procs(run_dir)
    for k, child in enumerate(forks["children"]):
        # its own two calls, none of the rows its parent's threads had buffered at the fork
        rows = ops(run_dir, f"pid = {child}")
        assert [(x["op"], x["args"], x["thread"]) for x in rows] == [
            ("numpy.arange", "0=3", "MainThread"),
            ("numpy.add", f"1={k}", "MainThread"),
        ], child
        assert procs[child]["exit"] == {"status": "ok", "code": 0}
        assert procs[child]["rows_written"] == 2

    # The toggled run: one run folder per probe() block, each closed, with the threads'
    # calls of its time and the child forked inside it.
    runs = sorted(toggled.runs, key=lambda d: meta(d)["start"])
    forks = _children(toggled)
    assert len(runs) == (N_FORKS + 1) // 2
    for k, run in zip(range(0, N_FORKS, 2), runs):
        _check_log(run)
        _check_engine(run, core)
        m = meta(run)
        assert m["exit"]["status"] == "disabled" and m["errors"] == []
        names = {x["thread"] for x in sql(run, "SELECT DISTINCT thread FROM ops")}
        assert names & workers, names
        child = forks["children"][k]
        assert [(x["op"], x["args"]) for x in ops(run, f"pid = {child}")] == [
            ("numpy.arange", "0=3"),
            ("numpy.add", f"1={k}"),
        ]
    unprobed = {c for k, c in enumerate(forks["children"]) if k % 2}
    for run in runs:
        assert not (shard_pids(run) & unprobed)
