"""The built-in hooks (pprobe/hooks/builtin.py): TimeTracking, SystemMonitor, GradientFlow,
FeatureMap, in-process around a real torch loop and end to end through the bootstrap."""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_script, sql

from pprobe import hooks as ph
from pprobe.ext import tables
from pprobe.hooks import HookRegistry, builtin, dispatch

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


pytestmark = pytest.mark.usefixtures("hook_state")


def rows(table: str) -> list[dict[str, Any]]:
    tables.flush()
    return list(tables.memory.get(table, []))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x: Any) -> Any:
        return self.fc(self.act(self.conv(x)).flatten(1))


def train(steps: int = 6, epochs: int = 2, emit: bool = True, zero_after: bool = True,
          seen: list[Any] | None = None) -> Any:  # fmt: skip
    """A real loop; ``seen``: the grads (copies) each step used, and each step's input."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(4, 2, 5, 5), torch.randint(0, 3, (4,))) for _ in range(3)]
    if emit:
        ph.register_service("optimizer", opt)
        ph.register_service("model", model)
        ph.emit("before_training", model=model)
    step = 0
    for epoch in range(epochs):
        if emit:
            ph.emit("before_epoch", epoch=epoch, model=model)
        for _ in range(steps // epochs):
            x, y = data[step % len(data)]
            if emit:
                ph.emit("before_step", step=step, model=model)
            if not zero_after:
                opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if seen is not None:
                seen.append(({n: p.grad.clone() for n, p in model.named_parameters()}, x))
            opt.step()
            if zero_after:
                opt.zero_grad()  # set_to_none: after the step the grads are gone
            if emit:
                ph.emit(
                    "after_step", step=step, model=model, metrics={"loss": float(loss.detach())}
                )
            step += 1
        if emit:
            ph.emit("after_epoch", epoch=epoch, model=model)
    if emit:
        ph.emit("after_training", model=model)
        ph.emit("cleanup")
    return model


def expected_stats(g: Any) -> dict[str, float]:
    a = g.detach().numpy().astype(np.float64)
    return {
        "norm": float(np.sqrt((a * a).sum())),
        "max_abs": float(np.abs(a).max()),
        "mean": float(a.mean()),
        "mean_abs": float(np.abs(a).mean()),
        "zero_frac": float((a == 0).sum() / a.size),
        "nan_count": int(np.isnan(a).sum()),
        "inf_count": int(np.isinf(a).sum()),
    }


def test_registered_by_name_with_their_parameters(tmp_path: Path) -> None:
    for n in ("TimeTrackingHook", "SystemMonitorHook", "GradientFlowHook", "FeatureMapHook"):
        assert n in HookRegistry.names()
    h = HookRegistry.create("SystemMonitorHook", frequency=10, interval=2, track_gpu=False)
    assert (h.frequency, h.interval, h.track_gpu) == (10, 2.0, False)
    with pytest.raises(TypeError, match="no parameter colour"):
        HookRegistry.create("TimeTrackingHook", colour=1)
    with pytest.raises(ValueError, match="interval"):
        HookRegistry.create("SystemMonitorHook", interval=0)
    with pytest.raises(ValueError, match="max_features"):
        HookRegistry.create("FeatureMapHook", max_features=0)


@pytest.mark.parametrize("async_cpu", [True, False])
def test_gradient_flow_reads_the_grads_the_step_used(async_cpu: bool) -> None:
    """The loop zeroes the grads (to None) right after opt.step(): the optimizer pre-hook
    still saw them; every statistic equals NumPy's on a copy taken after backward."""
    ph.add(builtin.GradientFlowHook(async_cpu=async_cpu))
    seen: list[Any] = []
    model = train(seen=seen)
    got = rows("gradient_flow")
    names = [n for n, _ in model.named_parameters()]
    assert len(got) == len(seen) * len(names)
    for r in got:
        exp = expected_stats(seen[r["step"]][0][r["param"]])
        assert r["norm"] == pytest.approx(exp["norm"], rel=1e-5), r
        # summed in float32 (the grads' dtype): its error scales with the magnitudes summed
        assert r["mean"] == pytest.approx(exp["mean"], abs=1e-5 * exp["mean_abs"]), r
        for k in ("max_abs", "zero_frac", "nan_count", "inf_count"):
            assert r[k] == pytest.approx(exp[k], rel=1e-6), (r, k)
    assert {r["param"] for r in got} == set(names)
    assert {r["numel"] for r in got if r["param"] == "conv.weight"} == {6 * 2 * 3 * 3}


def test_gradient_flow_without_optimizer_counts_nan_inf_zero() -> None:
    """No optimizer known: after_step reads the model's .grad as they are."""
    model = nn.Linear(4, 3)
    g = torch.tensor([[0.0, 1.0, float("nan"), -2.0], [float("inf"), 0.0, 0.0, 3.0],
                      [float("-inf"), 0.5, 0.0, 0.0]])  # fmt: skip
    model.weight.grad = g.clone()
    model.bias.grad = torch.zeros(3)
    h = ph.add(builtin.GradientFlowHook(frequency=2))
    for s in range(4):
        ph.emit("after_step", step=s, model=model)
    h.cleanup()
    got = rows("gradient_flow")
    assert sorted({r["step"] for r in got}) == [0, 2]
    w = next(r for r in got if r["param"] == "weight")
    b = next(r for r in got if r["param"] == "bias")
    assert (w["nan_count"], w["inf_count"]) == (1, 2)
    assert w["zero_frac"] == 5 / 12
    assert math.isnan(w["norm"]) and w["max_abs"] == math.inf or math.isnan(w["max_abs"])
    assert b == {**b, "norm": 0.0, "max_abs": 0.0, "mean": 0.0, "zero_frac": 1.0}


def test_time_tracking_rows_throughput_eta_and_log_file(tmp_path: Path) -> None:
    ph.register_service("experiment_dir", str(tmp_path))
    ph.add(builtin.TimeTrackingHook(batch_size=4, total_steps=6, log_to_file=True,
                                    log_path="tt/time.log"))  # fmt: skip
    train(steps=6, epochs=2)
    got = rows("time_tracking")
    steps = [r for r in got if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(6))
    for r in steps:
        assert r["duration_s"] > 0
    for r in steps[1:]:
        assert r["steps_per_s"] == pytest.approx(1 / r["avg_step_s"])
        assert r["samples_per_s"] == pytest.approx(4 / r["avg_step_s"])
        mean = (r["elapsed_s"] - steps[0]["elapsed_s"]) / r["step"]
        assert r["eta_s"] == pytest.approx((6 - r["step"] - 1) * mean, rel=1e-6)
    assert steps[-1]["eta_s"] == 0
    epochs = [r for r in got if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1] and all(r["duration_s"] > 0 for r in epochs)
    assert [r["event"] for r in got].count("training") == 1
    log = (tmp_path / "logs" / "tt" / "time.log").read_text().splitlines()
    assert len(log) == len(got) and log[1].startswith("step step=1 ")
    assert "samples_per_s=" in log[1]


def test_time_tracking_steps_per_second_without_batch_size() -> None:
    ph.add(builtin.TimeTrackingHook(frequency=2))
    train(steps=6, epochs=1)
    steps = [r for r in rows("time_tracking") if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 2, 4]
    assert all(r["samples_per_s"] is None and r["eta_s"] is None for r in steps)
    # two steps between rows: the mean step time is half the time between them
    assert steps[2]["avg_step_s"] == pytest.approx(
        (steps[2]["elapsed_s"] - steps[1]["elapsed_s"]) / 2
    )


@pytest.mark.parametrize("with_psutil", [True, False])
def test_system_monitor(with_psutil: bool, monkeypatch: Any) -> None:
    psutil = pytest.importorskip("psutil")
    if not with_psutil:
        monkeypatch.setitem(sys.modules, "psutil", None)  # the /proc fallback
    h = ph.add(builtin.SystemMonitorHook(interval=0.01, frequency=2))
    train(steps=6, epochs=2)
    got = rows("system_monitor")
    assert [r["step"] for r in got if r["event"] == "step"] == [0, 2, 4]
    assert [r["epoch"] for r in got if r["event"] == "epoch"] == [0]  # frequency 2 on epochs
    monkeypatch.undo()
    rss = psutil.Process().memory_info().rss
    total = psutil.virtual_memory().total
    for r in got:
        assert r["hook"] == "SystemMonitorHook" and r["cpu_percent"] >= 0
        assert r["sys_mem_total_bytes"] == total
        assert 0 < r["sys_mem_used_bytes"] < total
        assert 0.5 * rss < r["rss_bytes"] < 2 * rss
        assert r.get("gpu") is None  # CPU-only process: no GPU row
    assert h.sampler is None  # cleanup stopped the thread
    assert not any(t.name == "pprobe-sysmon" for t in __import__("threading").enumerate())


def _png(path: Path) -> np.ndarray:
    """Decode our 8-bit grayscale, filter-0 PNG independently (PIL when present)."""
    try:
        from PIL import Image

        return np.asarray(Image.open(path))
    except ImportError:
        data = path.read_bytes()
        w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        idat = data[data.index(b"IDAT") + 4 :]
        raw = zlib.decompress(idat[: int.from_bytes(data[data.index(b"IDAT") - 4 :][:4], "big")])
        return np.frombuffer(raw, np.uint8).reshape(h, w + 1)[:, 1:]


def test_feature_maps_stats_and_png(tmp_path: Path) -> None:
    ph.register_service("experiment_dir", str(tmp_path))
    h = ph.add(builtin.FeatureMapHook(frequency=3, max_features=4, sample_batch_idx=1))
    seen: list[Any] = []
    model = train(steps=6, epochs=1, seen=seen)
    got = rows("feature_maps")
    assert sorted({r["step"] for r in got}) == [0, 3]
    assert {r["module"] for r in got} == {"conv", "act", "fc"}
    # independently: the parameters changed since, so recompute each watched step's outputs
    # from a fresh model trained the same way up to that step
    for step in (0, 3):
        torch.manual_seed(0)
        m2 = Net()
        opt = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
        data = [(torch.randn(4, 2, 5, 5), torch.randint(0, 3, (4,))) for _ in range(3)]
        for s in range(step):
            x, y = data[s % 3]
            F.cross_entropy(m2(x), y).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            conv = m2.conv(seen[step][1]).numpy().astype(np.float64)
        r = next(r for r in got if r["step"] == step and r["module"] == "conv")
        assert r["shape"] == [4, 6, 5, 5] and r["module_type"] == "Conv2d"
        assert r["mean"] == pytest.approx(conv.mean(), rel=1e-6)
        assert r["std"] == pytest.approx(conv.std(ddof=1), rel=1e-6)
        assert (r["min"], r["max"]) == pytest.approx((conv.min(), conv.max()), rel=1e-6)
        act = next(r for r in got if r["step"] == step and r["module"] == "act")
        assert act["zero_frac"] == (np.maximum(conv, 0) == 0).mean()
        img = _png(tmp_path / r["image"])
        assert r["image"] == f"visualization/FeatureMapHook/step{step:06d}_conv.png"
        assert img.shape == (2 * 5 + 1, 2 * 5 + 1)  # 4 channels: 2 x 2, 1 px apart
        for k in range(4):
            ch = conv[1, k]
            exp = np.rint((ch - ch.min()) * 255.0 / (ch.max() - ch.min())).astype(np.uint8)
            y0, x0 = (k // 2) * 6, (k % 2) * 6
            assert np.abs(img[y0 : y0 + 5, x0 : x0 + 5].astype(int) - exp).max() <= 1
        assert all(r["image"] is None for r in got if r["module"] != "conv")
    assert len(h.images) == 2
    assert not model.conv._forward_hooks  # cleanup removed them


def test_png_writer_roundtrip(tmp_path: Path) -> None:
    pil = pytest.importorskip("PIL.Image")
    a = (np.arange(35, dtype=np.uint8) * 7).reshape(5, 7)
    p = tmp_path / "x.png"
    p.write_bytes(builtin.png_gray(a))
    assert np.array_equal(np.asarray(pil.open(p)), a)


def _final_params(hooks_on: bool, tmp_path: Path) -> dict[str, bytes]:
    dispatch._reset()
    if hooks_on:
        ph.register_service("experiment_dir", str(tmp_path))
        for h in (
            builtin.TimeTrackingHook(log_to_file=True),
            builtin.GradientFlowHook(),
            builtin.SystemMonitorHook(interval=0.01),
            builtin.FeatureMapHook(frequency=1),
        ):
            ph.add(h)  # fmt: skip
    m = train(steps=8, epochs=2, emit=hooks_on)
    return {n: p.detach().numpy().tobytes() for n, p in m.state_dict().items()}


def test_all_builtins_on_never_change_results(tmp_path: Path) -> None:
    assert _final_params(True, tmp_path) == _final_params(False, tmp_path)


SCRIPT = """
import hashlib, os, torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
on = os.environ.get("HOOKS") == "1"
if on:
    from pprobe import hooks
    from pprobe.hooks import HookRegistry
    for t, kw in [("TimeTrackingHook", {"log_to_file": True}), ("GradientFlowHook", {}),
                  ("SystemMonitorHook", {"interval": 0.01}), ("FeatureMapHook", {"frequency": 2})]:
        hooks.add(HookRegistry.create(t, **kw))
    hooks.register_service("optimizer", opt)
    hooks.claim("script")  # this script emits the points itself: zero-code emission stops
    hooks.emit("before_training", source="script", model=model)
x, y = torch.randn(3, 1, 6, 6), torch.tensor([0, 1, 1])
for step in range(5):
    if on:
        hooks.emit("before_step", source="script", step=step, model=model)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    if on:
        hooks.emit("after_step", source="script", step=step, model=model)
if on:
    hooks.emit("after_training", source="script", model=model)
    hooks.emit("cleanup", source="script")
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
print("PARAMS", h.hexdigest())
"""


def test_end_to_end_tables_files_and_bit_identical(tmp_path: Path) -> None:
    on = run_script(tmp_path / "on", SCRIPT, env={"HOOKS": "1", "PPROBE_MODE": "log"}).check()
    off = run_script(tmp_path / "off", SCRIPT, env={"PPROBE_MODE": "log"}).check()
    digest = [line for line in on.out.splitlines() if line.startswith("PARAMS")]
    assert digest and digest == [x for x in off.out.splitlines() if x.startswith("PARAMS")]
    run = on.run_dir
    got = sql(run, "SELECT param, count(*) AS n FROM python.gradient_flow GROUP BY 1 ORDER BY 1")
    assert [(r["param"], r["n"]) for r in got] == [
        (n, 5) for n in ("0.bias", "0.weight", "3.bias", "3.weight")
    ]
    tt = sql(run, "SELECT step FROM python.time_tracking WHERE event = 'step' ORDER BY step")
    assert [r["step"] for r in tt] == list(range(5))
    sm = sql(run, "SELECT count(*) AS n, min(rss_bytes) AS rss FROM python.system_monitor")
    assert sm[0]["n"] == 5 and sm[0]["rss"] > 0
    fm = sql(run, "SELECT image FROM python.feature_maps WHERE image IS NOT NULL ORDER BY step")
    assert [r["image"] for r in fm] == [
        f"visualization/FeatureMapHook/step{s:06d}_0.png" for s in (0, 2, 4)
    ]
    for r in fm:
        assert (run / r["image"]).read_bytes().startswith(b"\x89PNG")
    assert len((run / "logs" / "time_tracking.log").read_text().splitlines()) == 6
    # the hooks' own torch calls are not ops of the program
    n_on = sql(run, "SELECT count(*) AS n FROM ops")[0]["n"]
    assert n_on == sql(off.run_dir, "SELECT count(*) AS n FROM ops")[0]["n"]


ZERO_CODE = """
import json, torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
ds = TensorDataset(torch.randn(12, 1, 6, 6), torch.randint(0, 2, (12,)))
loader = DataLoader(ds, batch_size=4, shuffle=False)
norms = []
for epoch in range(2):
    for x, y in loader:
        F.cross_entropy(net(x), y).backward()
        norms.append({n: float(p.grad.double().norm()) for n, p in net.named_parameters()})
        opt.step()
        opt.zero_grad()  # after the step: the grads are gone by after_step
json.dump({"norms": norms,
           "weights": [p.detach().double().flatten().tolist() for p in net.parameters()]},
          open("truth.json", "w"))
"""

ZERO_CODE_TOML = """
mode = "log"
[[hooks]]
type = "TimeTrackingHook"
total_epochs = 2
log_to_file = true
[[hooks]]
type = "SystemMonitorHook"
frequency = 2
interval = 0.05
[[hooks]]
type = "GradientFlowHook"
[[hooks]]
type = "FeatureMapHook"
frequency = 3
max_features = 2
[[hooks]]
type = "ExportHook"
exporter = "csv"
path = "m.csv"
"""


def test_zero_code_from_pprobe_toml(tmp_path: Path) -> None:
    """No line of hook code: the four built-ins from pprobe.toml on a plain torch loop with a
    DataLoader (zero-code emission, the lifecycle branch); the results are unchanged."""
    import json

    on, off = tmp_path / "on", tmp_path / "off"
    (on / "pprobe.toml").parent.mkdir(parents=True)
    (on / "pprobe.toml").write_text(ZERO_CODE_TOML)
    r = run_script(on, ZERO_CODE).check()
    run_script(off, ZERO_CODE, env={"PPROBE_MODE": "log"}).check()
    truth = json.loads((on / "truth.json").read_text())
    assert truth["weights"] == json.loads((off / "truth.json").read_text())["weights"]
    run = r.run_dir
    gf = sql(run, "SELECT step, param, norm FROM python.gradient_flow ORDER BY step, param")
    assert [(x["step"], x["param"]) for x in gf] == [
        (s, n) for s in range(6) for n in sorted(truth["norms"][0])
    ]
    for x in gf:
        assert x["norm"] == pytest.approx(truth["norms"][x["step"]][x["param"]], rel=1e-5)
    tt = sql(run, "SELECT * FROM python.time_tracking ORDER BY ts_ns")
    steps = [x for x in tt if x["event"] == "step"]
    assert [x["step"] for x in steps] == list(range(6))
    assert [x["epoch"] for x in tt if x["event"] == "epoch"] == [0, 1]
    # each step timed from its opening (zero-code detection's stamp: TimeTracking has no
    # before_step), which comes after the last row's time
    assert all(x["duration_s"] > 0 for x in steps)
    for x in steps[1:]:  # batch size and total from the train_loader service
        assert x["samples_per_s"] == pytest.approx(4 / x["avg_step_s"])
        assert x["duration_s"] < x["avg_step_s"]
    assert steps[-1]["eta_s"] == 0
    assert (run / "logs" / "time_tracking.log").read_text().count("\n") == len(tt)
    sm = sql(run, "SELECT step FROM python.system_monitor WHERE event = 'step' ORDER BY step")
    assert [x["step"] for x in sm] == [0, 2, 4]
    fm = sql(run, "SELECT step, image FROM python.feature_maps WHERE module = '0' ORDER BY step")
    # zero-code before_step(0) fires at the first opt.step(), after step 0's forward
    assert [x["step"] for x in fm] == [3]
    for x in fm:
        assert (run / x["image"]).read_bytes().startswith(b"\x89PNG")
    assert "pprobe: hook" not in r.err  # no hook failed
    with open(run / "logs" / "m.csv") as fh:  # the exporter from [[hooks]]
        csv_rows = [line.split(",") for line in fh.read().splitlines()[1:]]
    got = {(int(c[0]), c[1]): float(c[2]) for c in csv_rows}
    for x in gf:
        assert got[(x["step"], f"gradient_flow/{x['param']}/norm")] == x["norm"]
