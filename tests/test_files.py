"""Where pprobe writes (pprobe/safefs.py): never through a symlink, exclusive creation, atomic
pointers, private permissions, a shared output folder refused; ``latest`` and ``LATEST``
always agree."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest
from helpers import meta, op_names, run_script

PROG = """
    import numpy as np
    np.add(np.ones(3), 1)
"""


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_symlink_planted_at_a_pointer_is_replaced_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "LATEST").symlink_to(victim)
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check()
    assert victim.read_text() == "precious\n"
    assert not (out / "LATEST").is_symlink()
    assert (out / "LATEST").read_text() == r.run_dir.name + "\n"
    assert os.readlink(out / "latest") == r.run_dir.name


def test_a_symlink_at_a_shard_name_is_refused_not_followed(tmp_path: Path) -> None:
    """The shard's name is predictable: the file is created with O_EXCL|O_NOFOLLOW."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    r = run_script(
        tmp_path,
        f"""
        import os, socket, pprobe
        import numpy as np
        log = os.path.join(pprobe.active_run_dir(), "log")
        os.mkdir(log)
        shard = f"ops-{{socket.gethostname()}}-{{os.getpid()}}.arrows"
        os.symlink({str(victim)!r}, os.path.join(log, shard))
        np.add(np.ones(3), 1)
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert victim.read_text() == "precious\n"
    assert any("writing the log" in x and "File exists" in x for x in r.pprobe_lines()), r.err


def test_a_symlink_at_meta_jsons_temporary_name_is_not_followed(tmp_path: Path) -> None:
    import numpy as np

    import pprobe

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    d = Path(pprobe.enable(mode="log", output=str(tmp_path / "out")))
    for name in (f"meta.json.{os.getpid()}.tmp", f".meta.json.{os.getpid()}.tmp"):
        (d / name).symlink_to(victim)
    np.add(np.ones(2), 1)
    pprobe.disable()
    assert victim.read_text() == "precious\n"
    assert meta(d)["exit"]["status"] == "disabled"


def test_a_run_folder_swapped_for_a_symlink_mid_run_redirects_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_script(
        tmp_path,
        f"""
        import os, pprobe
        import numpy as np
        np.add(np.ones(3), 1)
        d = pprobe.active_run_dir()
        os.rename(d, d + "-moved")
        os.symlink({str(elsewhere)!r}, d)
        np.add(np.ones(3), 2)
        """,
        env={"PPROBE_MODE": "log", "PPROBE_FLUSH_SECONDS": "600"},
    ).check()
    assert list(elsewhere.iterdir()) == []
    moved = next(p for p in (tmp_path / "out").iterdir() if p.name.endswith("-moved"))
    assert op_names(moved) == ["numpy.ones", "numpy.add", "numpy.ones", "numpy.add"]
    assert meta(moved)["exit"]["status"] == "ok"


def test_run_folders_are_private_unless_widened(tmp_path: Path) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log", "PPROBE_PERMISSIONS": None})
    d = r.check().run_dir
    assert _mode(d) == _mode(d / "log") == _mode(d / "procs") == 0o700
    files = [d / "meta.json", *(d / "log").glob("*.arrows"), *(d / "procs").glob("*.json")]
    shards = sorted(p.name.split("-")[0] for p in (d / "log").glob("*.arrows"))
    assert shards == ["ops", "stacks", "tensors"]  # and meta.json, procs/<host>-<pid>.json
    assert len(files) == 5 and {_mode(p) for p in files} == {0o600}
    assert _mode(tmp_path / "out" / "LATEST") == 0o600
    wide = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log", "PPROBE_PERMISSIONS": "group"})
    d = wide.check().run_dir
    assert _mode(d) == _mode(d / "log") == 0o750
    assert {_mode(p) for p in [d / "meta.json", *(d / "log").glob("*")]} == {0o640}
    assert meta(d)["config"]["permissions"] == "group"
    bad = run_script(tmp_path, PROG, env={"PPROBE_PERMISSIONS": "everyone"}).check()
    assert bad.pprobe_lines() == [
        "pprobe: configuration error: PPROBE_PERMISSIONS='everyone' is not valid; allowed: "
        "private, group, public. The program runs without pprobe (PPROBE_STRICT=1 or "
        "strict = true makes this fatal)."
    ]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_an_output_folder_another_user_owns_and_others_can_write_is_refused(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 4321, 4321)
    shared.chmod(0o777)
    r = run_script(tmp_path, PROG, output=shared).check()
    (line,) = r.pprobe_lines()
    assert line.startswith(f"pprobe: cannot write the run folder under '{shared}'")
    assert "owned by another user (uid 4321) and writable by others" in line
    assert line.endswith("The program runs without pprobe.")
    assert list(shared.iterdir()) == []


def test_which_output_folders_are_refused() -> None:
    from pprobe.safefs import UnsafeFolder, check_base

    me = os.getuid()
    other = me + 1000 or 1

    def st(uid: int, mode: int) -> os.stat_result:
        return os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))

    for uid, mode in [(me, 0o777), (other, 0o755), (0, 0o1777), (me, 0o1777)]:
        check_base(st(uid, mode), "/x")
    for uid, mode in [(other, 0o777), (other, 0o775), (other, 0o1777), (0, 0o777)]:
        if (uid, me) == (0, 0):
            continue  # root's own folder
        with pytest.raises(UnsafeFolder, match="owned by another user"):
            check_base(st(uid, mode), "/x")


def test_a_latest_that_is_a_real_folder_is_said_once_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "latest").mkdir(parents=True)
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log"}).check()
    (line,) = r.pprobe_lines()
    assert "latest is not a symlink" in line and "LATEST names it" in line
    (run,) = [p for p in out.iterdir() if p.is_dir() and p.name != "latest"]
    assert (out / "LATEST").read_text() == run.name + "\n"
    assert sorted(p.name for p in out.iterdir()) == sorted(["LATEST", "latest", run.name])
    assert list((out / "latest").iterdir()) == []
    from pprobe.run import resolve_run_dir

    assert resolve_run_dir(str(out)) == str(run)
    assert any("latest is not a symlink" in w for w in meta(run)["warnings"])


def _start_runs(out: str, n: int, go: object) -> None:
    import random
    import time

    from pprobe.config import Config
    from pprobe.run import Run

    real = os.replace

    def slow_replace(*a: object, **k: object) -> None:  # widen the window between the two
        real(*a, **k)  # type: ignore[arg-type]
        time.sleep(random.random() * 0.02)

    os.replace = slow_replace  # type: ignore[assignment]  # this child process only
    go.wait()  # type: ignore[attr-defined]
    for _ in range(n):
        Run.create_or_join(Config(mode="log", output=out))
        os.environ.pop("PPROBE_RESOLVED", None)


def test_latest_and_LATEST_agree_after_runs_start_at_the_same_moment(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ctx = multiprocessing.get_context("fork")
    for attempt in range(4):
        go = ctx.Barrier(6)
        procs = [ctx.Process(target=_start_runs, args=(str(out), 1, go)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert os.readlink(out / "latest") == (out / "LATEST").read_text().strip(), attempt
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    assert (out / os.readlink(out / "latest")).is_dir()


def test_on_enospc_the_reserve_is_given_back_to_write_meta_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full-disk path without a small disk (tests/test_runs.py mounts one where it can)."""
    import errno

    import numpy as np

    import pprobe
    from pprobe import safefs

    d = Path(pprobe.enable(mode="log", output=str(tmp_path / "out")))
    assert (d / ".reserve").stat().st_size == 256 << 10
    real = safefs.RunDir.replace_atomic

    def replace_atomic(self: safefs.RunDir, name: str, data: bytes) -> None:
        if (d / ".reserve").exists():  # the disk is full until the reserve is given back
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, data)

    monkeypatch.setattr(safefs.RunDir, "replace_atomic", replace_atomic)
    np.add(np.ones(2), 1)
    pprobe.disable()
    assert meta(d)["exit"]["status"] == "disabled" and meta(d)["errors"] == []
    assert not (d / ".reserve").exists()
