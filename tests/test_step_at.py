"""PPROBE_STEP_AT: zero-code steps for NumPy loops (a line or a function marks each step).

Before it, every row of a NumPy program was step 0: the README's "first NaN" recipe said step
0 and ``PPROBE_STEPS=37`` recorded nothing. The loop below makes its first NaN at iteration
``BAD`` and writes, itself, how many of each op it ran per iteration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import run_script, sql, write

from pprobe import config, stepat

BAD = 37
ITERS = 45

#: The loop body lives in a module (for the function form); the script's line 9 is the
#: loop's body line (for the line form).
LOOPMOD = """
import numpy as np

def train_step(i, w):
    g = np.sqrt(w - (2.0 if i == BAD else 0.0))  # NaN born here at iteration BAD
    return np.add(w, np.multiply(g, 0.0))
""".replace("BAD", str(BAD))

PROG = """
import json
import numpy as np
import loopmod

w = np.ones(3)
counts = []
for i in range(ITERS):
    w = loopmod.train_step(i, w)
    counts.append(3)
json.dump({"iters": len(counts)}, open("truth.json", "w"))
""".replace("ITERS", str(ITERS))
LINE = 9  # `w = loopmod.train_step(i, w)`


def _run(tmp_path: Path, step_at: str | None, **env: str) -> Any:
    write(tmp_path / "loopmod.py", LOOPMOD)
    assert PROG.splitlines()[LINE - 1].strip().startswith("w = loopmod.train_step")
    e = {"PPROBE_MODE": "stats", **env}
    if step_at is not None:
        e["PPROBE_STEP_AT"] = step_at
    return run_script(tmp_path, PROG, env=e).check()


def test_without_step_at_every_row_is_step_0(tmp_path: Path) -> None:
    r = _run(tmp_path, None)
    assert sql(r.run_dir, "SELECT DISTINCT step FROM ops") == [{"step": 0}]


@pytest.mark.parametrize("form", ["line", "function"])
def test_first_nan_reports_its_step(tmp_path: Path, form: str) -> None:
    import pprobe

    spec = f"prog.py:{LINE}" if form == "line" else "loopmod:train_step"
    r = _run(tmp_path, spec)
    iters = json.loads((tmp_path / "truth.json").read_text())["iters"]
    per_step = sql(
        r.run_dir,
        "SELECT step, count(*) AS n FROM ops WHERE op != 'numpy.ones' GROUP BY step ORDER BY step",
    )
    # each iteration ran -, sqrt, multiply, add (np.ones ran before the loop, in step 0)
    assert [x["step"] for x in per_step] == list(range(iters))
    assert {x["n"] for x in per_step} == {4}
    first = pprobe.nan_origins(str(r.run_dir))["first"]
    assert first["op"] == "numpy.sqrt" and first["step"] == BAD


def test_steps_window_records_that_step(tmp_path: Path) -> None:
    r = _run(tmp_path, f"prog.py:{LINE}", PPROBE_STEPS=str(BAD))
    rows = sql(r.run_dir, "SELECT step, op FROM ops ORDER BY seq")
    assert rows and {x["step"] for x in rows} == {BAD}
    assert [x["op"] for x in rows][:2] == ["numpy.ndarray.__sub__", "numpy.sqrt"]


def test_step_at_drives_lifecycle_hooks(tmp_path: Path) -> None:
    write(
        tmp_path / "seenhook.py",
        """
        from pprobe.hooks import BaseHook, HookRegistry

        @HookRegistry.register("Seen")
        class Seen(BaseHook):
            def before_training(self):
                open("seen.txt", "a").write("T\\n")
            def before_step(self, step):
                open("seen.txt", "a").write(f"b{step}\\n")
            def after_step(self, step):
                open("seen.txt", "a").write(f"a{step}\\n")
        """,
    )
    write(tmp_path / "pprobe.toml", 'hook_modules = ["seenhook"]\n[[hooks]]\ntype = "Seen"\n')
    _run(tmp_path, "loopmod:train_step", PPROBE_MODE="log")
    seen = (tmp_path / "seen.txt").read_text().split()
    want = ["T"] + [x for i in range(ITERS) for x in (f"b{i}", f"a{i}")]
    assert seen == want


def test_manual_step_and_epoch_with_hooks(tmp_path: Path) -> None:
    write(
        tmp_path / "seenhook.py",
        """
        from pprobe.hooks import BaseHook, HookRegistry

        @HookRegistry.register("Seen")
        class Seen(BaseHook):
            def before_epoch(self, epoch):
                open("seen.txt", "a").write(f"E{epoch}\\n")
            def after_epoch(self, epoch):
                open("seen.txt", "a").write(f"e{epoch}\\n")
            def after_step(self, step):
                open("seen.txt", "a").write(f"a{step}\\n")
        """,
    )
    write(tmp_path / "pprobe.toml", 'hook_modules = ["seenhook"]\n[[hooks]]\ntype = "Seen"\n')
    prog = """
    import numpy as np, pprobe
    for e in range(2):
        pprobe.epoch()
        for i in range(3):
            np.add(1, i)
            pprobe.step()
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    seen = (tmp_path / "seen.txt").read_text().split()
    assert seen == ["E0", "a0", "a1", "a2", "e0", "E1", "a3", "a4", "a5", "e1"]
    steps = [x["step"] for x in sql(r.run_dir, "SELECT step FROM ops ORDER BY seq")]
    assert steps == list(range(6))


# ---------------------------------------------------------------------------------------------
# in-process
def test_parse_step_at() -> None:
    assert config.parse_step_at("X", "a.b:f, x/y.py:12") == ("a.b:f", "x/y.py:12")
    for bad in ("nofunc", "f.py:0", "a.b:", "a b:c"):
        with pytest.raises(config.ConfigError, match="X=.*allowed: comma-separated"):
            config.parse_step_at("X", bad)


def test_file_matching() -> None:
    here = str(Path(__file__).resolve())
    assert stepat._file_matches(here, "tests/test_step_at.py") or stepat._file_matches(
        here, "test_step_at.py"
    )
    assert stepat._file_matches(here, here)
    assert not stepat._file_matches(here, "est_step_at.py")
    assert not stepat._file_matches("<stdin>", "stdin")
