"""Child processes on other interpreters: PYTHONPATH (the bootstrap) and PPROBE_RESOLVED reach
every child, whatever Python it runs. The bootstrap parses and runs on every Python; a child
that cannot run pprobe (Python < 3.10, pprobe's dependencies missing) starts silently
unprobed, and the run's meta.json lists it under ``skipped`` with the reason.

The other interpreters are pyenv's and the system's where this machine has them."""

from __future__ import annotations

import glob
import json
import subprocess
from pathlib import Path

import pytest
from helpers import BOOTSTRAP, PYTHON, meta, op_names, run, run_script

OTHERS = sorted(
    {
        p
        for p in glob.glob("/root/.pyenv/versions/*/bin/python")
        + glob.glob(str(Path.home() / ".pyenv/versions/*/bin/python"))
        + ["/usr/bin/python3", "/usr/bin/python2"]
        if Path(p).exists()
    }
)


def _version(python: str) -> tuple[int, int]:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    return int(out[0]), int(out[1])


PARENT = """
    import json, os, subprocess, sys
    import numpy as np
    np.add(np.ones(2), 1)
    p = subprocess.run([sys.argv[1], "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True)
    print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr}))
"""


@pytest.mark.parametrize("python", OTHERS or ["none"])
def test_a_child_on_another_python_runs_unprobed_silently_or_probed(
    tmp_path: Path, python: str
) -> None:
    if python == "none":
        pytest.skip("no other Python on this machine")
    r = run_script(tmp_path, PARENT, python, env={"PPROBE_MODE": "log"}).check()
    child = json.loads(r.out)
    # Not a word from pprobe, but where the child runs pprobe on the Python engine (the native
    # core is built for another interpreter): the engine's one line, as in any probed process.
    noise = [x for x in child["err"].splitlines() if "the Python engine records" not in x]
    assert child["rc"] == 0 and noise == [], child
    pid = int(child["out"])
    m = meta(r.run_dir)
    skipped = {s["pid"]: s for s in m["skipped"]}
    probed = {json.loads(p.read_text())["pid"] for p in (r.run_dir / "procs").glob("*.json")}
    assert (pid in skipped) != (pid in probed), (skipped, probed)
    if _version(python) < (3, 10):
        reason = skipped[pid]["reason"]
        assert "is not supported (pprobe needs Python 3.10 or newer)" in reason
        assert skipped[pid]["executable"] and skipped[pid]["ppid"] == m["pid"]
    assert op_names(r.run_dir) == ["numpy.ones", "numpy.add"]  # the parent's rows


def test_a_child_without_pprobes_dependencies_is_skipped(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # this Python, but a venv with no package at all
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(bare)], check=True)
    r = run_script(tmp_path, PARENT, str(bare / "bin" / "python"), env={"PPROBE_MODE": "log"})
    child = json.loads(r.check().out)
    assert child["rc"] == 0 and child["err"] == "", child
    (entry,) = meta(r.run_dir)["skipped"]
    assert entry["pid"] == int(child["out"])
    assert entry["reason"].startswith("wrapt, pyarrow cannot be imported by ")
    # Started by hand (no parent run), the same Python says so in one line.
    alone = run([str(bare / "bin" / "python"), "-c", "print('ok')"], tmp_path)
    assert alone.rc == 0 and alone.out == "ok\n"
    assert alone.err.splitlines() == [
        f"pprobe: wrapt, pyarrow cannot be imported by {bare / 'bin' / 'python'} "
        "(pprobe needs them); the program runs without pprobe."
    ]


@pytest.mark.parametrize("python", OTHERS or ["none"])
def test_the_bootstrap_parses_and_runs_on_every_python(tmp_path: Path, python: str) -> None:
    if python == "none":
        pytest.skip("no other Python on this machine")
    files = sorted(str(p) for p in BOOTSTRAP.glob("*.py"))
    src = "import sys\nfor f in sys.argv[1:]:\n    compile(open(f).read(), f, 'exec')\n"
    subprocess.run([python, "-c", src, *files], check=True, timeout=60)
    # Started by hand, outside any run: one line on Python 3 where pprobe cannot run,
    # nothing on Python 2; the program itself runs as without the bootstrap.
    r = run([python, "-c", "print('ok')"], tmp_path)
    assert r.rc == 0 and r.out == "ok\n", r.err
    major, minor = _version(python)
    if major == 2:
        assert r.err == ""
    elif (major, minor) < (3, 10):
        assert r.err == (
            f"pprobe: Python {major}.{minor} is not supported (pprobe needs Python 3.10 or "
            "newer); the program runs without pprobe.\n"
        )
    else:
        assert len(r.err.splitlines()) <= 2, r.err  # a missing dependency, the engine's line


# ---------------------------------------------------------------------------------------------
# NumPy versions: the dispatcher type is named, never inferred from type(np.sum).
def test_the_dispatcher_type_is_numpys_named_class() -> None:
    import types

    import numpy as np

    from pprobe.interceptors import numpy_namespace as nn

    tp = nn.find_dispatcher_type()
    assert tp is not None and tp.__name__ == "_ArrayFunctionDispatcher"
    assert type(np.sum) is tp and type(np.concatenate) is tp
    # Before NumPy 1.25 np.sum was a Python function and no such class existed: nothing may be
    # taken for a dispatcher then (patching `function` would catch every Python function).
    old = types.ModuleType("numpy")
    old.core = types.SimpleNamespace(_multiarray_umath=types.SimpleNamespace())  # type: ignore[attr-defined]
    old.sum = lambda a: a  # type: ignore[attr-defined]
    assert nn.find_dispatcher_type(old) is None
    # NumPy 1.25-1.26 keep it in numpy.core._multiarray_umath.
    old.core._multiarray_umath._ArrayFunctionDispatcher = tp  # type: ignore[attr-defined]
    assert nn.find_dispatcher_type(old) is tp
    assert nn._classify(lambda a: a) is None
