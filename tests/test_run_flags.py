"""``pprobe run``'s flags: one per setting, checked before the program starts (exit 2, one
line, the program never runs); ``pprobe query --help`` shows an example; a query over a run
with no rows says so."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, REPO, meta, run, run_script, sql

from pprobe import config, runflags, textout


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
    p = pprobe(tmp_path, "query", "SELECT * FROM ops", "--run", str(r.runs[-1]))
    assert p.returncode == 0
    assert p.stderr.strip().startswith("pprobe query: the run ")
    assert "recorded no ops" in p.stderr
    # a query that returns no rows from a run that has some says nothing more
    r2 = run_script(tmp_path, "import numpy as np\nnp.add(np.ones(2), 1)\n").check()
    p2 = pprobe(tmp_path, "query", "SELECT * FROM ops WHERE false", "--run", str(r2.run_dir))
    assert p2.returncode == 0 and p2.stderr == ""


# ------------------------------------------------------------------- the end of a run
def test_end_of_run_line_and_an_empty_run_leaves_latest_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    real = run_script(
        tmp_path,
        "import numpy as np\nfor i in range(5): np.add(np.ones(3), i)\n",
        env={"PPROBE_SUMMARY_LINE": "on"},
    ).check()
    first = real.run_dir
    m = meta(first)
    said = [line for line in real.err.splitlines() if line.startswith("pprobe:")]
    n = sql(first, "SELECT count(*) AS n FROM ops")[0]["n"]
    d = m["dumps"]
    want = (
        f"pprobe: run {first}: {n} ops, {d['files'] + d['links']} dumps "
        f"({textout.fmt_bytes(d['bytes_written'])}), 0 errors in pprobe (pprobe summary {first})"
    )
    assert said == [want]

    empty = run_script(
        tmp_path, "print('hello')\n", name="empty.py", env={"PPROBE_SUMMARY_LINE": "on"}
    )
    empty.check()
    assert (out / "LATEST").read_text().strip() == first.name
    assert os.readlink(out / "latest") == first.name
    folders = empty.runs
    assert len(folders) == 2  # the empty run keeps its folder (pprobe ls lists it)
    assert empty.err.strip().splitlines()[-1] == (
        f"pprobe: run {folders[1]} recorded no ops (the program called no NumPy or torch op, "
        f"or filters left none); `latest` still names {first.name}"
    )
    # piped stderr, the default (auto): no line
    quiet = run_script(tmp_path, "import numpy as np\nnp.ones(2)\n", name="q.py").check()
    assert not [x for x in quiet.err.splitlines() if x.startswith("pprobe:")]
    assert (out / "LATEST").read_text().strip() == quiet.runs[-1].name
    off = run_script(
        tmp_path, "import numpy as np\nnp.ones(2)\n", env={"PPROBE_SUMMARY_LINE": "off"}
    )
    assert off.check().pprobe_lines() == []


def test_a_first_empty_run_makes_no_latest(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print(1)\n").check()
    assert len(r.runs) == 1
    assert not (r.output / "LATEST").exists() and not (r.output / "latest").exists()
