"""The hooks' cheaper step path (docs/hooks-builtin.md, Cost), in process.

``dispatch.calls_none`` lets zero-code detection skip a step point's context and emit when no
hook would be called; it must agree with what :func:`dispatch.emit` actually calls, including
instance-level overrides, hooks switched off and overriding ``should_trigger`` rules (asked
exactly once per point). GradientFlow's ``before_step`` skips ``_install`` when nothing
changed and must still follow a new optimizer; ``_plain`` must keep a subclass's dispatch.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pprobe import _report
from pprobe import hooks as ph
from pprobe.hooks import BaseHook, dispatch, lifecycle


@pytest.fixture(autouse=True)
def _clean() -> Any:
    dispatch._reset()
    yield
    dispatch._reset()


class Rec(BaseHook):
    def __init__(self, log: list[Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.log = log

    def before_step(self, step: int) -> None:
        self.log.append((self.name, "before_step", step))

    def after_step(self, step: int) -> None:
        self.log.append((self.name, "after_step", step))


class AfterOnly(BaseHook):
    def __init__(self, log: list[Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.log = log

    def after_step(self, step: int) -> None:
        self.log.append((self.name, "after_step", step))


def test_calls_none_agrees_with_what_emit_calls() -> None:
    rnd = random.Random(7)
    for trial in range(40):
        dispatch._reset()
        log: list[Any] = []
        ruled = False
        for j in range(rnd.randint(0, 4)):
            kind = rnd.choice((Rec, AfterOnly, BaseHook))
            h = kind(log, name=f"h{j}", frequency=rnd.randint(1, 5)) if kind is not BaseHook \
                else BaseHook(name=f"h{j}")  # fmt: skip
            if rnd.random() < 0.2:
                h.off = True
            if rnd.random() < 0.2:  # an instance-level method on a hook without one

                def own(step: int, _n: str = h.name, _log: list[Any] = log) -> None:
                    _log.append((_n, "before_step", step))

                h.before_step = own  # type: ignore[method-assign]
            if rnd.random() < 0.15:  # idle at a point for now
                h.idle_points = frozenset({rnd.choice(("before_step", "after_step"))})
            if rnd.random() < 0.1:  # an instance-level rule: asked by emit, counted as called
                h.should_trigger = lambda step: step % 2 == 0  # type: ignore[method-assign]
                ruled = True
            ph.add(h)
        for s in range(12):
            for point in ("before_step", "after_step"):
                n = len(log)
                predicted = dispatch.calls_none(point, s)
                # the native core's twin (dispatch.calls_none once lifecycle detection is
                # loaded) and the Python function agree
                assert predicted == dispatch.py_calls_none(point, s), (trial, s, point)
                ph.emit(point, step=s)
                if ruled:  # its rule may say no: "none called" must still hold when said
                    assert not predicted or len(log) == n, (trial, s, point, log[n:])
                else:
                    assert predicted == (len(log) == n), (trial, s, point, log[n:])


def test_the_native_core_takes_the_idle_steps_with_python_twins() -> None:
    """With the native core, zero-code detection's listeners and pre-hook are its C twins
    (pprobe/_native.c, "lifecycle hooks' steps"), which hand the Python functions whatever
    is not an idle step; without it, the Python functions themselves."""
    from pprobe import core

    native = core.native
    if native is None:
        assert lifecycle._on_optimizer_pre is lifecycle._py_on_optimizer_pre
        assert dispatch.calls_none is dispatch.py_calls_none
        return
    assert lifecycle._on_optimizer_pre is native.lifecycle_pre
    assert lifecycle._on_step_ending is native.lifecycle_ending
    assert lifecycle._on_step_change is native.lifecycle_change
    assert dispatch.calls_none is native.calls_none


def test_an_overriding_should_trigger_is_asked_once_per_point_by_zero_code_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    log: list[Any] = []

    class Odd(Rec):
        def should_trigger(self, step: int) -> bool:
            asked.append(step)
            return step % 2 == 1

    ph.add(Odd(log, name="odd"))
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "steps_in_epoch", 0)
    monkeypatch.setattr(lifecycle, "_ctx", lambda: {})
    monkeypatch.setattr(lifecycle, "_step_metrics", lambda: {})
    assert not dispatch.calls_none("before_step", 2)  # its rule is asked by emit, not here
    for s in range(4):
        lifecycle._open_step(s)
        lifecycle._close_step()
    assert asked == [0, 0, 1, 1, 2, 2, 3, 3]
    assert log == [("odd", p, s) for s in (1, 3) for p in ("before_step", "after_step")]


def test_zero_code_steps_build_a_context_only_where_a_hook_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    log: list[Any] = []
    monkeypatch.setattr(lifecycle, "_ctx", lambda: built.append("ctx") or {})
    monkeypatch.setattr(lifecycle, "_step_metrics", lambda: built.append("metrics") or {})
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "steps_in_epoch", 0)
    monkeypatch.setattr(lifecycle, "started", True)
    ph.add(Rec(log, name="r", frequency=3))
    for s in range(10):
        lifecycle._open_step(s)
        lifecycle._on_step_ending(s, s + 1)  # the step-ending listener's shortcut
    fired = [s for s in range(10) if s % 3 == 0]
    assert log == [("r", p, s) for s in fired for p in ("before_step", "after_step")]
    assert built == ["ctx", "metrics", "ctx"] * len(fired)
    assert dispatch.get_service("step") == 9 and lifecycle.open_step is None


def test_a_frequency_changed_between_steps_is_followed_by_the_shortcut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[Any] = []
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "started", True)
    h = ph.add(Rec(log, name="r", frequency=4))
    seen = []
    for s in range(12):
        if s == 6:
            h.frequency = 5
        lifecycle._open_step(s)
        lifecycle._on_step_ending(s, s + 1)
        seen += [e[2] for e in log if e[1] == "after_step" and e[2] == s]
    assert seen == [0, 4, 10]


def test_gradient_flow_follows_a_new_optimizer_without_reinstalling_every_step() -> None:
    torch = pytest.importorskip("torch")
    from pprobe.hooks.builtin import GradientFlowHook

    model = torch.nn.Linear(3, 2)
    opt1 = torch.optim.SGD(model.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1)
    h = GradientFlowHook(frequency=1, async_cpu=False)
    calls: list[Any] = []
    real = h._install
    h._install = lambda m: calls.append(m) or real(m)  # type: ignore[method-assign]
    dispatch.register_service("optimizer", opt1)
    h.before_step(0, model=model)
    h.before_step(1, model=model)
    assert h._hooked is opt1 and len(calls) == 1
    dispatch.register_service("optimizer", opt2)
    h.before_step(2, model=model)
    assert h._hooked is opt2 and len(calls) == 2
    other = torch.nn.Linear(3, 2)
    h.before_step(3, model=other)
    assert h._model is other and len(calls) == 3
    h.cleanup()


def test_plain_keeps_a_subclass_dispatch() -> None:
    torch = pytest.importorskip("torch")
    from pprobe.hooks.builtin import _plain

    class Sub(torch.Tensor):
        pass

    t = torch.zeros(2)
    p = torch.nn.Parameter(torch.zeros(2))
    s = t.as_subclass(Sub)
    assert type(_plain(torch, [t, p])) is torch._C.DisableTorchFunction
    assert type(_plain(torch, [t, s])) is not torch._C.DisableTorchFunction
    assert type(_plain(torch, [])) is torch._C.DisableTorchFunction


@pytest.mark.parametrize("contiguous", [True, False])
def test_gradient_flow_hand_offs_waiting_together_give_each_steps_rows(
    monkeypatch: pytest.MonkeyPatch, contiguous: bool
) -> None:
    """The statistics thread computes every waiting hand-off at once (one native call); each
    step's rows must be those of its own grads, as NumPy computes them. A non-contiguous
    grad in one step (no native path for it) makes the batch go job by job."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from pprobe.hooks import builtin as bi

    written: list[dict[str, Any]] = []
    monkeypatch.setattr(bi, "record_columns",
                        lambda table, cols: written.extend(bi.rows_of(cols)))  # fmt: skip
    h = bi.GradientFlowHook(name="gf", frequency=1)
    h._mode = "ref"
    h._worker = object()  # type: ignore[assignment]  # no thread: the jobs wait for us
    gen = torch.Generator().manual_seed(3)
    names, steps = ["a", "b"], {}
    for step in range(4):
        a = torch.randn(5, 7, generator=gen)
        a[0, :3] = 0.0
        b = torch.randn(6, generator=gen)
        if step == 2:
            b[1] = float("nan")
            if not contiguous:
                a = torch.randn(7, 5, generator=gen).t()
        steps[step] = [a, b]
        assert h._handoff(torch, step, names, [a.numel(), b.numel()], [a, b], None, 0)
    h._run_jobs()
    h._verify()
    h._write_ready()
    assert [(r["step"], r["param"]) for r in written] == [(s, n) for s in range(4) for n in names]
    for r in written:
        g = steps[r["step"]][names.index(r["param"])].numpy().astype(np.float64).ravel()
        assert r["numel"] == g.size
        assert r["nan_count"] == int(np.isnan(g).sum()) and r["inf_count"] == 0
        assert r["zero_frac"] == pytest.approx(float((g == 0).sum()) / g.size)
        if r["nan_count"]:
            assert r["norm"] != r["norm"]
            continue
        assert r["norm"] == pytest.approx(float(np.sqrt((g * g).sum())), rel=1e-5)
        assert r["max_abs"] == pytest.approx(float(np.abs(g).max()), rel=1e-6)
        assert r["mean"] == pytest.approx(float(g.mean()), rel=1e-4, abs=1e-7)
    assert h.dropped_steps == 0


def test_idle_points_are_neither_called_nor_built_for(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    log: list[Any] = []
    monkeypatch.setattr(lifecycle, "_ctx", lambda: built.append("ctx") or {})
    monkeypatch.setattr(lifecycle, "_step_metrics", lambda: built.append("metrics") or {})
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "started", True)
    h = ph.add(Rec(log, name="r"))
    for s in range(4):
        h.idle_points = frozenset(["after_step"]) if s % 2 else None
        assert dispatch.calls_none("after_step", s) == bool(s % 2)
        lifecycle._open_step(s)
        lifecycle._on_step_ending(s, s + 1)
    ph.emit("after_step", step=9)  # an integration's emit: skipped too while idle
    want = [(0, "before_step"), (0, "after_step"), (1, "before_step"), (2, "before_step"),
            (2, "after_step"), (3, "before_step")]  # fmt: skip
    assert log == [("r", p, s) for s, p in want]
    assert built == ["ctx", "metrics", "ctx", "ctx"] * 2


def test_gradient_flow_after_step_idles_only_once_its_pre_hook_took_the_step() -> None:
    """After the optimizer pre-hook computed a step's rows on the training thread, that
    step's after_step is idle (no emit); a step whose ``optimizer.step()`` never ran (a
    GradScaler skipping it) keeps its after_step, which takes the grads as they are."""
    torch = pytest.importorskip("torch")
    from pprobe.ext import tables
    from pprobe.hooks.builtin import GradientFlowHook

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = ph.add(GradientFlowHook(frequency=1, async_cpu=False))
    dispatch.register_service("optimizer", opt)
    ph.claim("test")  # the points are this loop's (an integration's), not zero-code's
    tables.clear_rows()
    try:
        for s in range(3):
            ph.emit("before_step", source="test", step=s, model=model)
            assert h.idle_points is None
            opt.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            if s != 1:  # step 1: optimizer.step() skipped
                opt.step()
            assert dispatch.calls_none("after_step", s) == (s != 1)
            ph.emit("after_step", source="test", step=s, model=model)
        tables._cols_to_rows()
        got = sorted((r["step"], r["param"]) for r in tables.pending.get("gradient_flow", []))
        assert got == [(s, p) for s in range(3) for p in ("bias", "weight")]
    finally:
        tables.clear_rows()
        h.cleanup()


def test_gradient_flow_arms_itself_on_zero_code_steps_and_wakes_for_a_new_optimizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With zero-code detection making the steps, GradientFlow's before_step and after_step
    go idle after the first step it takes: its optimizer pre-hook takes each step that
    zero-code detection opened (every ``frequency`` steps), with the same rows. A new
    optimizer (a new ``optimizer`` service) wakes them, and the hook follows it."""
    torch = pytest.importorskip("torch")
    from pprobe import recorder, state
    from pprobe.ext import tables
    from pprobe.hooks.builtin import GradientFlowHook
    from pprobe.interceptors import torch_modules

    monkeypatch.setattr(torch_modules, "_on", True)  # the probe's steps (set_step below)
    monkeypatch.setattr(state, "step", 0)
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "pending", None)
    monkeypatch.setattr(lifecycle, "started", False)
    monkeypatch.setattr(lifecycle, "_optimizer", None)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opts = [torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(2)]
    h = ph.add(GradientFlowHook(frequency=2, async_cpu=False))
    befores: list[int] = []
    real_before = h.before_step
    h.before_step = lambda step, model=None: befores.append(step) or real_before(step, model)  # type: ignore[method-assign]
    dispatch.register_service("model", model)
    lifecycle.activate()
    tables.clear_rows()
    try:
        for s in range(8):
            opt = opts[s >= 4]  # a second optimizer from step 4 on
            if s:
                recorder.set_step(s)  # what the probe's optimizer post-hook does
            opt.zero_grad()
            model(torch.full((4, 3), float(s + 1))).sum().backward()
            opt.step()
            if s == 1:
                assert h.idle_points == frozenset(["before_step", "after_step"])
        tables._cols_to_rows()
        got = sorted((r["step"], r["param"]) for r in tables.pending.get("gradient_flow", []))
        assert got == [(s, p) for s in (0, 2, 4, 6) for p in ("bias", "weight")]
        assert befores == [0, 4]  # the first step, and the new optimizer's first
        assert h._hooked is opts[1]
    finally:
        tables.clear_rows()
        h.cleanup()


def test_a_failing_gradient_flow_pre_hook_never_breaks_the_optimizer_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from pprobe.hooks.builtin import GradientFlowHook

    monkeypatch.setattr(_report, "_seen", set())
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = ph.add(GradientFlowHook(frequency=1, async_cpu=False))
    dispatch.register_service("optimizer", opt)
    ph.claim("test")

    def boom(step: int, params: list[Any]) -> None:
        raise RuntimeError("statistics failed")

    h._compute = boom  # type: ignore[method-assign]
    want = model.weight.detach().clone()
    for s in range(dispatch.MAX_FAILURES + 2):
        ph.emit("before_step", source="test", step=s, model=model)
        opt.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()  # never raises
        with torch.no_grad():
            want -= 0.1 * model.weight.grad
    assert torch.equal(model.weight.detach(), want)
    assert h.off and h.failures == dispatch.MAX_FAILURES
    err = capsys.readouterr().err
    assert "optimizer pre-hook" in err and "statistics failed" in err
    h.cleanup()


def test_gradient_flow_keeps_before_step_when_zero_code_does_not_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program that emits the points itself (unclaimed) while zero-code detection opens
    no new step: GradientFlow takes every step it is given; before_step is not left idle."""
    torch = pytest.importorskip("torch")
    from pprobe.ext import tables
    from pprobe.hooks.builtin import GradientFlowHook
    from pprobe.interceptors import torch_modules

    monkeypatch.setattr(torch_modules, "_on", True)
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "pending", None)
    monkeypatch.setattr(lifecycle, "started", False)
    monkeypatch.setattr(lifecycle, "_optimizer", None)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = ph.add(GradientFlowHook(frequency=1, async_cpu=False))
    dispatch.register_service("model", model)
    lifecycle.activate()
    tables.clear_rows()
    try:
        for s in range(5):
            ph.emit("before_step", step=s, model=model)
            opt.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            opt.step()
            ph.emit("after_step", step=s, model=model)
        tables._cols_to_rows()
        got = {r["step"] for r in tables.pending.get("gradient_flow", [])}
        assert got >= {2, 3, 4}  # zero-code's one step may be lost, none after it
        assert not h._self_arm
    finally:
        tables.clear_rows()
        h.cleanup()


class _Seen(BaseHook):
    """Logs each point it is called at with what it was given and the state it ran in."""

    def __init__(self, log: list[Any], raises: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.log, self.raises = log, raises

    def _note(self, point: str, step: int, **ctx: Any) -> None:
        from pprobe import state

        self.log.append((self.name, point, step, sorted(ctx), ctx.get("metrics"),
                         lifecycle.opening, state.local.depth == state.INTERNAL))  # fmt: skip
        if self.raises:
            raise RuntimeError(f"{self.name} fails at {point} {step}")

    def before_step(self, step: int, model: Any = None) -> None:
        self._note("before_step", step, model=model)

    def after_step(self, step: int, model: Any = None, metrics: Any = None) -> None:
        self._note("after_step", step, model=model, metrics=metrics)


class _SeenAll(_Seen):
    def before_step(self, step: int, **ctx: Any) -> None:  # type: ignore[override]
        self._note("before_step", step, **ctx)


_LC_STATE = ("started", "open_step", "pending", "steps_in_epoch", "opening", "epoch_open",
             "_optimizer", "_train_loader", "_live_loader")  # fmt: skip


def _zero_code_run(pre: Any, ending: Any, change: Any, seed: int, opt: Any, model: Any) -> Any:
    """Random hooks driven through 12 optimizer steps as zero-code detection drives them:
    the pre-hook, then the step-ending and step listeners; what the hooks saw and where
    lifecycle detection ended."""
    rnd = random.Random(seed)
    dispatch._reset()
    lifecycle._seen_optimizers.clear()
    for name in _LC_STATE:
        setattr(lifecycle, name, 0 if name == "steps_in_epoch" else
                False if name in ("started", "epoch_open") else None)  # fmt: skip
    log: list[Any] = []
    for j in range(rnd.randint(1, 4)):
        kind = rnd.choice((_Seen, _SeenAll, Rec, AfterOnly))
        h = kind(log, name=f"h{j}", frequency=rnd.randint(1, 4))
        if kind is _Seen and rnd.random() < 0.3:
            h.raises = True
        if rnd.random() < 0.15:
            h.idle_points = frozenset({rnd.choice(("before_step", "after_step"))})
        if rnd.random() < 0.15:  # an instance-level rule
            h.should_trigger = lambda step: step % 3 == 1  # type: ignore[method-assign]
        if rnd.random() < 0.1:
            h.off = True
        ph.add(h)
    dispatch.register_service("model", model)
    last_ns = dispatch.step_opened_ns
    for s in range(12):
        pre(opt, (opt,), {})
        # the step that opened is stamped (TimeTracking's start), whether a hook fired or not
        log.append(("opened", dispatch.step_opened, dispatch.step_opened_ns > last_ns))
        last_ns = dispatch.step_opened_ns
        ending(s, s + 1)
        change(s, s + 1)
    end = {name: getattr(lifecycle, name) for name in _LC_STATE}
    end["step"] = dispatch.get_service("step")
    end["failures"] = [getattr(h, "failures", 0) for h in dispatch.hooks()]
    return log, end


def test_the_native_core_fires_step_points_as_the_python_twins_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Zero-code steps whose points call hooks: the native core does the step's bookkeeping
    and calls lifecycle._fire_before / _fire_after; the hooks see the same calls, context,
    ``opening`` and recording-off state, and detection ends in the same state as with the
    Python twins, over random hooks (frequencies, idle points, rules, hooks that raise)."""
    torch = pytest.importorskip("torch")
    from pprobe import core, state

    native = core.native
    if native is None:
        pytest.skip("the Python engine: no native twins")
    reported: list[str] = []
    monkeypatch.setattr(_report, "internal_error", lambda where, exc, **kw: reported.append(where))
    for name in _LC_STATE:  # lifecycle detection's state is put back after the test
        monkeypatch.setattr(lifecycle, name, getattr(lifecycle, name))
    monkeypatch.setattr(lifecycle, "_seen_optimizers", {})
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    py = (lifecycle._py_on_optimizer_pre, lifecycle._py_on_step_ending,
          lifecycle._py_on_step_change)  # fmt: skip
    handed: list[str] = []  # what the native functions hand the Python twins

    def counted(fn: Any) -> Any:
        def call(*a: Any) -> Any:
            handed.append(fn.__name__)
            return fn(*a)

        return call

    twins = (*map(counted, py), dispatch.py_calls_none, lifecycle._fire_before,
             lifecycle._fire_after)  # fmt: skip
    native.lifecycle_setup(vars(lifecycle), vars(dispatch), vars(state), *twins)
    try:
        fired = 0
        for seed in range(30):
            reported.clear()
            want = _zero_code_run(*py, seed, opt, model)
            want_reported = reported[:]
            reported.clear()
            handed.clear()
            got = _zero_code_run(native.lifecycle_pre, native.lifecycle_ending,
                                 native.lifecycle_change, seed, opt, model)  # fmt: skip
            assert got == want, seed
            assert reported == want_reported, seed
            # only the first step (its optimizer's services) goes to the Python twins
            assert handed.count("_py_on_optimizer_pre") == 1, (seed, handed)
            assert "_py_on_step_ending" not in handed, (seed, handed)
            fired += sum(e[1] == "after_step" for e in got[0])
        assert fired > 50  # the runs did fire points
    finally:
        lifecycle._fast_paths()
        dispatch._reset()
