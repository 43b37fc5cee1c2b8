"""Plugins: PPROBE_PLUGINS, entry points, load_plugin / unload_plugin, failures, pprobe plugins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BOOTSTRAP, run_script, sql, write

from pprobe.ext import plugins, tables

PLUGIN = """
    from pprobe import Plugin

    class MyPlugin(Plugin):
        name = "my_plugin"

        def on_load(self):
            self.calls = 0
            self.rate = self.register_setting("my_plugin.rate", 0.5, float)
            self.register_table("plugin_data", self.get_data)
            self.metric("plugin_calls", lambda: self.calls)

        def on_unload(self):
            self.record("plugin_events", {"event": "unloaded", "calls": self.calls})

        def get_data(self):
            self.calls += 1
            return [{"key": "value", "rate": self.rate, "call": self.calls}]
"""


def _plugins(tmp_path: Path) -> Path:
    d = tmp_path / "plugdir"
    write(d / "myplug.py", PLUGIN)
    write(d / "badplug.py", "from pprobe import Plugin\nclass Bad(Plugin):\n"
          "    def on_load(self):\n        raise RuntimeError('nope')\n")  # fmt: skip
    write(d / "broken.py", "raise ImportError('cannot import this')\n")
    # an installed distribution with an entry point of the group pprobe.plugins
    write(d / "epplug.py", PLUGIN.replace("my_plugin", "ep_plugin").replace("plugin_data",
          "ep_data").replace("plugin_calls", "ep_calls"))  # fmt: skip
    di = d / "epplug-1.0.dist-info"
    write(di / "METADATA", "Metadata-Version: 2.1\nName: epplug\nVersion: 1.0\n")
    write(di / "entry_points.txt", "[pprobe.plugins]\nep_plugin = epplug:MyPlugin\n")
    return d


def test_plugins_from_the_environment(tmp_path: Path) -> None:
    d = _plugins(tmp_path)
    r = run_script(
        tmp_path,
        """
        import pprobe
        from pprobe.ext import plugins
        for i in range(3):
            pprobe.step()
        print(sorted(plugins.loaded))
        """,
        env={"PPROBE_MODE": "log", "PPROBE_PLUGINS": "badplug,myplug,broken,nowhere,ep_plugin",
             "PYTHONPATH": f"{BOOTSTRAP}{os.pathsep}{d}", "PPROBE_SAMPLE_STEPS": "1"},
    ).check()  # fmt: skip
    assert r.out.strip() == "['ep_plugin', 'my_plugin']"
    lines = r.pprobe_lines()
    assert lines == [
        "pprobe: plugin 'badplug' raised in on_load: RuntimeError: nope; what it registered is "
        "undone. The program and the other plugins go on.",
        "pprobe: plugin 'broken' cannot be loaded: ImportError: cannot import this. The program "
        "and the other plugins go on.",
        "pprobe: plugin 'nowhere' cannot be loaded: ModuleNotFoundError: No module named "
        "'nowhere'. The program and the other plugins go on.",
    ]
    got = sql(r.run_dir, "SELECT step, key, rate, call FROM python.plugin_data ORDER BY call")
    assert got == [{"step": s, "key": "value", "rate": 0.5, "call": s + 1} for s in range(4)]
    ep = sql(r.run_dir, "SELECT count(*) AS n FROM python.ep_data")
    assert ep == [{"n": 4}]
    m = sql(
        r.run_dir, "SELECT value FROM python.metrics WHERE name = 'plugin_calls' ORDER BY ts_ns"
    )
    assert [x["value"] for x in m] == [1.0, 2.0, 3.0, 4.0]
    errs = sql(r.run_dir, "SELECT source, event FROM python.errors ORDER BY source")
    assert errs == [{"source": f"plugin '{n}'", "event": "not loaded"}
                    for n in ("badplug", "broken", "nowhere")]  # fmt: skip
    # pprobe plugins: the entry point is available, the run loaded two
    env = dict(os.environ, PYTHONPATH=str(d), PPROBE_PLUGINS="myplug")
    p = subprocess.run([sys.executable, "-m", "pprobe", "plugins", "--run", str(r.run_dir),
                        "--format", "json"], capture_output=True, text=True, env=env,
                       check=True)  # fmt: skip
    listed = {x["name"]: x for x in json.loads(p.stdout)["plugins"]}
    pid = json.loads((r.run_dir / "meta.json").read_text())["pid"]
    assert listed["ep_plugin"]["source"] == "entry point epplug:MyPlugin (epplug)"
    assert listed["ep_plugin"]["loaded_pids"] == [pid]
    assert listed["my_plugin (myplug)"]["configured"] is True
    assert listed["my_plugin (myplug)"]["loaded_pids"] == [pid]
    p = subprocess.run([sys.executable, "-m", "pprobe", "plugins", "--run", str(r.run_dir)],
                       capture_output=True, text=True, env=env, check=True)  # fmt: skip
    assert "ep_plugin" in p.stdout and "my_plugin (myplug)" in p.stdout


def test_load_and_unload_plugin_in_the_program(tmp_path: Path) -> None:
    d = _plugins(tmp_path)
    r = run_script(
        tmp_path,
        """
        import pprobe
        from pprobe import config
        from pprobe.ext import tables
        p = pprobe.load_plugin("myplug")
        assert pprobe.load_plugin("myplug") is p or pprobe.load_plugin(type(p)) is p
        pprobe.step()
        assert pprobe.unload_plugin("my_plugin") and not pprobe.unload_plugin("my_plugin")
        pprobe.step()          # nothing sampled any more
        try:
            config.get("my_plugin.rate")
        except config.ConfigError as e:
            print("gone:", e.args[0].split(";")[0])
        try:
            pprobe.load_plugin("badplug")
        except pprobe.ext.plugins.PluginError as e:
            print(e)
        print(sorted(k[1] for k in tables.sources))
        """,
        env={"PPROBE_MODE": "log", "PYTHONPATH": f"{BOOTSTRAP}{os.pathsep}{d}"},
    ).check()
    assert r.out.splitlines() == [
        "gone: unknown setting 'my_plugin.rate'",
        "plugin 'badplug' raised in on_load: RuntimeError: nope; what it registered is undone",
        "[]",
    ]
    got = sql(r.run_dir, "SELECT step, call FROM python.plugin_data")
    assert got == [{"step": 0, "call": 1}]
    ev = sql(r.run_dir, "SELECT event, calls FROM python.plugin_events")
    assert ev == [{"event": "unloaded", "calls": 1}]


def test_in_process_errors() -> None:
    with pytest.raises(plugins.PluginError, match="not a pprobe.Plugin subclass"):
        plugins.load_plugin(object)
    with pytest.raises(plugins.PluginError, match="defines 0 Plugin subclasses"):
        plugins.load_plugin("json")

    class P(plugins.Plugin):
        name = "p_inproc"

        def on_load(self) -> None:
            self.register_table("p_inproc_t", lambda: {"a": 1})

    plugins.load_plugin(P)
    assert ("table", "p_inproc_t") in tables.sources
    assert plugins.unload_plugin("p_inproc")
    assert ("table", "p_inproc_t") not in tables.sources


def test_pprobe_plugins_without_a_run(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "pprobe", "plugins", "--run", str(tmp_path / "no")],
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 2 and p.stderr.startswith("pprobe plugins: ")
    assert len(p.stderr.strip().splitlines()) == 1


def test_plugins_from_the_config_file(tmp_path: Path) -> None:
    d = _plugins(tmp_path)
    write(tmp_path / "pprobe.toml", 'plugins = ["myplug"]\nmode = "log"\n')
    r = run_script(
        tmp_path,
        "from pprobe.ext import plugins\nprint(sorted(plugins.loaded))\n",
        env={"PYTHONPATH": f"{BOOTSTRAP}{os.pathsep}{d}"},
    ).check()
    assert r.out.strip() == "['my_plugin']"
    assert sql(r.run_dir, "SELECT count(*) AS n FROM python.plugin_data") == [{"n": 1}]
