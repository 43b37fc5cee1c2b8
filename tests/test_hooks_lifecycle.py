"""Lifecycle points end to end: hooks from pprobe.toml on real programs run through the bootstrap.

Each program counts its own steps and epochs and writes them beside what the hook saw; the
tests compare the two (nothing hard-coded that could not fail).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers import BOOTSTRAP, run_script, sql, write

from pprobe import hooks as ph
from pprobe.hooks import BaseHook, HookRegistry, dispatch
from pprobe.hooks import config as hook_config

torch = pytest.importorskip("torch")

#: A hook module the programs name in ``hook_modules``: it writes every point it sees.
HOOK_MODULE = """
import json, os
from pprobe.hooks import BaseHook, HookRegistry

@HookRegistry.register("Recorder")
class Recorder(BaseHook):
    def __init__(self, path="seen.jsonl", fail_at=None, **kw):
        super().__init__(**kw)
        self.path = path
        self.fail_at = fail_at

    def _w(self, *a):
        with open(self.path, "a") as f:
            f.write(json.dumps(a) + "\\n")

    def before_training(self, model):
        self._w("before_training", type(model).__name__)

    def before_epoch(self, epoch):
        self._w("before_epoch", epoch)

    def before_step(self, step):
        self._w("before_step", step)

    def after_step(self, step, metrics):
        self._w("after_step", step, metrics)
        if self.fail_at is not None and step >= self.fail_at:
            raise RuntimeError(f"hook failure at step {step}")

    def after_epoch(self, epoch, metrics):
        self._w("after_epoch", epoch, metrics)

    def after_training(self, metrics):
        self._w("after_training", metrics)

    def cleanup(self):
        s = self.get_service
        vis = s("visualization_dir")
        self._w("cleanup", {
            "model": type(s("model")).__name__,
            "optimizer": type(s("optimizer")).__name__,
            "scheduler": type(s("scheduler")).__name__,
            "loader_batch": getattr(s("train_loader"), "batch_size", None),
            "device": str(s("device")),
            "experiment_dir": s("experiment_dir"),
            "logger": type(s("logger")).__name__,
            "vis_mode": oct(os.stat(vis).st_mode & 0o777),
            "nothing": s("no_such_service"),
        })
"""

#: A torch loop: a training DataLoader (2 epochs), a validation one, an LR scheduler.
TRAIN = """
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
ds = TensorDataset(torch.randn(EXAMPLES, 4), torch.randn(EXAMPLES, 1))
train = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
val = DataLoader(ds, batch_size=6)
steps, lrs = [], []
for ep in range(EPOCHS):
    n = 0
    for x, y in train:
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        n += 1
    steps.append(n)
    sched.step()
    with torch.no_grad():
        for x, y in val:
            net(x)
json.dump({"steps": steps, "lrs": lrs,
           "weights": [p.detach().double().flatten().tolist() for p in net.parameters()]},
          open("truth.json", "w"))
if "--raise" in sys.argv:
    raise ValueError("the program fails after training")
"""


def _train(examples: int = 12, batch: int = 4, epochs: int = 2, workers: int = 0) -> str:
    return (
        TRAIN.replace("EXAMPLES", str(examples))
        .replace("BATCH", str(batch))
        .replace("EPOCHS", str(epochs))
        .replace("WORKERS", str(workers))
    )


def _setup(tmp_path: Path, toml: str = "") -> None:
    write(tmp_path / "myhooks.py", HOOK_MODULE)
    write(
        tmp_path / "pprobe.toml",
        'mode = "log"\nhook_modules = ["myhooks"]\n'
        + (toml or '[[hooks]]\ntype = "Recorder"\npath = "seen.jsonl"\n'),
    )


def _seen(tmp_path: Path, name: str = "seen.jsonl") -> list[list[Any]]:
    p = tmp_path / name
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _expected(steps_per_epoch: list[int], lrs: list[float]) -> list[list[Any]]:
    """The points a plain torch loop gets, in order, from the loop's own counts."""
    out: list[list[Any]] = [["before_training", "Sequential"]]
    s = 0
    for e, n in enumerate(steps_per_epoch):
        out.append(["before_epoch", e])
        for _ in range(n):
            out.append(["before_step", s])
            out.append(["after_step", s, {"lr": lrs[s]}])
            s += 1
        out.append(["after_epoch", e, {"steps": n}])
    out.append(["after_training", {"steps": s, "epochs": len(steps_per_epoch)}])
    return out


def test_torch_loop_points_from_pprobe_toml(tmp_path: Path) -> None:
    _setup(tmp_path)
    r = run_script(tmp_path, _train(examples=14, batch=4, epochs=2)).check()
    assert "Warning" not in r.err  # finding the services warns of nothing
    truth = json.loads((tmp_path / "truth.json").read_text())
    seen = _seen(tmp_path)
    assert seen[:-1] == _expected(truth["steps"], truth["lrs"])
    cleanup = seen[-1]
    assert cleanup[0] == "cleanup"
    assert cleanup[1] == {
        "model": "Sequential",
        "optimizer": "SGD",
        "scheduler": "StepLR",
        "loader_batch": 4,
        "device": "cpu",
        "experiment_dir": str(r.run_dir),
        "logger": "Logger",
        "vis_mode": "0o700",
        "nothing": None,
    }
    # the hook's own work is not recorded, and the rows' steps match the hook's
    n_steps = sum(truth["steps"])
    got = sql(r.run_dir, "SELECT max(step) AS m FROM ops")[0]["m"]
    assert got == n_steps


def test_exception_ends_training_once_forked_workers_fire_nothing(tmp_path: Path) -> None:
    # the DataLoader's 2 forked worker processes inherit the hooks: they must not fire
    _setup(tmp_path)
    r = run_script(tmp_path, _train(epochs=2, workers=2), "--raise")
    assert r.rc == 1 and "the program fails after training" in r.err
    truth = json.loads((tmp_path / "truth.json").read_text())
    seen = _seen(tmp_path)
    assert seen[:-1] == _expected(truth["steps"], truth["lrs"])
    names = [x[0] for x in seen]
    assert names.count("after_training") == 1 and names.count("cleanup") == 1
    assert names[-2:] == ["after_training", "cleanup"]


def test_hooks_from_pyproject_and_a_plugin(tmp_path: Path) -> None:
    write(
        tmp_path / "lib" / "hookplug.py",
        """
        from pprobe import Plugin
        from pprobe.hooks import BaseHook, HookRegistry

        @HookRegistry.register("FromPlugin")
        class FromPlugin(BaseHook):
            def after_step(self, step):
                open("p.txt", "a").write(f"{step}\\n")

        class HookPlug(Plugin):
            name = "hookplug"
        """,
    )
    write(
        tmp_path / "pyproject.toml",
        '[tool.pprobe]\nmode = "log"\nplugins = ["hookplug"]\n\n'
        '[[tool.pprobe.hooks]]\ntype = "FromPlugin"\nfrequency = 2\n',
    )
    prog = """
    import torch
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(5):
        opt.zero_grad()
        net(torch.ones(2, 3)).sum().backward()
        opt.step()
    """
    pp = f"{BOOTSTRAP}{os.pathsep}{tmp_path / 'lib'}"
    run_script(tmp_path, prog, env={"PYTHONPATH": pp}).check()
    assert (tmp_path / "p.txt").read_text().split() == ["0", "2", "4"]


def test_sigterm_runs_cleanup_once(tmp_path: Path) -> None:
    _setup(tmp_path)
    prog = """
    import os, signal, time
    import torch
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(3):
        opt.zero_grad()
        net(torch.ones(2, 3)).sum().backward()
        opt.step()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    """
    r = run_script(tmp_path, prog)
    assert r.rc == -signal.SIGTERM
    names = [x[0] for x in _seen(tmp_path)]
    assert names.count("after_step") == 3
    assert names.count("cleanup") == 1 and names[-2:] == ["after_training", "cleanup"]


def test_raising_hook_reported_once_switched_off_results_identical(tmp_path: Path) -> None:
    # the probed loop without hooks, then with a hook that raises from step 1 on
    plain = tmp_path / "plain"
    plain.mkdir()
    write(plain / "pprobe.toml", 'mode = "log"\n')
    run_script(plain, _train()).check()
    with_hooks = tmp_path / "hooked"
    with_hooks.mkdir()
    _setup(with_hooks, '[[hooks]]\ntype = "Recorder"\nname = "flaky"\nfail_at = 1\n')
    r = run_script(with_hooks, _train()).check()
    a = json.loads((plain / "truth.json").read_text())
    b = json.loads((with_hooks / "truth.json").read_text())
    assert a == b  # bit-identical: same floats through JSON's repr
    lines = [x for x in r.err.splitlines() if "hook failure" in x]
    assert len(lines) == 1 and "flaky.after_step" in lines[0]
    after = [x[1] for x in _seen(with_hooks) if x[0] == "after_step"]
    assert after == list(range(1 + dispatch.MAX_FAILURES))  # then switched off
    errs = sql(r.run_dir, "SELECT source, event, failures FROM python.errors ORDER BY failures")
    assert [(e["event"], e["failures"]) for e in errs] == [
        ("raised", 1),
        ("switched off", dispatch.MAX_FAILURES),
    ]
    assert errs[0]["source"] == "hook flaky.after_step"


def test_config_errors_one_line_program_runs_strict_stops(tmp_path: Path) -> None:
    _setup(
        tmp_path,
        '[[hooks]]\ntype = "Recorder"\ncolour = "red"\n\n[[hooks]]\ntype = "Nope"\n\n'
        '[[hooks]]\ntype = "Recorder"\n',
    )
    prog = "import numpy as np\nprint(float(np.add(1.0, 2.0)))\n"
    r = run_script(tmp_path, prog).check()
    assert r.out.strip() == "3.0"
    lines = r.pprobe_lines()
    bad_param = [x for x in lines if "'colour'" in x]
    assert len(bad_param) == 1 and "allowed: " in bad_param[0] and "path" in bad_param[0]
    bad_type = [x for x in lines if "'Nope'" in x]
    assert len(bad_type) == 1 and "Recorder" in bad_type[0]
    # the good third entry runs: no training, so only cleanup
    assert [x[0] for x in _seen(tmp_path)] == ["cleanup"]
    (tmp_path / "seen.jsonl").unlink()
    r = run_script(tmp_path, prog, env={"PPROBE_STRICT": "1"})
    assert r.rc == 2 and r.out == ""
    assert "'colour'" in r.err and "stopping" in r.err


def test_yaml_hooks_file(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    write(tmp_path / "myhooks.py", HOOK_MODULE)
    write(tmp_path / "hooks.yaml", "hooks:\n  - type: Recorder\n    path: y.jsonl\n")
    prog = """
    import torch
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(4):
        opt.zero_grad()
        net(torch.ones(2, 3)).sum().backward()
        opt.step()
    """
    env = {"PPROBE_HOOKS": "hooks.yaml", "PPROBE_HOOK_MODULES": "myhooks", "PPROBE_MODE": "log"}
    run_script(tmp_path, prog, env=env).check()
    seen = _seen(tmp_path, "y.jsonl")
    assert [x[1] for x in seen if x[0] == "after_step"] == [0, 1, 2, 3]
    assert [x[1] for x in seen if x[0] == "before_step"] == [0, 1, 2, 3]
    assert not [x for x in seen if "epoch" in x[0]]  # no DataLoader: no epochs


def test_hooks_not_imported_without_config(tmp_path: Path) -> None:
    prog = """
    import sys, torch
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.ones(2, 3)).sum().backward()
    opt.step()
    print(sorted(m for m in sys.modules if m.startswith("pprobe.hooks") or m == "pprobe.stepat"))
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    assert r.out.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# in-process: the config builder and manual epochs
@pytest.fixture
def _clean() -> Any:
    dispatch._reset()
    yield
    dispatch._reset()


def test_build_reports_and_strict_raises(_clean: Any, capsys: Any) -> None:
    @HookRegistry.register("BuildProbe")
    class H(BaseHook):
        def __init__(self, size: int = 1, **kw: Any) -> None:
            super().__init__(**kw)
            self.size = size

    got = hook_config.build(
        [{"type": "BuildProbe", "size": 3, "frequency": 2}, {"type": "BuildProbe", "sise": 1}]
    )
    assert len(got) == 1 and got[0].size == 3 and got[0].frequency == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'sise'" in err and "size, name, frequency" in err
    with pytest.raises(hook_config.HookConfigError, match="unknown hook type 'X'"):
        hook_config.build([{"type": "X"}], strict=True)
    with pytest.raises(hook_config.HookConfigError, match="frequency must be"):
        hook_config.build([{"type": "BuildProbe", "frequency": 0}], strict=True)


def test_shutdown_runs_cleanup_once(_clean: Any) -> None:
    seen: list[str] = []

    class H(BaseHook):
        def after_training(self) -> None:
            seen.append("after_training")

        def cleanup(self) -> None:
            seen.append("cleanup")

    dispatch._hooks.append(H())  # not add(): no zero-code detection in this process
    ph.emit("before_training")
    dispatch.shutdown()
    dispatch.shutdown()
    assert seen == ["after_training", "cleanup"]
    # an integration that emits cleanup itself (at its exit), then the session's shutdown
    dispatch._reset()
    dispatch._hooks.append(H())
    ph.claim("fw")
    ph.emit("before_training", source="fw")
    ph.emit("after_training", source="fw")
    ph.emit("cleanup", source="fw")
    dispatch.shutdown()
    ph.emit("cleanup", source="fw")
    assert seen == ["after_training", "cleanup", "after_training", "cleanup"]


def test_hook_added_in_code(tmp_path: Path) -> None:
    prog = """
    import torch
    from pprobe.hooks import BaseHook, add

    class Every2(BaseHook):
        def after_step(self, step, model):
            print("after_step", step, type(model).__name__)
        def cleanup(self):
            print("cleanup")

    add(Every2(frequency=2))
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(5):
        opt.zero_grad()
        net(torch.ones(2, 3)).sum().backward()
        opt.step()
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    assert r.out.split("\n")[:-1] == [f"after_step {s} Linear" for s in (0, 2, 4)] + ["cleanup"]


def test_a_later_optimizer_takes_the_services_over(tmp_path: Path) -> None:
    prog = """
    import gc, torch
    from pprobe.hooks import BaseHook, add

    class Show(BaseHook):
        def after_step(self, step, model):
            opt = self.get_service("optimizer")
            print(step, type(opt).__name__, type(model).__name__)

    add(Show())
    for make, net in ((torch.optim.SGD, torch.nn.Linear(3, 1)),
                      (torch.optim.Adam, torch.nn.Bilinear(3, 3, 1))):
        opt = make(net.parameters(), lr=0.1)
        for i in range(2):
            opt.zero_grad()
            x = torch.ones(2, 3)
            (net(x) if isinstance(net, torch.nn.Linear) else net(x, x)).sum().backward()
            opt.step()
        del opt
        gc.collect()
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    assert r.out.split("\n")[:-1] == [
        "0 SGD Linear", "1 SGD Linear", "2 Adam Bilinear", "3 Adam Bilinear"
    ]  # fmt: skip
