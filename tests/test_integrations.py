"""Framework integrations (pprobe/integrations/): Lightning, transformers.Trainer, Accelerate.

End to end: a tiny model trained a few steps on the CPU through the bootstrap, the training
script unchanged; a hook loaded by a plugin (PPROBE_PLUGINS) writes the points it saw, which
are checked against what the framework reports (global_step, current_epoch, log_history);
the op rows' step column and python.metrics against the same; and the trained weights and
losses against a run without the probe, bit for bit. Each test is skipped when its framework
is not installed (CI installs them: run_tests.sh).
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import BOOTSTRAP, run_script, sql, write

from pprobe import integrations
from pprobe.integrations import numbers, record_metrics

# The hook a plugin adds (the training script does not change): every point it sees, written
# to $SEEN at cleanup with the services it was given and who claimed the points.
PLUGIN = """
import json, os
import pprobe.hooks as H
from pprobe import Plugin

class Recorder(H.BaseHook):
    def __init__(self):
        super().__init__(name="recorder")
        self.seen = []

    def before_training(self, model=None):
        self.seen.append(["before_training", type(model).__name__])

    def before_epoch(self, epoch):
        self.seen.append(["before_epoch", epoch])

    def before_step(self, step):
        self.seen.append(["before_step", step])

    def after_step(self, step, metrics=None):
        self.seen.append(["after_step", step, sorted(metrics or {})])

    def after_epoch(self, epoch, metrics=None):
        self.seen.append(["after_epoch", epoch])

    def after_training(self, metrics=None):
        self.seen.append(["after_training", sorted(metrics or {})])

    def cleanup(self):
        names = ("trainer", "model", "optimizer", "train_loader", "val_loader", "accelerator")
        services = {n: type(H.get_service(n)).__name__ for n in names}
        self.seen.append(["cleanup", H.claimed_by(), services])
        with open(os.environ["SEEN"], "w") as f:
            json.dump(self.seen, f)

class RecorderPlugin(Plugin):
    def on_load(self):
        H.add(Recorder())
"""


def _train(tmp_path: Path, script: str, probe: bool, **env: str) -> tuple[dict[str, Any], Any]:
    """Run ``script`` (it prints one JSON line last) with or without the probe; returns what
    it printed and the result (``r.run_dir``) of the probed run."""
    where = tmp_path / ("probed" if probe else "plain")
    write(where / "recorder_plugin.py", PLUGIN)
    e = {"SEEN": str(where / "seen.json"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
         "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", **env}  # fmt: skip
    if probe:  # the plugin is imported at start-up, before the script's folder is on sys.path
        e |= {"PPROBE_PLUGINS": "recorder_plugin", "PPROBE_MODE": "log",
              "PYTHONPATH": f"{BOOTSTRAP}:{where}"}  # fmt: skip
    r = run_script(where, script, env=e, probe=probe, timeout=300).check()
    out = json.loads(r.out.strip().splitlines()[-1])
    return out, r


def _seen(r: Any) -> list[Any]:
    return json.loads((r.output.parent / "seen.json").read_text())  # type: ignore[no-any-return]


def _points(seen: list[Any], point: str) -> list[Any]:
    return [s[1] if len(s) > 1 else None for s in seen if s[0] == point]


def _check_lifecycle(seen: list[Any], steps: int, epochs: int, source: str) -> None:
    """The points in order: one training, ``epochs`` epochs, ``steps`` steps numbered 0.."""
    names = [s[0] for s in seen]
    assert names[0] == "before_training" and names[-2:] == ["after_training", "cleanup"]
    assert names.count("before_training") == names.count("after_training") == 1
    assert _points(seen, "before_step") == _points(seen, "after_step") == list(range(steps))
    assert _points(seen, "before_epoch") == _points(seen, "after_epoch") == list(range(epochs))
    # each step's before and after are adjacent, inside its epoch
    body = [s for s in names if s in ("before_step", "after_step")]
    assert body == ["before_step", "after_step"] * steps
    assert seen[-1][1] == source


# ---------------------------------------------------------------------- Lightning
LIGHTNING = """
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
import {pkg} as pl

torch.manual_seed(0)
losses = []

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("train_loss", loss)
        losses.append(loss.item().hex())
        return loss

    def validation_step(self, batch, idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0)
net = Net()
trainer.fit(net, DataLoader(data, batch_size=4), DataLoader(data, batch_size=6))
weights = [p.detach().numpy().tobytes().hex() for p in net.parameters()]
print(json.dumps({{"global_step": trainer.global_step, "epoch": trainer.current_epoch,
                  "losses": losses, "weights": weights}}))
"""


@pytest.mark.parametrize("pkg", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_points_steps_and_results(tmp_path: Path, pkg: str) -> None:
    pytest.importorskip(pkg)
    script = LIGHTNING.format(pkg=pkg)
    got, r = _train(tmp_path, script, probe=True)
    if pkg == "lightning.pytorch":  # the same callback code for both: one comparison (time)
        plain, _ = _train(tmp_path, script, probe=False)
        assert got == plain  # weights and every loss, bit for bit
    # 12 samples in batches of 4: 3 steps an epoch, 2 epochs
    assert (got["global_step"], got["epoch"]) == (6, 2)
    seen = _seen(r)
    _check_lifecycle(seen, got["global_step"], got["epoch"], "lightning")
    assert seen[0] == ["before_training", "Net"]
    assert ["after_step", 0, ["train_loss"]] in seen  # trainer.callback_metrics
    assert seen[-1][2] == {"trainer": "Trainer", "model": "Net", "optimizer": "SGD",
                           "train_loader": "DataLoader", "val_loader": "DataLoader",
                           "accelerator": "NoneType"}  # fmt: skip
    # the op rows carry Lightning's step: one training loss per step, in step order
    rows = sql(r.run_dir, "SELECT step FROM ops WHERE op = 'torch.nn.functional.mse_loss' "
                          "AND phase <> 'backward' ORDER BY seq")  # fmt: skip
    steps = [x["step"] for x in rows]
    # training losses at 0..5; validation (2 batches of 6) after each epoch's last step
    assert steps == [0, 1, 2, 3, 3, 3, 4, 5, 6, 6]


# ---------------------------------------------------------------------- transformers
TRANSFORMERS = """
import json, os, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
model = GPT2LMHeadModel(cfg)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": ids, "labels": ids}
        for ids in torch.randint(0, 64, (8, 12), generator=g)]
args = TrainingArguments(output_dir=os.path.join(os.getcwd(), "hf"), per_device_train_batch_size=2,
                         num_train_epochs=2, logging_steps=1, report_to=[], save_strategy="no",
                         use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
logs = [{k: v for k, v in e.items() if isinstance(v, (int, float))}
        for e in trainer.state.log_history]
weights = [p.detach().numpy().tobytes().hex() for p in model.parameters()]
print(json.dumps({"global_step": trainer.state.global_step, "epoch": trainer.state.epoch,
                  "logs": logs, "weights": weights}))
"""


def test_transformers_trainer_points_metrics_and_results(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    got, r = _train(tmp_path, TRANSFORMERS, probe=True)
    plain, _ = _train(tmp_path, TRANSFORMERS, probe=False)
    timing = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
    for out in (got, plain):
        for e in out["logs"]:
            for k in timing:
                e.pop(k, None)
    assert got == plain  # weights and every logged loss, bit for bit
    # 8 samples in batches of 2: 4 steps an epoch, 2 epochs
    assert (got["global_step"], got["epoch"]) == (8, 2.0)
    seen = _seen(r)
    _check_lifecycle(seen, got["global_step"], int(got["epoch"]), "transformers")
    assert seen[0] == ["before_training", "GPT2LMHeadModel"]
    services = seen[-1][2]
    assert (services["trainer"], services["model"], services["train_loader"]) == (
        "Trainer", "GPT2LMHeadModel", "DataLoaderShard")  # fmt: skip
    # python.metrics holds every number of every on_log, with the step it was logged at
    metrics = sql(r.run_dir, "SELECT name, value, step FROM python.metrics ORDER BY ts_ns")
    logged = [(k, v, e["step"]) for e in got["logs"] for k, v in e.items() if k != "step"]
    recorded = [(m["name"], m["value"], m["step"]) for m in metrics]
    timing_rows = [x for x in recorded if x[0] in timing]
    assert len(timing_rows) == len(timing)
    # (rows of one on_log share their time: compared as sorted lists)
    assert sorted(x for x in recorded if x[0] not in timing) == sorted(logged)
    names = {x[0] for x in recorded}
    assert {"loss", "learning_rate", "grad_norm"} <= names
    # the op rows carry the Trainer's step: each step's forward runs one lm loss
    rows = sql(r.run_dir, "SELECT DISTINCT step FROM ops WHERE phase = 'forward' "
                          "AND op LIKE '%cross_entropy%' ORDER BY step")  # fmt: skip
    assert [x["step"] for x in rows] == list(range(got["global_step"]))


# ---------------------------------------------------------------------- Accelerate
ACCELERATE = """
import json
import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

torch.manual_seed(0)
acc = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dl = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
model, opt, dl = acc.prepare(model, opt, dl)
logged, step = [], 0
for epoch in range(2):
    for x, y in dl:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        values = {"loss": loss.item(), "epoch": epoch, "note": "text is left out"}
        acc.log(values, step=step * 10)
        logged.append([values["loss"], step * 10])
acc.log({"final": 1.5})
weights = [p.detach().numpy().tobytes().hex() for p in model.parameters()]
print(json.dumps({"logged": logged, "weights": weights}))
"""


def test_accelerate_log_values_recorded(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    got, r = _train(tmp_path, ACCELERATE, probe=True)
    plain, _ = _train(tmp_path, ACCELERATE, probe=False)
    assert got == plain
    metrics = sql(r.run_dir, "SELECT name, value, step FROM python.metrics ORDER BY ts_ns")
    losses = [[m["value"], m["step"]] for m in metrics if m["name"] == "loss"]
    assert losses == got["logged"]
    epochs = [(m["value"], m["step"]) for m in metrics if m["name"] == "epoch"]
    assert epochs == [(e, s) for e in (0.0, 1.0) for s in (10 * (2 * e + 1), 10 * (2 * e + 2))]
    assert not [m for m in metrics if m["name"] == "note"]
    # without a step argument: pprobe's step (4 optimizer steps detected)
    assert [(m["value"], m["step"]) for m in metrics if m["name"] == "final"] == [(1.5, 4)]


# ---------------------------------------------------------------------- start-up
def test_nothing_of_a_framework_is_imported_before_the_program_does(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = """
    import json, sys
    before = sorted(m for m in sys.modules if m.split(".")[0] in
                    ("lightning", "pytorch_lightning", "transformers", "accelerate", "torch"))
    import transformers  # lazy: its Trainer (and torch) are not imported by this line
    after = sorted(m for m in sys.modules if m.startswith("transformers.trainer"))
    print(json.dumps({"before": before, "after": after,
                      "watching": "pprobe.integrations" in sys.modules}))
    """
    probed = run_script(tmp_path, script).check()
    plain = run_script(tmp_path, script, probe=False).check()
    a, b = json.loads(probed.out), json.loads(plain.out)
    assert a["before"] == b["before"] == []
    assert a["after"] == b["after"]
    assert a["watching"] and not b["watching"]


# ---------------------------------------------------------------------- in process
def test_numbers_keeps_numbers_only() -> None:
    np = pytest.importorskip("numpy")
    got = numbers({"a": 1, "b": 2.5, "c": "x", "d": True, "e": np.float32(0.5),
                   "f": np.array([1.0, 2.0]), "g": np.array(3.0), "h": None})  # fmt: skip
    assert got == {"a": 1.0, "b": 2.5, "e": 0.5, "g": 3.0}
    torch = pytest.importorskip("torch")
    assert numbers({"t": torch.tensor(0.25), "v": torch.ones(2)}) == {"t": 0.25}


def test_record_metrics_rows_carry_the_given_step() -> None:
    from pprobe.ext import tables

    with tables._lock:
        before = list(tables.pending.get("metrics", []))
    record_metrics({"loss": 0.5, "lr": 0.1}, 7)
    record_metrics({}, 8)
    with tables._lock:
        rows = tables.pending.get("metrics", [])[len(before) :]
        tables.pending["metrics"] = before
    assert [(x["name"], x["value"], x["step"]) for x in rows] == [("loss", 0.5, 7), ("lr", 0.1, 7)]


def test_guarded_reports_once_and_returns_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pprobe import _report

    calls = []
    monkeypatch.setattr(integrations, "_session", lambda: None)

    @integrations.guarded("an inert callback")
    def inert() -> int:
        calls.append(0)
        return 1

    assert inert() is None and calls == []  # no session (pprobe.disable()): nothing runs
    monkeypatch.setattr(integrations, "_session", lambda: "a session")

    @integrations.guarded("a test callback")
    def body(x: int) -> int:
        calls.append(x)
        if x < 0:
            raise RuntimeError("boom")
        return x

    assert body(3) == 3
    assert body(-1) is None and body(-2) is None
    assert calls == [3, -1, -2]
    err = capsys.readouterr().err
    assert err.count("internal error in a test callback: RuntimeError: boom") == 1
    assert [e["count"] for e in _report.errors if e["where"] == "a test callback"] == [2]


def test_watch_without_a_session_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(integrations, "installed", {})
    monkeypatch.setitem(sys.modules, "pytorch_lightning", object())
    integrations._install("pytorch_lightning")  # no active session: nothing patched
    assert integrations.installed == {}


def test_lightning_callback_survives_a_failing_body_and_pickles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("lightning.pytorch")
    monkeypatch.setattr(integrations, "_session", lambda: "a session")
    from pprobe.integrations import lightning as integ

    cls = integ.callback_class("lightning.pytorch")
    cb = cls()
    # a trainer without the attributes the callback reads: reported, never raised
    assert cb.on_train_start(object(), None) is None
    assert cb.on_train_batch_start(object(), None, None, 0) is None
    # ddp_spawn pickles the Trainer with its callbacks
    again = pickle.loads(pickle.dumps(cb))
    assert type(again) is cls and again.state_key == "pprobe"


# ---------------------------------------------------------------------- the setting
FAKE_LIGHTNING = {
    "pytorch_lightning/__init__.py": """
        __version__ = "0.fake"

        class Trainer:
            def __init__(self, callbacks=None):
                self.callbacks = list(callbacks or [])
        """,
    "pytorch_lightning/callbacks.py": "class Callback:\n    pass\n",
}


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, ["PLCallback"]), ("transformers,accelerate", []), ("", [])],
)
def test_integrations_setting_picks_the_frameworks(
    tmp_path: Path, setting: str | None, expected: list[str]
) -> None:
    # a stand-in package of the same name: the watch and the setting, without the framework
    for name, text in FAKE_LIGHTNING.items():
        write(tmp_path / "lib" / name, text)
    script = """
    import sys
    sys.path.insert(0, "lib")
    import pytorch_lightning
    print([type(c).__name__ for c in pytorch_lightning.Trainer().callbacks])
    """
    env = {"PPROBE_MODE": "log"}
    if setting is not None:
        env["PPROBE_INTEGRATIONS"] = setting
    r = run_script(tmp_path, script, env=env).check()
    assert r.out.strip() == repr(expected)
    assert not r.pprobe_lines() or "internal error" not in r.err


def test_a_bad_integrations_value_is_one_line(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print('ran')", env={"PPROBE_INTEGRATIONS": "keras"}).check()
    assert r.out.strip() == "ran"
    lines = r.pprobe_lines()
    assert len(lines) == 1, r.err
    assert "PPROBE_INTEGRATIONS='keras'" in lines[0]
    assert "lightning, transformers, accelerate" in lines[0]


def test_a_failure_inside_a_callback_is_one_line_and_training_goes_on(tmp_path: Path) -> None:
    # the stand-in Trainer has no global_step: every on_train_batch_start fails inside pprobe
    for name, text in FAKE_LIGHTNING.items():
        write(tmp_path / "lib" / name, text)
    script = """
    import sys
    sys.path.insert(0, "lib")
    import pytorch_lightning
    trainer = pytorch_lightning.Trainer()
    results = [cb.on_train_batch_start(trainer, None, None, i)
               for i in range(3) for cb in trainer.callbacks]
    print(results)
    """
    r = run_script(tmp_path, script, env={"PPROBE_MODE": "log"}).check()
    assert r.out.strip() == "[None, None, None]"  # never -1 (that would end Lightning's epoch)
    lines = r.pprobe_lines()
    failures = [x for x in lines if "Lightning integration (on_train_batch_start)" in x]
    assert len(failures) == 1 and "AttributeError" in failures[0], r.err
    meta = json.loads((r.runs[-1] / "meta.json").read_text())
    errs = [e for e in meta["errors"] if "on_train_batch_start" in e["where"]]
    assert [e["count"] for e in errs] == [3]


FAKE_TRANSFORMERS = {
    "transformers/__init__.py": """
        class TrainerCallback:
            pass
        """,
    "transformers/trainer.py": """
        class State:
            global_step, epoch, log_history = 0, 0.0, []

        class Handler:
            def __init__(self):
                self.callbacks = []

        class Trainer:
            def __init__(self):
                self.callback_handler, self.model = Handler(), "the model"

            def add_callback(self, cb):
                self.callback_handler.callbacks.append(cb)

            def train(self):
                for cb in self.callback_handler.callbacks:
                    cb.on_train_begin(None, State(), None, model=self.model)
                raise RuntimeError("diverged")
        """,
}


def test_transformers_train_that_raises_ends_training_once(tmp_path: Path) -> None:
    # a stand-in transformers.trainer: the Trainer has no exception event of its own
    for name, text in FAKE_TRANSFORMERS.items():
        write(tmp_path / "lib" / name, text)
    write(tmp_path / "recorder_plugin.py", PLUGIN)
    script = """
    import sys
    sys.path.insert(0, "lib")
    from transformers.trainer import Trainer
    try:
        Trainer().train()
    except RuntimeError as e:
        print("raised", e)
    """
    env = {"PPROBE_MODE": "log", "PPROBE_PLUGINS": "recorder_plugin",
           "SEEN": str(tmp_path / "seen.json"),
           "PYTHONPATH": f"{BOOTSTRAP}:{tmp_path}"}  # fmt: skip
    r = run_script(tmp_path, script, env=env).check()
    assert r.out.strip() == "raised diverged"  # the program's exception, unchanged
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert [s[0] for s in seen] == ["before_training", "after_training", "cleanup"]
    assert seen[-1][1] == "transformers"
