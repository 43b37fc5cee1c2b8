"""GradientFlowHook's CPU hand-off to its statistics thread (pprobe/hooks/builtin.py):
references guarded by version counters, the copy fallback, values against NumPy, results
unchanged. In-process around real torch loops, and end to end through the bootstrap."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_script, sql

from pprobe import _report, state
from pprobe import hooks as ph
from pprobe.ext import tables
from pprobe.hooks import builtin, dispatch

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


pytestmark = pytest.mark.usefixtures("hook_state")


def rows() -> list[dict[str, Any]]:
    tables.flush()
    return list(tables.memory.get("gradient_flow", []))


def numpy_stats(g: Any) -> dict[str, float]:
    a = g.detach().numpy().astype(np.float64)
    return {"norm": float(np.sqrt((a * a).sum())), "max_abs": float(np.abs(a).max()),
            "mean": float(a.mean()), "mean_abs": float(np.abs(a).mean()),
            "zero_frac": float((a == 0).sum() / a.size),
            "nan_count": int(np.isnan(a).sum()), "inf_count": int(np.isinf(a).sum())}  # fmt: skip


def check_rows(got: list[dict[str, Any]], seen: dict[int, dict[str, Any]]) -> None:
    """Every row equals NumPy's statistics of the grads its step used."""
    for r in got:
        exp = numpy_stats(seen[r["step"]][r["param"]])
        assert r["norm"] == pytest.approx(exp["norm"], rel=1e-5), r
        assert r["mean"] == pytest.approx(exp["mean"], abs=1e-5 * exp["mean_abs"]), r
        for k in ("max_abs", "zero_frac", "nan_count", "inf_count"):
            assert r[k] == pytest.approx(exp[k], rel=1e-6), (r, k)


def loop(hook: Any, steps: int = 6, set_to_none: bool = True,
         after: Any = None) -> tuple[Any, dict[int, dict[str, Any]]]:  # fmt: skip
    """A real loop emitting the points; zero_grad before backward. ``after(model)`` runs
    right after opt.step(). Returns the model and each step's grads (copies, before step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if hook is not None:
        ph.add(hook)
        ph.register_service("optimizer", opt)
        ph.emit("before_training", model=model)
    seen: dict[int, dict[str, Any]] = {}
    for step in range(steps):
        x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
        if hook is not None:
            ph.emit("before_step", step=step, model=model)
        opt.zero_grad(set_to_none=set_to_none)
        F.cross_entropy(model(x), y).backward()
        seen[step] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        if after is not None:
            after(model)
        if hook is not None:
            ph.emit("after_step", step=step, model=model)
    if hook is not None:
        ph.emit("after_training", model=model)
        ph.emit("cleanup")
    return model, seen


def test_default_zero_grad_hands_the_grads_over_by_reference() -> None:
    h = builtin.GradientFlowHook(async_cpu=True)
    model, seen = loop(h)
    assert h._mode == "ref" and h.dropped_steps == 0
    got = rows()
    assert sorted({r["step"] for r in got}) == list(range(6))
    assert len(got) == 6 * len(list(model.parameters()))
    check_rows(got, seen)
    assert _report.warnings == []
    assert h._held == 0 and h._unverified == [] and not h._jobs  # nothing left behind


def test_set_to_none_false_falls_back_to_copies_without_losing_a_row() -> None:
    """The same grad tensors every step (zeroed and accumulated in place): found at the
    second hand-off (the first was a copy), copies from then on, said once."""
    h = builtin.GradientFlowHook(async_cpu=True)
    h.poll = 10.0  # the thread reads late: a reference would have been overwritten
    model, seen = loop(h, set_to_none=False)
    assert h._mode == "copy" and h.dropped_steps == 0
    got = rows()
    assert sorted({r["step"] for r in got}) == list(range(6))
    check_rows(got, seen)
    assert len(_report.warnings) == 1 and "set_to_none=False" in _report.warnings[0]


def test_grads_changed_in_place_after_the_step_drop_that_step_only() -> None:
    """Fresh grads each step (references), but the loop scales them in place after
    opt.step(): the version counter moved, so that step's rows are dropped (never wrong),
    and the hook copies from then on (the copies are taken before the write)."""

    def scale(model: Any) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.grad.mul_(3.0)

    h = builtin.GradientFlowHook(async_cpu=True)
    _, seen = loop(h, after=scale)
    # step 0: the probe copy; step 1: by reference, overwritten; steps 2..5: copies
    assert h.dropped_steps == 1 and h._mode == "copy"
    got = rows()
    assert sorted({r["step"] for r in got}) == [0, 2, 3, 4, 5]
    check_rows(got, seen)
    assert len(_report.warnings) == 1 and "in place after the step" in _report.warnings[0]


def test_a_thread_that_falls_behind_leaves_the_step_to_the_training_thread() -> None:
    """References held are bounded by max_snapshot_bytes: past it the statistics are
    computed at once on the training thread (no row lost)."""
    # one set of grads: 4 * 59 floats
    h = builtin.GradientFlowHook(async_cpu=True, max_snapshot_bytes=2000)
    h.poll = 10.0
    _, seen = loop(h)
    got = rows()
    assert sorted({r["step"] for r in got}) == list(range(6)) and h.dropped_steps == 0
    check_rows(got, seen)


def test_reused_finds_shared_storage() -> None:
    a, b = torch.ones(4), torch.zeros(3)
    assert builtin._reused(torch, [a, b], [b.view(3), torch.ones(4)])
    assert not builtin._reused(torch, [a, b], [a.clone(), b.clone()])
    assert not builtin._reused(torch, [torch.ones(0)], [torch.ones(0)])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_hook_on_never_changes_results(set_to_none: bool) -> None:
    on = loop(builtin.GradientFlowHook(async_cpu=True), set_to_none=set_to_none)[0]
    dispatch._reset()
    off = loop(None, set_to_none=set_to_none)[0]
    for (n, a), (_, b) in zip(on.state_dict().items(), off.state_dict().items()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), n


SCRIPT = """
import json, os, sys, torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
on = os.environ.get("HOOK") == "1"
keep = os.environ.get("SET_TO_NONE") == "1"
if on:
    from pprobe import hooks
    from pprobe.hooks import builtin
    hooks.add(builtin.GradientFlowHook(async_cpu=True))
    hooks.register_service("optimizer", opt)
    hooks.claim("script")
    hooks.emit("before_training", source="script", model=model)
x, y = torch.randn(5, 6), torch.tensor([0, 1, 1, 0, 1])
seen = []
for step in range(8):
    if on:
        hooks.emit("before_step", source="script", step=step, model=model)
    opt.zero_grad(set_to_none=keep)
    F.cross_entropy(model(x), y).backward()
    seen.append({n: p.grad.tolist() for n, p in model.named_parameters()})
    opt.step()
    if on:
        hooks.emit("after_step", source="script", step=step, model=model)
json.dump({"grads": seen, "params": {n: p.detach().numpy().tobytes().hex()
           for n, p in model.state_dict().items()}}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("set_to_none", ["1", "0"])
def test_end_to_end_rows_equal_numpy_and_bit_identical(tmp_path: Path, set_to_none: str) -> None:
    env = {"PPROBE_MODE": "log", "SET_TO_NONE": set_to_none}
    on = run_script(tmp_path / "on", SCRIPT, str(tmp_path / "on.json"),
                    env={**env, "HOOK": "1"})  # fmt: skip
    on.check()  # no after_training / cleanup emitted: the rows are written at exit
    off = run_script(tmp_path / "off", SCRIPT, str(tmp_path / "off.json"), env=env)
    off.check()
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("on.json", "off.json"))
    assert a["params"] == b["params"]  # the hook changed nothing
    got = sql(on.run_dir, "SELECT * FROM python.gradient_flow ORDER BY step, param")
    assert len(got) == 8 * 4
    for r in got:
        g = np.array(a["grads"][r["step"]][r["param"]], dtype=np.float32)
        assert r["norm"] == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-5)
        assert r["max_abs"] == float(np.abs(g).max())
        assert r["zero_frac"] == float((g == 0).sum() / g.size)
        assert r["nan_count"] == 0 and r["inf_count"] == 0 and math.isfinite(r["mean"])
        assert r["mean"] == pytest.approx(float(g.astype(np.float64).mean()),
                                          abs=1e-5 * float(np.abs(g).mean()) + 1e-12)  # fmt: skip


def test_handoff_copy_always_copies_and_bad_value_is_refused() -> None:
    h = builtin.GradientFlowHook(async_cpu=True, handoff="copy")
    _, seen = loop(h)
    assert h._mode == "copy" and h._held == 0 and _report.warnings == []
    got = rows()
    assert sorted({r["step"] for r in got}) == list(range(6))
    check_rows(got, seen)
    with pytest.raises(ValueError, match="handoff must be 'auto' or 'copy'"):
        builtin.GradientFlowHook(handoff="never")


@pytest.mark.parametrize("min_bytes", [4 << 20, 1])
def test_auto_uses_the_thread_only_for_grads_past_async_min_bytes(min_bytes: int) -> None:
    """async_cpu="auto" (the default): small grads are read on the training thread, with no
    statistics thread; grads of at least async_min_bytes go to the thread (more than one
    core). The rows are the same either way."""
    h = builtin.GradientFlowHook(async_min_bytes=min_bytes)
    assert h.async_cpu == "auto"
    _, seen = loop(h)
    threaded = min_bytes == 1 and state.cores() > 1
    assert (h._mode != "probe") is threaded  # the first hand-off decides the mode
    got = rows()
    assert sorted({r["step"] for r in got}) == list(range(6))
    check_rows(got, seen)
    for bad in ("yes", 2, None):
        with pytest.raises(ValueError, match="async_cpu must be 'auto', true or false"):
            builtin.GradientFlowHook(async_cpu=bad)


def test_the_steady_path_writes_the_rows_the_full_path_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the training thread (grads under async_min_bytes), steps after the first take the
    steady path (one native call, no layout work); a step where a grad is missing (a frozen
    layer) goes back to the full path, and so does the step after it (the layout changed).
    Every row equals NumPy's statistics of the grads its step used."""
    h = builtin.GradientFlowHook(frequency=1, async_cpu=False)
    full: list[int] = []
    real = h._compute
    monkeypatch.setattr(h, "_compute", lambda step, params: full.append(step) or real(step, params))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ph.add(h)
    ph.register_service("optimizer", opt)
    ph.emit("before_training", model=model)
    seen: dict[int, dict[str, Any]] = {}
    for step in range(7):
        model[0].bias.requires_grad_(step != 3)  # step 3: no grad for 0.bias
        ph.emit("before_step", step=step, model=model)
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(4, 5)), torch.randint(0, 3, (4,))).backward()
        seen[step] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        ph.emit("after_step", step=step, model=model)
    ph.emit("cleanup")
    got = rows()
    check_rows(got, seen)
    assert sorted((r["step"], r["param"]) for r in got) == sorted(
        (s, n) for s, grads in seen.items() for n in grads
    )
    assert {r["step"] for r in got if r["param"] == "0.bias"} == {0, 1, 2, 4, 5, 6}
    if builtin.native_grad_columns(torch, [torch.ones(2)]) is not None:
        assert full == [0, 3, 4]  # the others took the steady path
