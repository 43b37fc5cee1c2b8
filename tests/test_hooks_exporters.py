"""Exporters (pprobe/hooks/exporters.py): CSV and TensorBoard, the bounded buffer, retries with
backoff, the circuit breaker and the dropped-row count; in-process and end to end."""

from __future__ import annotations

import csv
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import run_script, sql

from pprobe import hooks as ph
from pprobe.ext import tables
from pprobe.hooks import dispatch, exporters


@pytest.fixture(autouse=True)
def _clean() -> Any:
    dispatch._reset()
    exporters._reset()
    tables.clear_rows()
    yield
    exporters._reset()
    dispatch._reset()
    tables.taps.clear()
    tables.clear_rows()


def errors() -> list[dict[str, Any]]:
    tables.flush()
    return list(tables.memory.get("errors", []))


class Memory(exporters.Exporter):
    """Keeps what it got; fails ``fail`` times first (or always with fail=-1)."""

    def __init__(self, fail: int = 0, name: str = "mem") -> None:
        self.fail, self.name = fail, name
        self.got: list[tuple[int, dict[str, float]]] = []
        self.calls = 0
        self.closed = False

    def log(self, values: dict[str, float], step: int) -> None:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionError("tracker unreachable")
        self.got.append((step, dict(values)))

    def close(self) -> None:
        self.closed = True


def test_to_scalars_tags() -> None:
    got = exporters.to_scalars(
        "gradient_flow",
        [
            {"step": 3, "hook": "g", "param": "fc.weight", "norm": 2.5, "nan_count": 0},
            {"step": 3, "hook": "g", "param": "fc.bias", "norm": 0.5, "flag": True},
            {"step": 4, "hook": "g", "param": "fc.bias", "norm": float("nan"), "note": "x"},
        ],
    )
    assert got == [
        (3, {"gradient_flow/fc.weight/norm": 2.5, "gradient_flow/fc.weight/nan_count": 0.0,
             "gradient_flow/fc.bias/norm": 0.5}),
    ]  # fmt: skip
    assert exporters.to_scalars("metrics", [{"step": 2, "name": "loss", "value": 0.25}]) == [
        (2, {"loss": 0.25})
    ]
    tt = exporters.to_scalars("time_tracking", [{"step": 1, "event": "step", "duration_s": 0.1}])
    assert tt == [(1, {"time_tracking/step/duration_s": 0.1})]


def test_forwards_metrics_and_hook_tables_in_order() -> None:
    f = exporters.Forwarder(thread=False)
    mem = f.add(Memory())
    for s in range(5):
        tables._add("metrics", [{"name": "loss", "value": 1.0 / (s + 1)}], {"step": s})
        tables._add("time_tracking", [{"event": "step", "step": s, "duration_s": s * 0.5}])
        tables._add("mine", [{"step": s, "x": 1.0}])  # not a forwarded table
        tables._add("errors", [{"source": "x"}])  # never forwarded
    f.pump(0.0)
    assert [s for s, _ in mem.got] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [v for s, v in mem.got if "loss" in v] == [{"loss": 1.0 / (s + 1)} for s in range(5)]
    assert [v for s, v in mem.got if "loss" not in v] == [
        {"time_tracking/step/duration_s": s * 0.5} for s in range(5)
    ]
    f.close()
    assert mem.closed and tables.taps == []


def test_rows_recorded_just_before_close_reach_the_exporters() -> None:
    """The built-in hooks' rows and pprobe.record's wait on the program's thread for the
    drain; closing the exporters drains them first, so the last step's rows are sent."""
    from pprobe.hooks import builtin

    f = exporters.Forwarder(thread=False)
    mem = f.add(Memory())
    builtin.record("time_tracking", {"event": "step", "step": 3, "duration_s": 0.25})
    builtin.record_columns("gradient_flow", {"hook": ["g"], "step": [3], "param": ["w"],
                                             "norm": [2.0]})  # fmt: skip
    tables.record("time_tracking", {"event": "step", "step": 4, "duration_s": 0.5})
    f.close()
    got = {k: v for _, values in mem.got for k, v in values.items()}
    assert got["time_tracking/step/duration_s"] == 0.5 and mem.closed
    assert any(k.startswith("gradient_flow/") and v == 2.0 for k, v in got.items()), got


def test_sampled_metrics_reach_the_exporters() -> None:
    """A ``@metric`` sampled at a step boundary goes to the exporters like a recorded row."""
    f = exporters.Forwarder(thread=False)
    mem = f.add(Memory())
    n = iter(range(100))
    tables.register_metric("sampled", lambda: float(next(n)))
    try:
        for _ in range(3):
            tables.sample("step")
        f.pump(0.0)
    finally:
        tables.unregister("metric", "sampled")
    assert [v for _, v in mem.got] == [{"sampled": 0.0}, {"sampled": 1.0}, {"sampled": 2.0}]
    f.close()


def test_retried_with_backoff_then_delivered_in_order() -> None:
    f = exporters.Forwarder(thread=False, backoff=1.0, max_retries=5)
    mem = f.add(Memory(fail=3))
    for s in range(3):
        tables._add("metrics", [{"name": "m", "value": float(s)}], {"step": s})
    t = 0.0
    f.pump(t)  # fails: retry after 1 s
    assert mem.calls == 1 and f.targets[0].retry_at == 1.0
    f.pump(0.5)  # inside the backoff: not called
    assert mem.calls == 1
    f.pump(1.0)  # fails again: 2 s
    assert f.targets[0].retry_at == 3.0
    f.pump(3.0)  # fails a third time: 4 s
    assert f.targets[0].retry_at == 7.0
    f.pump(7.0)
    assert mem.got == [(s, {"m": float(s)}) for s in range(3)]
    ev = [e["event"] for e in errors()]
    assert ev == ["raised", "recovered"]


def test_circuit_opens_then_half_open_retry(capsys: Any) -> None:
    f = exporters.Forwarder(thread=False, backoff=0.1, max_retries=3, cooldown=60.0)
    bad = f.add(Memory(fail=-1, name="bad"))
    good = f.add(Memory(name="good"))
    tables._add("metrics", [{"name": "m", "value": 1.0}], {"step": 0})
    t = 0.0
    for _ in range(20):  # the clock runs past every backoff
        f.pump(t)
        t += 1.0
    assert bad.calls == 3 and f.targets[0].broken  # 3 tries, then the circuit opened
    assert good.got == [(0, {"m": 1.0})]  # the other exporter is not held up
    f.pump(63.0)  # the cool-down is over: one more try
    assert bad.calls == 4
    f.pump(64.0)
    assert bad.calls == 4
    err = capsys.readouterr().err
    assert err.count("exporter bad raised ConnectionError") == 1
    assert err.count("circuit open, tried again in 60 s") == 1
    ev = [(e["source"], e["event"]) for e in errors()]
    assert ev == [("exporter bad", "raised"), ("exporter bad", "circuit open")]
    f.close()  # what it never got is counted as dropped
    drop = [e for e in errors() if e["event"] == "dropped"]
    assert [(e["source"], e["dropped"]) for e in drop] == [("exporter bad", 1)]


def test_buffer_limit_drops_and_counts() -> None:
    f = exporters.Forwarder(thread=False, buffer_rows=10)
    mem = f.add(Memory())
    for s in range(25):
        tables._add("metrics", [{"name": "m", "value": float(s)}], {"step": s})
    f.pump(0.0)
    assert [s for s, _ in mem.got] == list(range(10))  # the first 10 rows, then full
    drop = [e for e in errors() if e["event"] == "dropped"]
    assert [(e["source"], e["dropped"], e["error"]) for e in drop] == [
        ("exporters", 15, "BufferFull")
    ]


def test_a_blocked_exporter_never_blocks_the_training_thread() -> None:
    release = threading.Event()
    entered = threading.Event()

    class Stuck(Memory):
        def log(self, values: dict[str, float], step: int) -> None:
            entered.set()
            release.wait()
            super().log(values, step)

    f = exporters.Forwarder(buffer_rows=50, poll=0.01)
    st = f.add(Stuck())
    tables._add("metrics", [{"name": "m", "value": 0.0}], {"step": 0})
    assert entered.wait(30)  # the exporter thread is now stuck inside log()
    for s in range(1, 201):  # the training thread goes on while it is stuck
        tables._add("metrics", [{"name": "m", "value": float(s)}], {"step": s})
    assert f.dropped_total == 150  # 50 buffered, the rest counted
    release.set()
    f.close()
    assert [s for s, _ in st.got] == list(range(51))
    assert sum(e.get("dropped") or 0 for e in errors()) == 150


def test_csv_and_tensorboard(tmp_path: Path) -> None:
    f = exporters.Forwarder(thread=False)
    f.add(exporters.CSVExporter(path=str(tmp_path / "m.csv")))
    tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pytest.importorskip("torch")
    f.add(exporters.TensorBoardExporter(log_dir=str(tmp_path / "tb")))
    for s in range(4):
        tables._add("metrics", [{"name": "loss", "value": 2.0 - s / 4}], {"step": s})
        tables._add("gradient_flow", [{"step": s, "param": "w", "norm": s * 1.5}])
    f.pump(0.0)
    f.close()
    with open(tmp_path / "m.csv") as fh:
        got = list(csv.DictReader(fh))
    assert [(int(r["step"]), r["tag"], float(r["value"])) for r in got] == [
        x
        for s in range(4)
        for x in ((s, "loss", 2.0 - s / 4), (s, "gradient_flow/w/norm", s * 1.5))
    ]
    acc = tb.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["gradient_flow/w/norm", "loss"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s, 2.0 - s / 4) for s in range(4)]


def test_add_by_type_and_errors(tmp_path: Path) -> None:
    ex = exporters.add("csv", path=str(tmp_path / "a.csv"))
    assert isinstance(ex, exporters.CSVExporter)
    with pytest.raises(KeyError, match="unknown exporter type 'wandb'; allowed: CSVExporter"):
        exporters.add("wandb")
    with pytest.raises(TypeError, match="exporter 'csv'"):
        exporters.add("csv", colour=1)
    with pytest.raises(TypeError, match="needs a log"):
        exporters.add(object())
    got = exporters.from_config([{"type": "csv", "path": str(tmp_path / "b.csv")}])
    assert isinstance(got[0], exporters.CSVExporter)


SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn
import pprobe
from pprobe import hooks
from pprobe.hooks import builtin, exporters
torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
exporters.add("csv")  # <run>/logs/metrics.csv
exporters.add("tensorboard")  # <run>/logs/tensorboard
hooks.add(builtin.GradientFlowHook())
hooks.register_service("optimizer", opt)
hooks.claim("script")  # this script emits the points itself: zero-code emission stops
x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
for step in range(6):
    hooks.emit("before_step", source="script", step=step, model=model)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    pprobe.record("metrics", {"name": "loss", "value": float(loss.detach()), "step": step})
    hooks.emit("after_step", source="script", step=step, model=model)
"""


def test_end_to_end_csv_and_tensorboard_match_the_tables(tmp_path: Path) -> None:
    r = run_script(tmp_path, SCRIPT, env={"PPROBE_MODE": "log"}).check()
    run = r.run_dir
    with open(run / "logs" / "metrics.csv") as fh:
        got = {(int(x["step"]), x["tag"]): float(x["value"]) for x in csv.DictReader(fh)}
    gf = sql(run, "SELECT step, param, norm, max_abs FROM python.gradient_flow")
    loss = sql(run, "SELECT step, value FROM python.metrics WHERE name = 'loss'")
    want = {(x["step"], f"gradient_flow/{x['param']}/{k}"): x[k] for x in gf for k in
            ("norm", "max_abs")}  # fmt: skip
    want.update({(x["step"], "loss"): x["value"] for x in loss})
    assert len(gf) == 12 and len(loss) == 6
    assert {k: got[k] for k in want} == want
    tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = tb.EventAccumulator(str(run / "logs" / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
        (x["step"], pytest.approx(x["value"], rel=1e-6)) for x in loss
    ]
    assert not [e for e in sql(run, "SELECT * FROM python.errors")]
    assert len(list((run / "logs" / "tensorboard").iterdir())) == 1  # one writer
    assert "internal error" not in r.err


def test_closed_at_the_cleanup_point_after_the_hooks_last_rows() -> None:
    mem = exporters.add(Memory())
    ph.emit("after_training")
    tables._add("metrics", [{"name": "last", "value": 1.0}], {"step": 9})
    ph.emit("cleanup")
    assert mem.closed and mem.got == [(9, {"last": 1.0})]
