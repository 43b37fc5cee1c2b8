"""Configuration: bad values print one line and the program runs unprobed (fatal with
PPROBE_STRICT=1); precedence defaults < pyproject < pprobe.toml < env < enable(); README's
settings table lists every variable."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import REPO, meta, npy_files, op_names, run_script, write
from helpers import ops as ops_of

from pprobe import config

PROG = """
    import numpy as np
    print("result", float(np.add(np.arange(3.0), 1).sum()))
"""

KNOWN = sorted(config.BY_ENV) + sorted(config.OTHER_ENV)

BAD = [
    ("PPROBE_MODE", "bogus", list(config.MODES)),
    ("PPROBE_BUDGET", "lots", ["byte count"]),
    ("PPROBE_FOO", "1", KNOWN),
    ("PPROBE_EVERY", "0", [">= 1"]),
    ("PPROBE_FIRST", "-1", [">= 0"]),
    ("PPROBE_STEPS", "5-2", ["10-12,100"]),
    ("PPROBE_FRAMEWORKS", "jax", list(config.FRAMEWORKS)),
    ("PPROBE_COVERAGE", "most", list(config.COVERAGES)),
    ("PPROBE_NESTED", "maybe", ["1/0", "true/false"]),
    ("PPROBE_FLUSH_SECONDS", "-3", ["from 0.01 to 86400"]),
    ("PPROBE_FLUSH_SECONDS", "inf", ["from 0.01 to 86400"]),
    ("PPROBE_FLUSH_SECONDS", "1e10", ["from 0.01 to 86400"]),
    ("PPROBE_FLUSH_SECONDS", "nan", ["from 0.01 to 86400"]),
    ("PPROBE_FLUSH_SECONDS", "0", ["from 0.01 to 86400"]),
    ("PPROBE_OUTPUT", " ", ["non-empty path"]),
    ("PPROBE_DTYPES", "float32,floot32", ["'floot32'", "dtype name", "float32,float16"]),
    ("PPROBE_DTYPES", "double", ["'double'", "dtype name"]),
]


@pytest.mark.parametrize("var, value, allowed", BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_value_prints_one_line_and_runs_unprobed(
    tmp_path: Path, var: str, value: str, allowed: list[str]
) -> None:
    plain = run_script(tmp_path, PROG, probe=False).check()
    r = run_script(tmp_path, PROG, env={var: value})
    assert (r.rc, r.out) == (plain.rc, plain.out)
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("pprobe: ") and var in lines[0]
    for a in allowed:
        assert a in lines[0], (a, lines[0])
    assert not r.output.exists()


@pytest.mark.parametrize("var, value", [("PPROBE_MODE", "bogus"), ("PPROBE_FOO", "1")])
def test_strict_makes_a_bad_value_fatal(tmp_path: Path, var: str, value: str) -> None:
    r = run_script(tmp_path, PROG, env={var: value, "PPROBE_STRICT": "1"})
    assert r.rc == 2
    assert r.out == ""  # the program did not run
    lines = r.err.splitlines()
    assert len(lines) == 1 and var in lines[0] and "PPROBE_STRICT" in lines[0], r.err
    assert not r.output.exists()


@pytest.mark.parametrize(
    "name, text, expect",
    [
        ("pprobe.toml", 'mode = "bogus"\n', ["pprobe.toml", "mode", "log, stats, dump"]),
        ("pprobe.toml", "colour = 1\n", ["pprobe.toml", "colour", "budget"]),
        ("pprobe.toml", "mode = [unclosed\n", ["pprobe.toml", "TOML"]),
        ("pyproject.toml", '[tool.pprobe]\nevery = "often"\n', ["pyproject.toml", "every"]),
        ("pprobe.toml", "flush_seconds = inf\n", ["flush_seconds", "from 0.01 to 86400"]),
        ("pprobe.toml", 'dtypes = ["floot32"]\n', ["dtypes", "'floot32'", "dtype name"]),
    ],
    ids=[
        "bad-value",
        "unknown-key",
        "not-toml",
        "pyproject",
        "flush-inf",
        "dtypes",
    ],  # fmt: skip
)
def test_bad_config_file(tmp_path: Path, name: str, text: str, expect: list[str]) -> None:
    plain = run_script(tmp_path, PROG, probe=False).check()
    write(tmp_path / name, text)
    r = run_script(tmp_path, PROG)
    assert (r.rc, r.out) == (plain.rc, plain.out)
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    for e in expect:
        assert e in lines[0], (e, lines[0])
    assert not r.output.exists()


PRECEDENCE_PROG = """
    import json, sys
    import numpy as np
    if sys.argv[1:] == ["enable"]:
        import pprobe
        pprobe.enable(exclude="x4")
    for i in range(8):
        np.add(np.ones(1), i)
    import pprobe
    print(pprobe.active_run_dir())
"""


def _layers(tmp_path: Path) -> None:
    write(
        tmp_path / "pyproject.toml",
        """
        [project]
        name = "user-project"
        [tool.pprobe]
        mode = "log"
        every = 2
        first = 3
        exclude = ["x1"]
        """,
    )
    write(tmp_path / "pprobe.toml", 'every = 4\nfirst = 5\nexclude = ["x2"]\nnested = true\n')


def test_precedence_defaults_pyproject_toml_env(tmp_path: Path) -> None:
    _layers(tmp_path)
    r = run_script(
        tmp_path, PRECEDENCE_PROG, env={"PPROBE_FIRST": "6", "PPROBE_EXCLUDE": "x3"}
    ).check()
    m = meta(r.run_dir)
    c, src = m["config"], m["config_sources"]
    assert (c["mode"], c["every"], c["first"], c["exclude"], c["nested"]) == (
        "log",
        4,
        6,
        ["x3"],
        True,
    )
    assert c["budget"] == config.BY_FIELD["budget"].default  # untouched: the default
    assert src["mode"] == str(tmp_path / "pyproject.toml")
    assert src["every"] == src["nested"] == str(tmp_path / "pprobe.toml")
    assert src["first"] == "env PPROBE_FIRST" and src["exclude"] == "env PPROBE_EXCLUDE"
    assert "budget" not in src
    # and the program was probed that way: every 4th np.add of the first 6, no dumps
    assert [x for x in op_names(r.run_dir) if x == "numpy.add"] == ["numpy.add"] * 2
    assert not npy_files(r.run_dir)


def test_precedence_enable_arguments_win(tmp_path: Path) -> None:
    _layers(tmp_path)
    r = run_script(
        tmp_path,
        PRECEDENCE_PROG,
        "enable",
        probe=False,
        env={"PYTHONPATH": str(REPO), "PPROBE_FIRST": "6", "PPROBE_EXCLUDE": "x3"},
    ).check()
    m = meta(r.run_dir)
    c = m["config"]
    assert (c["mode"], c["every"], c["first"], c["exclude"]) == ("log", 4, 6, ["x4"])
    assert m["config_sources"]["exclude"] == "argument"


def test_pprobe_config_names_the_file_read_instead_of_pprobe_toml(tmp_path: Path) -> None:
    _layers(tmp_path)
    other = write(tmp_path / "conf" / "other.toml", "every = 7\n")
    r = run_script(tmp_path, PRECEDENCE_PROG, env={"PPROBE_CONFIG": str(other)}).check()
    c = meta(r.run_dir)["config"]
    # pyproject still applies; ./pprobe.toml is not read (its nested/first are not used).
    assert (c["mode"], c["every"], c["first"], c["exclude"], c["nested"]) == (
        "log",
        7,
        3,
        ["x1"],
        False,
    )


def test_load_precedence_for_every_layer_in_process(tmp_path: Path) -> None:
    _layers(tmp_path)
    cfg = config.load(env={}, cwd=str(tmp_path))
    assert (cfg.mode, cfg.every, cfg.first, cfg.exclude) == ("log", 4, 5, ("x2",))
    cfg = config.load(env={"PPROBE_EVERY": "9"}, cwd=str(tmp_path))
    assert cfg.every == 9
    cfg = config.load(overrides={"every": 11}, env={"PPROBE_EVERY": "9"}, cwd=str(tmp_path))
    assert cfg.every == 11
    empty = tmp_path / "empty"
    empty.mkdir()
    defaults = config.load(env={}, cwd=str(empty))
    for s in config.SETTINGS:  # the defaults are the table's
        want = s.default
        assert getattr(defaults, s.field) == want, s.field
        assert getattr(config.Config(), s.field) == want, s.field


def test_child_processes_get_the_resolved_config_not_a_reguess(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "pprobe.toml", 'mode = "dump"\nevery = 3\n')
    r = run_script(
        tmp_path,
        """
        import os, subprocess, sys
        import numpy as np
        np.add(np.ones(1), 1)
        # The child runs where another pprobe.toml says dump mode, and without PPROBE_MODE:
        # it must still use its parent's resolved settings.
        env = {k: v for k, v in os.environ.items() if k != "PPROBE_MODE"}
        subprocess.run([sys.executable, "-c", "import numpy as np; np.add(np.ones(1), 2)"],
                       check=True, cwd=sys.argv[1], env=env)
        """,
        str(elsewhere),
        env={"PPROBE_MODE": "log"},
    ).check()
    rows = ops_of(r.run_dir)
    assert [x["args"] for x in rows if x["op"] == "numpy.add"] == ["1=1", "1=2"]
    assert len({x["pid"] for x in rows}) == 2
    assert not npy_files(r.run_dir)  # the child logged like its parent: no dumps


def test_readme_settings_table_lists_every_variable() -> None:
    readme = REPO / "README.md"
    assert readme.is_file(), "README.md is missing: it must document every setting"
    in_table: set[str] = set()
    for line in readme.read_text().splitlines():
        if line.lstrip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            in_table |= set(re.findall(r"\bPPROBE(?:_[A-Z0-9_]+)?\b", cells[0]))
    documented = {s.env for s in config.SETTINGS}
    assert documented - in_table == set(), "settings missing from README's table"
    assert in_table - documented - set(config.OTHER_ENV) == set(), "unknown names in README"


# ---------------------------------------------------------------------------------------------
# Python 3.10 has no tomllib: pprobe reads TOML with tomli there (a dependency on 3.10).
def test_pyproject_is_read_on_this_python(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n[tool.pprobe]\nevery = 3\n')
    assert config.load(env={}, cwd=str(tmp_path)).every == 3


def test_without_tomllib_tomli_reads_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tomli")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n[tool.pprobe]\nevery = 3\n')
    write(tmp_path / "pprobe.toml", "first = 4\n")
    cfg = config.load(env={}, cwd=str(tmp_path))
    assert (cfg.every, cfg.first) == (3, 4)


def test_without_any_toml_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    # A pyproject.toml that does not mention pprobe is not read (as coverage.py does) ...
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
    assert config.load(env={}, cwd=str(tmp_path)) == config.Config()
    # ... one that does, or a pprobe.toml, says what to install.
    write(tmp_path / "pprobe.toml", "first = 4\n")
    with pytest.raises(config.ConfigError, match="pprobe.toml: reading it needs tomli"):
        config.load(env={}, cwd=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# strict = true in a config file, and tables that are not tables.
@pytest.mark.parametrize(
    "name, text, env",
    [
        ("pprobe.toml", 'strict = true\nmode = "bogus"\n', {}),
        ("pprobe.toml", "strict = true\n", {"PPROBE_MODE": "bogus"}),
        ("pyproject.toml", '[tool.pprobe]\nstrict = true\nmode = "bogus"\n', {}),
        ("pyproject.toml", "[tool.pprobe]\nstrict = true\ncolour = 1\n", {}),
    ],
    ids=["toml", "toml-env-error", "pyproject", "pyproject-unknown-key"],
)
def test_strict_in_a_config_file(tmp_path: Path, name: str, text: str, env: dict) -> None:
    write(tmp_path / name, text)
    r = run_script(tmp_path, PROG, env=env)
    assert r.rc == 2 and r.out == "", r.err
    lines = r.err.splitlines()
    assert len(lines) == 1 and "strict = true" in lines[0] and name in lines[0], r.err
    # The environment wins over the file.
    r = run_script(tmp_path, PROG, env={**env, "PPROBE_STRICT": "0"})
    assert r.rc == 0 and r.out.startswith("result") and len(r.err.splitlines()) == 1, r.err
    assert not r.output.exists()


@pytest.mark.parametrize(
    "text, expect",
    [('tool = "x"\n', "tool = 'x'"), ("[tool]\npprobe = 5\n", "pprobe = 5")],
    ids=["tool-not-a-table", "pprobe-not-a-table"],
)
def test_pyproject_tool_tables_that_are_not_tables(tmp_path: Path, text: str, expect: str) -> None:
    plain = run_script(tmp_path, PROG, probe=False).check()
    write(tmp_path / "pyproject.toml", text)
    r = run_script(tmp_path, PROG)
    assert (r.rc, r.out) == (plain.rc, plain.out)
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("pprobe: configuration error: ") and "internal" not in lines[0]
    assert "pyproject.toml" in lines[0] and expect in lines[0] and "table" in lines[0]
    assert "metadata" not in lines[0]  # there is no run to hold it
    assert not r.output.exists()
    r = run_script(tmp_path, PROG, env={"PPROBE_STRICT": "1"})
    assert r.rc == 2 and r.out == "" and "PPROBE_STRICT=1: stopping" in r.err


# ---------------------------------------------------------------------------------------------
# Values that are valid but cannot do what was meant.
def test_dtype_names_numpy_and_torch_print_are_accepted() -> None:
    names = "float32,bfloat16,<U5,>f8,datetime64[ns],float8_e4m3fn,torch.int64,bool,object"
    cfg = config.load(env={"PPROBE_DTYPES": names})
    assert cfg.dtypes == (
        "float32", "bfloat16", "<U5", ">f8", "datetime64[ns]", "float8_e4m3fn", "int64",
        "bool", "object",
    )  # fmt: skip


def test_dtype_names_match_what_numpy_prints() -> None:
    import numpy as np

    for c in np.typecodes["All"] + "U S V":
        if c.strip():
            config.load(env={"PPROBE_DTYPES": str(np.dtype(c))})
    config.load(env={"PPROBE_DTYPES": str(np.dtype("M8[ms]")) + "," + str(np.dtype(">i4"))})


@pytest.mark.parametrize(
    "env, file, expect",
    [
        ({"PPROBE_INCLUDE": "["}, None, "PPROBE_INCLUDE pattern '['"),
        ({"PPROBE_EXCLUDE": "numpy.add,numpy .sum"}, None, "PPROBE_EXCLUDE pattern 'numpy .sum'"),
        ({}, 'include = ["x/y"]\n', "include (from "),
    ],
    ids=["include-bracket", "exclude-space", "toml"],
)
def test_a_pattern_that_can_never_match_is_warned_about(
    tmp_path: Path, env: dict, file: str | None, expect: str
) -> None:
    if file:
        write(tmp_path / "pprobe.toml", file)
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "log", **env}).check()
    lines = r.pprobe_lines()
    assert len(lines) == 1 and expect in lines[0] and "can never match" in lines[0], r.err
    assert "allowed: glob patterns" in lines[0]
    assert meta(r.run_dir)["warnings"] == [lines[0].removeprefix("pprobe: ")]


def test_patterns_that_can_match_are_not_warned_about(tmp_path: Path) -> None:
    for p in ("numpy.linalg.*", "*matmul", "[ab]dd", "[!x]*", "pkg.make.<locals>.Net", "add_"):
        assert config.never_matches(p) is None, p
    r = run_script(
        tmp_path, PROG, env={"PPROBE_MODE": "log", "PPROBE_INCLUDE": "numpy.a[d]d,*ang?"}
    ).check()
    assert r.pprobe_lines() == []
    assert op_names(r.run_dir) == ["numpy.arange", "numpy.add"]


@pytest.mark.parametrize("value", ['["a", "b"]', "5", "true"])
def test_output_in_toml_must_be_a_string(tmp_path: Path, value: str) -> None:
    write(tmp_path / "pprobe.toml", f"output = {value}\n")
    r = run_script(tmp_path, PROG, env={"PPROBE_OUTPUT": None}).check()
    lines = r.err.splitlines()
    assert len(lines) == 1 and "output" in lines[0] and "a string" in lines[0], r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pprobe.toml", "prog.py"]
