"""Run folders: one per run, `latest`, meta.json, and failures to write that never change the
program's result (unwritable output folder, full disk)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import signal
import socket
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import PYTHON, REPO, load_dump, meta, op_names, run, run_script, tensors, write

PROG = """
    import sys
    import numpy as np
    print(float(np.add(np.arange(4.0), float(sys.argv[1]) if len(sys.argv) > 1 else 0).sum()))
"""


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_each_run_has_its_own_folder_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    first = run_script(tmp_path, PROG, "1").check()
    (run1,) = first.runs
    before = _digest(run1)
    assert (tmp_path / "out" / "latest").resolve() == run1
    second = run_script(tmp_path, PROG, "2").check()
    runs = second.runs
    assert len(runs) == 2 and runs[0] == run1
    run2 = runs[1]
    assert _digest(run1) == before  # the first run is untouched
    assert (tmp_path / "out" / "latest").resolve() == run2
    assert (tmp_path / "out" / "LATEST").read_text().strip() == run2.name
    assert meta(run1)["argv"][1:] == ["1"] and meta(run2)["argv"][1:] == ["2"]


def test_runs_started_in_the_same_second_by_one_process_never_collide(tmp_path: Path) -> None:
    import pprobe

    out = tmp_path / "out"
    dirs = []
    for _ in range(3):
        dirs.append(pprobe.enable(mode="log", output=str(out)))
        np.add(np.ones(2), len(dirs))
        pprobe.disable()
    assert len(set(dirs)) == 3
    for d in dirs:
        assert meta(d)["run_id"] == Path(d).name
        assert op_names(d) == ["numpy.ones", "numpy.add"]
        assert meta(d)["exit"]["status"] == "disabled"
    assert (out / "latest").resolve() == Path(dirs[-1])


@pytest.mark.parametrize(
    "ending, status",
    [
        ("pass", {"status": "ok", "code": 0}),
        (
            "raise ValueError('boom')",
            {"status": "exception", "code": 1, "exception": "ValueError", "message": "boom"},
        ),
        ("sys.exit(5)", {"status": "exited", "code": 5, "message": None}),
        ("sys.exit('bye')", {"status": "exited", "code": 1, "message": "bye"}),
        ("os._exit(7)", {"status": "exited", "code": 7, "message": None}),
    ],
    ids=["ok", "exception", "exit5", "exit-message", "os_exit"],
)
def test_meta_json(tmp_path: Path, ending: str, status: dict) -> None:
    script = write(
        tmp_path / "prog.py",
        f"""
        import json, os, sys
        import numpy as np
        np.add(np.ones(3), 1)
        print(json.dumps({{"pid": os.getpid()}}), flush=True)
        {ending}
        """,
    )
    t0 = time.time()
    plain = run([PYTHON, str(script), "x", "--y"], tmp_path, probe=False)
    r = run([PYTHON, str(script), "x", "--y"], tmp_path, env={"PPROBE_MODE": "stats"})
    t1 = time.time()
    assert (r.rc, r.out.count("pid"), r.err) == (plain.rc, 1, plain.err)
    m = meta(r.run_dir)
    assert m["argv"] == [str(script), "x", "--y"]
    assert m["pid"] == json.loads(r.out)["pid"]
    assert m["host"] == socket.gethostname()
    assert m["versions"]["python"] == platform.python_version()
    assert m["versions"]["numpy"] == np.__version__
    import pprobe

    assert m["versions"]["pprobe"] == m["pprobe_version"] == pprobe.__version__
    assert m["config"]["mode"] == "stats" and m["config_sources"]["mode"] == "env PPROBE_MODE"
    assert m["config"]["output"] == str(tmp_path / "out")
    assert t0 <= m["start"] <= m["end"] <= t1
    assert m["exit"] == status
    assert m["coverage"]["frameworks"]["numpy"]["numpy"]["namespace_functions"] > 300
    assert m["errors"] == []


def test_unwritable_output_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "sub"
    script = write(tmp_path / "prog.py", textwrap.dedent(PROG) + "sys.exit(4)\n")
    plain = run([PYTHON, str(script), "3"], tmp_path, probe=False)
    assert plain.rc == 4
    for cmd, env in [
        ([PYTHON, str(script), "3"], {}),
        (
            [
                PYTHON,
                "-m",
                "pprobe",
                "run",
                "--output",
                str(target),
                "--",
                PYTHON,
                str(script),
                "3",
            ],
            {"PYTHONPATH": str(REPO)},
        ),
    ]:
        r = run(cmd, tmp_path, output=target, env=env)
        assert (r.rc, r.out) == (plain.rc, plain.out)
        lines = r.err.splitlines()
        assert len(lines) == 1, r.err
        assert lines[0].startswith("pprobe: ") and str(target) in lines[0]
        assert "without pprobe" in lines[0]
        assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("n", [200_000, 40_000])  # 1.6 MB dumps: files; 320 kB: packed
def test_full_disk_is_reported_once_and_the_program_is_unaffected(tmp_path: Path, n: int) -> None:
    limit = 1 << 20

    def small_files() -> None:  # in the child: files may not grow past `limit` bytes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    prog = f"""
        import numpy as np
        total = 0.0
        for i in range(20):
            total += float(np.add(np.full({n}, float(i)), 1.0).sum())   # big dumps
        for i in range(20000):
            total += float(np.add(np.ones(2), i)[0])                       # a growing log
        print(total)
    """
    plain = run_script(tmp_path, prog, probe=False).check()
    r = run_script(
        tmp_path,
        prog,
        env={"PPROBE_FLUSH_ROWS": "2000", "PPROBE_FLUSH_SECONDS": "0.05"},
        preexec_fn=small_files,
    )
    assert (r.rc, r.out) == (plain.rc, plain.out)
    lines = r.pprobe_lines()
    assert len(lines) == len(set(lines)) == 2, r.err
    assert any("writing dumps" in x for x in lines)
    assert any("writing the log" in x for x in lines)
    m = meta(r.run_dir)
    assert {e["where"] for e in m["errors"]} == {"writing dumps", "writing the log"}
    assert m["dumps"]["failed"] is True and m["dumps"]["failed_files"] >= 1
    # The dumps that could not be written say so; every dump a row points to is complete
    # (a packed dump's repeats are aliases of its entry: when the entry failed, they did).
    t = tensors(r.run_dir)
    assert t
    big = [x for x in t if x["shape"] == [n]]
    assert any(x["dump_path"] is None and "not dumped" in x["note"] for x in big)
    for x in t:
        if x["dump_path"]:
            assert load_dump(r.run_dir / x["dump_path"]).shape == tuple(x["shape"]), x
        elif x["shape"] == [n]:
            assert "not dumped" in x["note"], x
    if n * 8 > limit:  # no file of a big dump could be written
        assert all(x["dump_path"] is None for x in big)
    assert not [p for p in r.run_dir.rglob("*") if p.name.endswith(".tmp")]


def test_sys_exit_in_a_worker_thread_is_not_the_process_exit_code(tmp_path: Path) -> None:
    prog = """
        import sys, threading
        import numpy as np
        t = threading.Thread(target=sys.exit, args=(3,))
        t.start()
        t.join()
        np.add(np.ones(2), 1)
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"})
    assert r.check(0).pprobe_lines() == []
    assert meta(r.run_dir)["exit"] == {"status": "ok", "code": 0}


def test_status_tells_a_run_that_ended_from_one_whose_process_died(tmp_path: Path) -> None:
    import subprocess

    from helpers import BOOTSTRAP, clean_env

    from pprobe import runs

    ended = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check().run_dir
    st = runs.status(ended)
    assert (st.state, st.exit, st.pid) == ("ended", {"status": "ok", "code": 0}, meta(ended)["pid"])

    sleeper = "import time, numpy as np\nnp.ones(2)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    script = write(tmp_path / "sleeper.py", sleeper)
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "live"), PPROBE_MODE="log",
                    PYTHONPATH=str(BOOTSTRAP))  # fmt: skip
    p = subprocess.Popen([PYTHON, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    live = (tmp_path / "live" / "latest").resolve()
    try:
        assert runs.status(live).state == "running"
        p.kill()
        p.wait(30)
    finally:
        p.kill()
    st = runs.status(live)
    assert (st.state, st.exit, st.pid) == ("died", {"status": "running"}, p.pid)
    assert str(p.pid) in st.reason

    m = meta(live)
    m["host"] = "another-host"
    (live / "meta.json").write_text(json.dumps(m))
    assert runs.status(live).state == "unknown"
    assert runs.status(tmp_path).state == "unknown"  # no meta.json
    # A pid that is alive but started after the run is another process (the pid was reused).
    m.update(host=socket.gethostname(), pid=os.getpid(), start=time.time() - 3600 * 24 * 365)
    (live / "meta.json").write_text(json.dumps(m))
    assert runs.status(live).state == "died"
    assert runs.pid_alive(os.getpid()) and runs.pid_alive(os.getpid(), time.time())


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 1 MiB tmpfs at tmp_path/disk (root and mount(2) needed), unmounted afterwards."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int) -> None:
    import os

    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(disk / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(free - leave, 0))


def test_a_full_disk_at_start_leaves_nothing_and_says_no_space(small_disk: Path, tmp_path: Path):
    _fill(small_disk, 0)
    out = small_disk / "out"
    plain = run_script(tmp_path, PROG, probe=False).check()
    r = run_script(tmp_path, PROG, output=out)
    assert (r.rc, r.out) == (plain.rc, plain.out)
    (line,) = r.pprobe_lines()
    assert "No space left on device" in line and "runs without pprobe" in line
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no folder, no LATEST


def test_a_disk_that_fills_mid_run_still_gets_the_final_meta_json(small_disk: Path, tmp_path):
    _fill(small_disk, 320 << 10)  # room for the run's reserve, and a little log
    out = small_disk / "out"
    prog = """
        import numpy as np
        total = 0.0
        for i in range(30000):
            total += float(np.add(np.ones(2), i)[0])
        print(total)
    """
    plain = run_script(tmp_path, prog, probe=False).check()
    r = run_script(
        tmp_path, prog, output=out, env={"PPROBE_MODE": "log", "PPROBE_FLUSH_ROWS": "2000"}
    )
    assert (r.rc, r.out) == (plain.rc, plain.out)
    (line,) = r.pprobe_lines()
    assert "writing the log" in line and "No space left on device" in line
    m = meta(r.run_dir)
    assert m["exit"] == {"status": "ok", "code": 0}
    assert [e["where"] for e in m["errors"]] == ["writing the log"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name == ".reserve"]
    assert (out / "LATEST").read_text().strip() == r.run_dir.name
