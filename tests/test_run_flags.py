"""``pprobe run``'s flags: one per setting, checked before the program starts (exit 2, one
line, the program never runs); ``pprobe query --help`` shows an example; a query over a run
with no rows says so."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, REPO, meta, run, run_script

from pprobe import config, runflags


def pprobe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pprobe", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
            "PPROBE_OUTPUT": str(tmp_path / "out"),
        },
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--mode", "wrong"),
        ("--budget", "12zz"),
        ("--torch-levels", "api,nope"),
        ("--every", "0"),
        ("--steps", "3-1"),
        ("--flush-seconds", "0"),
        ("--core", "fast"),
        ("--permissions", "everyone"),
        ("--config", "no-such.toml"),
    ],
)
def test_a_bad_flag_exits_2_with_one_line_before_the_program_runs(
    tmp_path: Path, flag: str, value: str
) -> None:
    marker = tmp_path / "ran"
    p = pprobe(tmp_path, "run", flag, value, "--", PYTHON, "-c", f"open({str(marker)!r}, 'w')")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pprobe run: {flag}")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_every_setting_is_a_flag_and_help_lists_allowed_values(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    runflags.add_run_options(p)
    flags = {a.dest: a for a in p._actions}
    for s in config.SETTINGS:
        if s.field == "enabled":
            continue
        assert s.field in flags, s.field
        assert s.env in (flags[s.field].help or "")
    for field, allowed in runflags.ALLOWED.items():
        assert all(v in (flags[field].help or "") for v in allowed)
    h = pprobe(tmp_path, "run", "--help").stdout
    assert "--mode {log,stats,dump}" in h and "--core {auto,native,python}" in h


def test_flags_reach_the_program_as_settings(tmp_path: Path) -> None:
    r = run(
        [
            PYTHON,
            "-m",
            "pprobe",
            "run",
            "--mode",
            "stats",
            "--every",
            "2",
            "--nested",
            "--budget",
            "2MiB",
            "--",
            PYTHON,
            "-c",
            "import numpy as np\nfor i in range(4): np.add(np.ones(2), i)",
        ],
        tmp_path,
        probe=False,
        env={"PYTHONPATH": str(REPO)},
    ).check()
    cfg = meta(r.run_dir)["config"]
    assert (cfg["mode"], cfg["every"], cfg["nested"], cfg["budget"]) == ("stats", 2, True, 2 << 20)


def test_query_help_shows_an_example(tmp_path: Path) -> None:
    h = pprobe(tmp_path, "query", "--help").stdout
    assert 'example:\n  pprobe query "SELECT op, count(*)' in h


def test_query_says_when_a_run_has_no_rows(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print('no numpy here')\n").check()
    p = pprobe(tmp_path, "query", "SELECT * FROM ops", "--run", str(r.output))
    assert p.returncode == 0
    assert p.stderr.strip().startswith("pprobe query: the run ")
    assert "recorded no ops" in p.stderr
    # a query that returns no rows from a run that has some says nothing more
    r2 = run_script(tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n").check()
    p2 = pprobe(tmp_path, "query", "SELECT * FROM ops WHERE false", "--run", str(r2.run_dir))
    assert p2.returncode == 0 and p2.stderr == ""
