"""A regression test on a program's numerics: `pprobe compare golden/ latest --fail-on fail`.

    python -m pytest examples/test_compare_golden.py

The first test records a golden run of examples/precision_mlp.py (in your project: a run kept
in the repository, or made from the last release), runs the program again under the probe and
fails when any op leaves its dtype's tolerance (exit status 1 of pprobe compare). The second
shows the same check catching a change of precision.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BOOTSTRAP = HERE.parent / "bootstrap"
PROGRAM = HERE / "precision_mlp.py"


def probe_run(out: Path, **env: str) -> None:
    """Run the program under the probe; its run lands in ``out`` (``out/latest``)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
    e.update(PYTHONPATH=str(BOOTSTRAP), PPROBE_OUTPUT=str(out), **env)
    subprocess.run([sys.executable, str(PROGRAM)], env=e, check=True, capture_output=True)


def pprobe_compare(golden: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")}
    e["PPROBE_OUTPUT"] = str(out)
    cmd = [sys.executable, "-m", "pprobe", "compare", str(golden), "latest", *args]
    return subprocess.run(cmd, env=e, capture_output=True, text=True)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    probe_run(out, PRECISION="float64", STABLE="1")
    return (out / "latest").resolve()


def test_same_numerics_as_golden(golden: Path, tmp_path: Path) -> None:
    probe_run(tmp_path, PRECISION="float64", STABLE="1")
    r = pprobe_compare(golden, tmp_path, "--fail-on", "fail")
    assert r.returncode == 0, r.stdout + r.stderr


def test_precision_change_is_caught(golden: Path, tmp_path: Path) -> None:
    probe_run(tmp_path, PRECISION="float32")  # float32, and the naive softmax
    r = pprobe_compare(golden, tmp_path, "--fail-on", "fail")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "First divergence" in r.stdout
