"""Settings extensions register: config.register/get/set, precedence, errors, SQL tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_script, sql, write

from pprobe import config
from pprobe.config import ConfigError
from pprobe.ext import settings


@pytest.fixture(autouse=True)
def fresh_registry() -> object:
    saved = dict(settings.registry)
    settings.registry.clear()
    yield
    settings.registry.clear()
    settings.registry.update(saved)


def test_precedence_default_pyproject_toml_env_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert config.register("my_plugin.a", default=1, type=int) == 1
    write(tmp_path / "pyproject.toml", "[tool.pprobe.my_plugin]\na = 2\nb = 2\nc = 2\nd = 2\n")
    assert config.register("my_plugin.a", default=1, type=int) == 2
    write(tmp_path / "pprobe.toml", "[my_plugin]\nb = 3\nc = 3\nd = 3\n")
    monkeypatch.setenv("PPROBE_MY_PLUGIN__C", "4")
    monkeypatch.setenv("PPROBE_MY_PLUGIN__D", "4")
    got = [config.register(f"my_plugin.{k}", default=1, type=int) for k in "abcd"]
    assert got == [2, 3, 4, 4]
    assert config.set("my_plugin.d", "5") == 5 and config.get("my_plugin.d") == 5
    src = {r["name"]: r["source"] for r in settings.registered_rows()}
    assert src == {
        "my_plugin.a": str(tmp_path / "pyproject.toml"),
        "my_plugin.b": str(tmp_path / "pprobe.toml"),
        "my_plugin.c": "env PPROBE_MY_PLUGIN__C",
        "my_plugin.d": "api",
    }
    # pprobe's own settings still load: the namespaced table and variable are not errors
    assert config.load().mode == "dump"


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: config.register("flat", 1), "not valid; allowed: dotted lower-case"),
        (lambda: config.register("mode.x", 1), "inside pprobe's own setting 'mode'"),
        (lambda: config.register("p.x", 1, type=dict), "type .* is not valid"),
        (lambda: config.get("p.nothing"), "unknown setting 'p.nothing'"),
        (lambda: config.set("p.nothing", 1), "unknown setting 'p.nothing'"),
        (lambda: config.set("mode", "log"), "pprobe's own setting, fixed while a run records"),
    ],
)
def test_api_errors(call: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()  # type: ignore[operator]


def test_bad_values_name_their_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PPROBE_P__RATE", "fast")
    with pytest.raises(ConfigError, match=r"^PPROBE_P__RATE='fast' is not valid; allowed: a num"):
        config.register("p.rate", 0.1, float)
    monkeypatch.delenv("PPROBE_P__RATE")
    write(tmp_path / "pprobe.toml", "[p]\non = 'maybe'\n")
    with pytest.raises(ConfigError, match=r"p.on \(from .*pprobe.toml\)='maybe' is not valid"):
        config.register("p.on", False, bool)
    config.register("p.n", 1, int)
    with pytest.raises(ConfigError, match=r"p.n \(from config.set\)=2.5 is not valid"):
        config.set("p.n", 2.5)
    assert config.get("p.n") == 1


def test_own_settings_readable_through_get() -> None:
    assert config.get("mode") == config.load().mode
    assert config.get("sample_steps") == 1


def test_settings_tables_end_to_end(tmp_path: Path) -> None:
    write(tmp_path / "pprobe.toml", '[my_plugin]\nname = "from-toml"\n')
    r = run_script(
        tmp_path,
        """
        import json
        from pprobe import config
        rate = config.register("my_plugin.sample_rate", default=0.1, type=float, help="rate")
        name = config.register("my_plugin.name", default="x", help="who")
        config.register("my_plugin.flag", default=False)
        config.set("my_plugin.flag", "yes")
        print(json.dumps([rate, name, config.get("my_plugin.flag"), config.get("mode")]))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_MY_PLUGIN__SAMPLE_RATE": "0.25"},
    ).check()
    assert json.loads(r.out) == [0.25, "from-toml", True, "log"]
    got = sql(
        r.run_dir,
        'SELECT name, value, "default", type, source, description '
        "FROM information_schema.df_settings WHERE name LIKE 'my_plugin.%' ORDER BY name",
    )
    assert got == [
        {"name": "my_plugin.flag", "value": "true", "default": "false", "type": "bool",
         "source": "api", "description": ""},
        {"name": "my_plugin.name", "value": "from-toml", "default": "x", "type": "str",
         "source": str(tmp_path / "pprobe.toml"), "description": "who"},
        {"name": "my_plugin.sample_rate", "value": "0.25", "default": "0.1", "type": "float",
         "source": "env PPROBE_MY_PLUGIN__SAMPLE_RATE", "description": "rate"},
    ]  # fmt: skip
    own = sql(r.run_dir, "SELECT name, value, source FROM settings WHERE name = 'mode'")
    assert own == [{"name": "mode", "value": "log", "source": "env PPROBE_MODE"}]
    n = sql(r.run_dir, "SELECT count(*) AS n FROM settings")[0]["n"]
    assert n == len(config.SETTINGS) + 3


def test_a_bad_registered_value_is_the_programs_exception(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        from pprobe import config
        try:
            config.register("p.rate", 0.1, float)
        except config.ConfigError as e:
            print("error:", e)
        """,
        env={"PPROBE_MODE": "log", "PPROBE_P__RATE": "x"},
    ).check()
    assert r.out.strip() == "error: PPROBE_P__RATE='x' is not valid; allowed: a number"
    assert r.pprobe_lines() == []  # the probe itself started fine
