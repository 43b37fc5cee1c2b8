"""Shared fixtures: a clean environment for every test, one venv per session."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
for _p in (str(REPO), str(TESTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from helpers import PYTHON  # noqa: E402


@pytest.fixture(autouse=True)
def clean_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts without inherited PPROBE_* variables (but PPROBE_CORE) and leaves env and
    sys.path as found.

    In-process tests that call pprobe.enable() are stopped here even when they fail, so no
    patched numpy leaks into the next test.
    """
    saved_env = dict(os.environ)
    saved_path = list(sys.path)
    for k in list(os.environ):
        # PPROBE_CORE picks the engine the whole test session runs (run_tests.sh runs the
        # suite once per engine): kept, so subprocesses run the same engine.
        if k == "PPROBE_CORE":
            continue
        if k == "PPROBE" or k.startswith("PPROBE_") or k in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(k)
    try:
        yield
    finally:
        if "pprobe.session" in sys.modules:
            from pprobe.session import Session

            if Session.active is not None:
                Session.active.stop()
        if "pprobe._report" in sys.modules:
            sys.modules["pprobe._report"].reset()
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path


def make_venv(path: Path, system_site: bool = False) -> Path:
    """A venv without pip (fast). Without system site packages, a ``00-system.pth`` makes this
    interpreter's site-packages (numpy, wrapt, pyarrow, duckdb) importable while the venv keeps
    ``site.ENABLE_USER_SITE = False``: usercustomize never runs there."""
    cmd = [PYTHON, "-m", "venv", "--without-pip"]
    if system_site:
        cmd.append("--system-site-packages")
    subprocess.run([*cmd, str(path)], check=True, capture_output=True)
    py = path / "bin" / "python"
    if not system_site:
        purelib = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # Sorted before pprobe-auto.pth: site runs .pth files in name order.
        # Every site folder this interpreter sees (its own, and its base's when it is itself a
        # venv with system site packages, as in an isolated CI run).
        dirs = [sysconfig.get_paths()["purelib"]] + [
            p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))
        ]
        Path(purelib, "00-system.pth").write_text("\n".join(dict.fromkeys(dirs)) + "\n")
    return py


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared venv (no user site); tests must not change it (the .pth test makes its own)."""
    return make_venv(tmp_path_factory.mktemp("venv") / "venv")


@pytest.fixture
def hook_state() -> Iterator[None]:
    """In-process hook tests: no hook, no claim, no unwritten python-table row, no once-only
    warning left from an earlier test, before and after (each hook's cleanup is run)."""
    from pprobe import _report
    from pprobe import hooks as ph
    from pprobe.ext import tables
    from pprobe.hooks import dispatch

    def reset() -> None:
        dispatch._reset()
        tables.clear_rows()
        _report.reset()

    reset()
    yield
    for h in ph.hooks():
        if hasattr(h, "cleanup"):
            h.cleanup()
    reset()
