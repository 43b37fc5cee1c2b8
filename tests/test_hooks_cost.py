"""The cheap step path of the hooks (issue #15's cost target), in process.

``emit`` computes BaseHook's ``should_trigger`` inline (``step % frequency``) and calls an
overriding one; zero-code detection builds no context and emits nothing while another source
has claimed the points or no hook is live. The behaviour must be the one the contract states
(tests/test_hooks_base.py); these tests pin the cases the fast path could get wrong.
"""

from __future__ import annotations

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


class Steps(BaseHook):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[int] = []

    def after_step(self, step: int) -> None:
        self.seen.append(step)


def _run(steps: int = 12) -> None:
    for s in range(steps):
        ph.emit("after_step", step=s)


def test_inline_frequency_follows_a_frequency_changed_after_add() -> None:
    h = ph.add(Steps(frequency=4))
    _run()
    h.frequency = 5
    _run()
    assert h.seen == [0, 4, 8, 0, 5, 10]


def test_should_trigger_overridden_on_the_class_or_the_instance_is_called() -> None:
    class Odd(Steps):
        def should_trigger(self, step: int) -> bool:
            return step % 2 == 1

    a = ph.add(Odd(frequency=3))  # its frequency does not matter: its rule does
    b = ph.add(Steps(frequency=3))
    b.should_trigger = lambda step: step in (2, 7)  # type: ignore[method-assign]
    _run(9)
    assert a.seen == [1, 3, 5, 7]
    assert b.seen == [2, 7]


def test_epoch_points_use_the_epoch_and_other_points_always_fire() -> None:
    seen: list[Any] = []

    class H(BaseHook):
        def after_epoch(self, epoch: int) -> None:
            seen.append(("epoch", epoch))

        def before_training(self) -> None:
            seen.append("training")

    ph.add(H(frequency=2))
    ph.emit("before_training")
    for e in range(5):
        ph.emit("after_epoch", epoch=e, step=1)  # step does not decide an epoch point
    assert seen == ["training", ("epoch", 0), ("epoch", 2), ("epoch", 4)]


def test_a_bad_frequency_set_later_is_a_should_trigger_failure() -> None:
    h = ph.add(Steps(frequency=2))
    h.frequency = 0
    n = len(_report.errors)
    _run(2)
    assert h.seen == [] and h.failures == 2
    assert "should_trigger" in str(_report.errors[n:])


def test_zero_code_step_builds_no_context_while_the_points_are_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(lifecycle, "_ctx", lambda: built.append("ctx") or {})
    monkeypatch.setattr(lifecycle, "_step_metrics", lambda: built.append("metrics") or {})
    monkeypatch.setattr(lifecycle, "open_step", None)
    monkeypatch.setattr(lifecycle, "steps_in_epoch", 0)
    h = ph.add(Steps())
    ph.claim("framework")
    lifecycle._open_step(3)
    lifecycle._close_step()
    assert built == [] and h.seen == []
    assert dispatch.get_service("step") == 3  # the bookkeeping still runs
    dispatch._claimed = None
    lifecycle._open_step(4)
    lifecycle._close_step()
    # before_step calls no hook (Steps has only after_step): its context is not built
    assert built == ["metrics", "ctx"] and h.seen == [4]
