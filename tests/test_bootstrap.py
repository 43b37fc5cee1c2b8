"""Start-up for real: PYTHONPATH=bootstrap, pprobe run, venvs, a user's own sitecustomize,
the site-packages .pth, pprobe.auto, the kill switch and programs that are never probed."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import make_venv
from helpers import BOOTSTRAP, PYTHON, REPO, meta, npy_files, op_names, run, run_script, write

NUMPY_PROG = """
    import numpy as np
    a = np.arange(4.0)
    print(float(np.add(a, 1)[-1]))
"""


def test_source_tree_bootstrap_without_install(tmp_path: Path, venv_python: Path) -> None:
    # A venv that sees numpy & co. but not pprobe: an editable install (as CI and
    # run_tests.sh make) lives in a .pth that this venv does not process.
    r = run(
        [str(venv_python), "-c", "import importlib.util as u; print(u.find_spec('pprobe'))"],
        tmp_path,
        probe=False,
    ).check()
    if r.out.strip() != "None":  # a regular install in site-packages wins, by design
        pytest.skip(f"pprobe is installed ({r.out.strip()}): this test needs it uninstalled")

    r = run_script(
        tmp_path,
        python=str(venv_python),
        source="""
        import sys
        import numpy as np
        np.add(np.ones(3), 1)
        print(sys.modules["pprobe"].__file__)
        print(sys.modules["pprobe"].active_run_dir())
        """,
    ).check()
    pprobe_file, run_dir = r.out.split()
    assert Path(pprobe_file) == REPO / "pprobe" / "__init__.py"
    assert Path(run_dir) == r.run_dir
    assert op_names(r.run_dir) == ["numpy.ones", "numpy.add"]
    assert r.pprobe_lines() == []


def test_pprobe_run_passes_exit_code_stdio_and_argv(tmp_path: Path) -> None:
    script = write(
        tmp_path / "prog.py",
        """
        import json, sys
        import numpy as np
        np.multiply(np.ones(2), 3)
        print(json.dumps(sys.argv[1:]))
        print("stdin:", sys.stdin.read())
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    args = ["a b", "--flag", "-x", "--", "ü"]
    plain = run([PYTHON, str(script), *args], tmp_path, probe=False, input="data\n")
    probed = run(
        [PYTHON, "-m", "pprobe", "run", "--", PYTHON, str(script), *args],
        tmp_path,
        probe=False,
        env={"PYTHONPATH": str(REPO)},
        input="data\n",
    )
    assert plain.rc == 3
    assert (probed.rc, probed.out, probed.err) == (plain.rc, plain.out, plain.err)
    assert json.loads(probed.out.splitlines()[0]) == args
    # Exactly one run: the program's, not pprobe's own command line.
    assert len(probed.runs) == 1
    m = meta(probed.run_dir)
    assert m["argv"] == [str(script), *args]
    assert m["exit"]["status"] == "exited" and m["exit"]["code"] == 3
    assert op_names(probed.run_dir) == ["numpy.ones", "numpy.multiply"]


def test_pprobe_run_options_become_settings(tmp_path: Path) -> None:
    script = write(tmp_path / "prog.py", NUMPY_PROG)
    r = run(
        [
            PYTHON,
            "-m",
            "pprobe",
            "run",
            "--mode",
            "log",
            "--include",
            "*add",
            "--",
            PYTHON,
            str(script),
        ],
        tmp_path,
        probe=False,
        env={"PYTHONPATH": str(REPO)},
    ).check()
    assert meta(r.run_dir)["config"]["mode"] == "log"
    assert op_names(r.run_dir) == ["numpy.add"]
    assert not npy_files(r.run_dir)  # no dump file, no pack entry


def test_venv_sitecustomize_alone_starts_the_probe(tmp_path: Path, venv_python: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import json, site, sys
        import numpy as np
        np.subtract(np.ones(2), 1)
        print(json.dumps([site.ENABLE_USER_SITE, "usercustomize" in sys.modules,
                          sys.prefix != sys.base_prefix]))
        """,
        python=str(venv_python),
    ).check()
    # Inside the venv: no user site, so only our sitecustomize can have started the probe.
    assert json.loads(r.out) == [False, False, True]
    assert op_names(r.run_dir) == ["numpy.ones", "numpy.subtract"]
    procs = [json.loads(p.read_text()) for p in (r.run_dir / "procs").glob("*.json")]
    assert [p["executable"] for p in procs] == [str(venv_python)]


def test_pprobe_run_with_venv_python(tmp_path: Path, venv_python: Path) -> None:
    script = write(tmp_path / "prog.py", NUMPY_PROG)
    r = run(
        [PYTHON, "-m", "pprobe", "run", "--", str(venv_python), str(script)],
        tmp_path,
        probe=False,
        env={"PYTHONPATH": str(REPO)},
    ).check()
    assert op_names(r.run_dir) == ["numpy.arange", "numpy.add"]


@pytest.mark.parametrize("name", ["sitecustomize", "usercustomize"])
def test_users_own_customize_module_still_runs(tmp_path: Path, name: str) -> None:
    import site

    if name == "usercustomize" and not site.ENABLE_USER_SITE:
        pytest.skip("this interpreter has no user site (a venv?): usercustomize never runs")
    user = write(
        tmp_path / "usr" / f"{name}.py",
        f"""
        import builtins
        builtins.USER_{name.upper()} = __file__
        print("user {name} ran")
        """,
    )
    r = run_script(
        tmp_path,
        f"""
        import builtins, sys
        import numpy as np
        np.add(np.ones(1), 1)
        print(builtins.USER_{name.upper()})
        print(sys.modules["{name}"].__file__)
        """,
        env={"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(user.parent)])},
    ).check()
    lines = r.out.splitlines()
    assert lines[0] == f"user {name} ran"
    assert lines[1] == lines[2] == str(user)
    assert op_names(r.run_dir) == ["numpy.ones", "numpy.add"]


@pytest.mark.parametrize(
    "body",
    [
        "import no_such_module_pprobe_test",
        "raise ImportError('broken inside the user module')",
        "from os import no_such_name",
        "raise RuntimeError('user sitecustomize failed')",
    ],
)
def test_errors_inside_users_sitecustomize_are_not_swallowed(tmp_path: Path, body: str) -> None:
    usr = tmp_path / "usr"
    write(usr / "sitecustomize.py", f"print('before')\n{body}\n")
    script = write(tmp_path / "prog.py", NUMPY_PROG)
    plain = run([PYTHON, str(script)], tmp_path, probe=False, env={"PYTHONPATH": str(usr)})
    probed = run(
        [PYTHON, str(script)],
        tmp_path,
        env={"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(usr)])},
    )
    assert "Error in sitecustomize" in plain.err
    assert (probed.rc, probed.out, probed.err) == (plain.rc, plain.out, plain.err)
    assert op_names(probed.run_dir) == ["numpy.arange", "numpy.add"]


def _host_pth() -> tuple[bool, float | None]:
    p = Path(sysconfig.get_paths()["purelib"]) / "pprobe-auto.pth"
    return p.exists(), p.stat().st_mtime if p.exists() else None


def test_site_pth_install_dormant_active_kill_switch_uninstall(tmp_path: Path) -> None:
    host_before = _host_pth()
    py = make_venv(tmp_path / "venv")
    cli = {"PYTHONPATH": str(REPO), "PPROBE": None}
    r = run([str(py), "-m", "pprobe", "install", "--site"], tmp_path, probe=False, env=cli)
    r.check()
    purelib = run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        tmp_path,
        probe=False,
    ).out.strip()
    pth = Path(purelib) / "pprobe-auto.pth"
    assert pth.is_file() and str(pth) in r.out
    assert _host_pth() == host_before  # the real site-packages is untouched

    script = write(
        tmp_path / "prog.py",
        """
        import sys
        print(sorted(m for m in ("pprobe", "numpy", "torch") if m in sys.modules))
        import numpy as np
        print(float(np.add(np.ones(2), 1)[-1]))
        """,
    )
    plain = run([PYTHON, str(script)], tmp_path, probe=False).check()

    # Dormant: no PPROBE=1, so not even pprobe is imported and no run folder is made.
    dormant = run([str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o1").check()
    assert dormant.out == plain.out
    assert not dormant.output.exists()
    assert dormant.err == ""

    active = run(
        [str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o2", env={"PPROBE": "1"}
    ).check()
    assert active.out.splitlines()[0] == "['pprobe']"  # start-up imports neither numpy nor torch
    assert active.out.splitlines()[1] == plain.out.splitlines()[1]
    assert op_names(active.run_dir) == ["numpy.ones", "numpy.add"]

    killed = run(
        [str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o3", env={"PPROBE": "0"}
    ).check()
    assert not killed.output.exists() and killed.out == plain.out
    blank = run(
        [str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o5", env={"PPROBE": " "}
    ).check()
    assert not blank.output.exists() and blank.out == plain.out

    # With PPROBE unset, a config file asks for the probe (``enabled = true``): ./pprobe.toml,
    # or PPROBE_CONFIG's.
    cfg = write(tmp_path / "cfg" / "pprobe.toml", 'enabled = true\nmode = "log"\n')
    by_file = run(
        [str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o6", cwd=cfg.parent
    ).check()
    assert by_file.out == active.out and op_names(by_file.run_dir) == ["numpy.ones", "numpy.add"]
    by_env = run(
        [str(py), str(script)],
        tmp_path,
        probe=False,
        output=tmp_path / "o7",
        env={"PPROBE_CONFIG": str(cfg)},
    ).check()
    assert by_env.out == active.out and op_names(by_env.run_dir) == ["numpy.ones", "numpy.add"]

    r = run([str(py), "-m", "pprobe", "uninstall", "--site"], tmp_path, probe=False, env=cli)
    r.check()
    assert not pth.exists() and str(pth) in r.out
    after = run(
        [str(py), str(script)], tmp_path, probe=False, output=tmp_path / "o4", env={"PPROBE": "1"}
    ).check()
    assert not after.output.exists() and after.out == plain.out
    assert _host_pth() == host_before


@pytest.mark.skipif(
    sys.prefix != sys.base_prefix,
    reason="this interpreter is a venv (CI's interpreter matrix): a --system-site-packages venv "
    "made from it sees the base interpreter, where pprobe is not installed",
)
def test_site_pth_in_a_venv_with_system_site_packages(tmp_path: Path) -> None:
    # The venv's .pth runs before the base interpreter's site-packages (pprobe's
    # dependencies, and pprobe itself here) is on sys.path: the probe starts once it is.
    py = make_venv(tmp_path / "venv", system_site=True)
    cli = {"PYTHONPATH": None, "PPROBE": None}
    run([str(py), "-m", "pprobe", "install", "--site"], tmp_path, probe=False, env=cli).check()
    script = write(
        tmp_path / "prog.py",
        """
        import site, sys
        print(site.execsitecustomize.__module__, sys.path == list(dict.fromkeys(sys.path)))
        import numpy as np
        print(float(np.add(np.ones(2), 1)[-1]))
        """,
    )
    plain = run([str(py), str(script)], tmp_path, probe=False, env=cli).check()
    active = run(
        [str(py), str(script)],
        tmp_path,
        probe=False,
        output=tmp_path / "o",
        env={**cli, "PPROBE": "1"},
    ).check()
    assert active.err == "" and active.out == plain.out == "site True\n2.0\n"
    assert op_names(active.run_dir) == ["numpy.ones", "numpy.add"]


def test_bootstrap_path_works_from_any_folder(tmp_path: Path) -> None:
    cli = {"PYTHONPATH": str(REPO), "PPROBE": None}
    r = run([PYTHON, "-m", "pprobe", "bootstrap-path"], tmp_path, probe=False, env=cli).check()
    path = r.out.strip()
    assert (Path(path) / "sitecustomize.py").is_file() and os.path.isabs(path)
    script = write(tmp_path / "elsewhere" / "prog.py", "import numpy as np\nnp.add(1, 2)\n")
    probed = run(
        [PYTHON, str(script)],
        tmp_path / "elsewhere",
        probe=False,
        output=tmp_path / "out",
        env={"PYTHONPATH": path, "PPROBE": None},
    ).check()
    assert op_names(probed.run_dir) == ["numpy.add"]


def test_kill_switch(tmp_path: Path) -> None:
    plain = run_script(tmp_path, NUMPY_PROG, probe=False).check()
    for value in ("0", "false", "off"):
        r = run_script(tmp_path, NUMPY_PROG, env={"PPROBE": value}).check()
        assert (r.out, r.err) == (plain.out, plain.err)
        assert not r.output.exists()


@pytest.mark.parametrize("value", ["0", "off"])
def test_kill_switch_wins_over_enable_and_probe(tmp_path: Path, value: str) -> None:
    r = run_script(
        tmp_path,
        """
        import numpy as np
        import pprobe
        print(pprobe.enable(mode="log"), pprobe.active_run_dir())
        np.add(np.ones(2), 1)
        pprobe.disable()
        with pprobe.probe(mode="log") as run_dir:
            np.add(np.ones(2), 2)
            print(run_dir, pprobe.active_run_dir())
        """,
        probe=False,
        env={"PYTHONPATH": str(REPO), "PPROBE": value},
    ).check()
    assert r.out.split() == ["None"] * 4
    assert r.err == "" and not r.output.exists()


def test_pip_is_never_probed(tmp_path: Path) -> None:
    r = run([PYTHON, "-m", "pip", "--version"], tmp_path, env={"PPROBE": "1"}).check()
    assert r.out.startswith("pip ")
    assert not r.output.exists()


def test_pprobe_query_is_never_probed(tmp_path: Path) -> None:
    first = run_script(tmp_path, NUMPY_PROG).check()
    assert len(first.runs) == 1
    r = run(
        [
            PYTHON,
            "-m",
            "pprobe",
            "query",
            "SELECT count(*) AS n FROM ops",
            "--run",
            str(first.output),
            "--format",
            "json",
        ],
        tmp_path,
        env={"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(REPO)]), "PPROBE": "1"},
    ).check()
    assert json.loads(r.out) == [{"n": 2}]
    assert first.runs == r.runs  # still the one run: the query made none


def test_startup_imports_no_framework(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import sys
        heavy = ("numpy", "torch", "pyarrow", "duckdb")
        print(sorted(m for m in heavy if m in sys.modules))
        print(sys.modules["pprobe"].active_run_dir())
        """,
    ).check()
    loaded, run_dir = r.out.splitlines()
    assert loaded == "[]"
    assert Path(run_dir) == r.run_dir  # the probe did start


def test_lazily_loaded_submodules_are_recorded(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import json, sys
        import numpy as np
        lazy = ["numpy.fft", "numpy.random", "numpy.polynomial"]
        print(json.dumps([m for m in lazy if m in sys.modules]))
        a = np.arange(8.0)
        np.fft.fft(a)                      # loaded by attribute access
        import numpy.random
        np.random.seed(0)
        np.random.rand(3)
        np.random.normal(size=2)
        from numpy.polynomial import polynomial as P
        P.polyval(2.0, [1.0, 2.0])
        from numpy.fft import irfft
        irfft(np.fft.rfft(a))
        np.linalg.norm(a)
        np.emath.sqrt(-1)
        """,
    ).check()
    assert json.loads(r.out) == []  # they really were lazy
    assert op_names(r.run_dir) == [
        "numpy.arange",
        "numpy.fft.fft",
        "numpy.random.rand",
        "numpy.random.normal",
        "numpy.polynomial.polynomial.polyval",
        "numpy.fft.rfft",
        "numpy.fft.irfft",
        "numpy.linalg.norm",
        "numpy.emath.sqrt",
    ]


def test_import_pprobe_auto(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import pprobe.auto
        import numpy as np
        np.add(np.ones(2), 1)
        """,
        probe=False,
        env={"PYTHONPATH": str(REPO)},
    ).check()
    assert op_names(r.run_dir) == ["numpy.ones", "numpy.add"]


def test_every_entry_point_together_is_one_session(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import site, sys
        import pprobe.auto
        from pprobe import _startup
        print(_startup.initialize(source="bootstrap"))
        print(sys.modules["sitecustomize"].__file__)
        # usercustomize runs too where the user site is on (not in a venv)
        print(getattr(sys.modules.get("usercustomize"), "__file__", None), site.ENABLE_USER_SITE)
        import numpy as np
        np.add(np.ones(2), 1)
        """,
    ).check()
    started_again, site_file, user = r.out.splitlines()
    user_file, user_site = user.rsplit(" ", 1)
    assert started_again == "False"
    assert Path(site_file).parent == BOOTSTRAP
    if user_site == "True":
        assert Path(user_file).parent == BOOTSTRAP
    assert len(r.runs) == 1
    rd = r.run_dir
    assert len(list((rd / "procs").glob("*.json"))) == 1
    assert len(list((rd / "log").glob("ops-*.arrows"))) == 1
    assert op_names(rd) == ["numpy.ones", "numpy.add"]
