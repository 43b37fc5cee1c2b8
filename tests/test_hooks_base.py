"""The hook contract: BaseHook, HookRegistry, add/emit, claim, isolation (in-process)."""

from __future__ import annotations

from typing import Any

import pytest

from pprobe import _report
from pprobe import hooks as ph
from pprobe.hooks import BaseHook, HookRegistry, dispatch


@pytest.fixture(autouse=True)
def _clean() -> Any:
    dispatch._reset()
    yield
    dispatch._reset()


def test_frequency_and_should_trigger() -> None:
    seen: list[tuple[str, int]] = []

    class Every3(BaseHook):
        def after_step(self, step: int) -> None:
            seen.append(("s", step))

        def after_epoch(self, epoch: int, metrics: Any = None) -> None:
            seen.append(("e", epoch))

    class Custom(BaseHook):
        def should_trigger(self, step: int) -> bool:
            return step < 2

        def before_step(self, step: int, model: Any = None) -> None:
            seen.append(("c", step))

    ph.add(Every3(frequency=3))
    ph.add(Custom())
    for s in range(7):
        ph.emit("before_step", step=s, model=None)
        ph.emit("after_step", step=s, model=None, metrics={})
    for e in range(4):
        ph.emit("after_epoch", epoch=e)
    assert [x for x in seen if x[0] == "s"] == [("s", s) for s in range(7) if s % 3 == 0]
    assert [x for x in seen if x[0] == "c"] == [("c", 0), ("c", 1)]
    assert [x for x in seen if x[0] == "e"] == [("e", 0), ("e", 3)]


def test_registry_and_services() -> None:
    @HookRegistry.register("RegistryProbe")
    class H(BaseHook):
        pass

    h = HookRegistry.create("RegistryProbe", name="x", frequency=2)
    assert isinstance(h, H) and h.name == "x" and h.frequency == 2
    with pytest.raises(KeyError, match="unknown hook type 'Nope'; allowed: .*RegistryProbe"):
        HookRegistry.get("Nope")
    with pytest.raises(TypeError, match="no parameter colour"):
        HookRegistry.create("RegistryProbe", colour="red")
    with pytest.raises(ValueError, match="frequency"):
        H(frequency=0)
    assert h.get_service("model") is None
    obj = object()
    h.register_service("model", obj)
    assert h.get_service("model") is obj


def test_a_raising_hook_is_reported_and_switched_off(capsys: Any) -> None:
    calls = []

    class Bad(BaseHook):
        def after_step(self, step: int) -> None:
            calls.append(step)
            raise RuntimeError("boom")

    bad = ph.add(Bad(name="bad"))
    n = len(_report.errors)
    for s in range(10):
        ph.emit("after_step", step=s)
    assert calls == list(range(dispatch.MAX_FAILURES))
    assert bad.off
    assert len(_report.errors) == n + 1 and _report.errors[-1]["where"] == "hook bad.after_step"
    assert capsys.readouterr().err.count("boom") == 1


def test_a_claim_silences_other_sources() -> None:
    seen: list[str | None] = []

    class H(BaseHook):
        def before_training(self, model: Any = None) -> None:
            seen.append(model)

    ph.add(H())
    ph.emit("before_training", model="auto")
    ph.claim("lightning")
    ph.emit("before_training", model="auto2")
    ph.emit("before_training", source="lightning", model="pl")
    assert seen == ["auto", "pl"]
    with pytest.raises(ValueError, match="unknown hook point"):
        ph.emit("after_lunch")


def test_a_duck_typed_hook_gets_only_the_points_it_has() -> None:
    seen: list[tuple[str, int]] = []

    class Duck:
        name = "duck"

        def should_trigger(self, step: int) -> bool:
            return True

        def after_step(self, step: int) -> None:
            seen.append(("after", step))

    duck = ph.add(Duck())
    duck.before_epoch = lambda epoch: seen.append(("epoch", epoch))  # set on the instance
    n = len(_report.errors)
    for s in range(3):
        for point in ("before_training", "before_step", "after_step", "cleanup"):
            ph.emit(point, step=s)
    ph.emit("before_epoch", epoch=7)
    assert seen == [("after", 0), ("after", 1), ("after", 2), ("epoch", 7)]
    assert len(_report.errors) == n  # the points it lacks are not failures
