"""register_hook and hook_function, end to end through the bootstrap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_script, sql, write

from pprobe.ext import hooks, tables

torch = pytest.importorskip("torch")

TORCH_PROG = """
    import json
    import torch
    import pprobe
    from pprobe import register_hook

    torch.manual_seed(0)
    before = torch.nn.Linear(4, 3)            # made before the hook
    x = torch.randn(5, 4)

    def run(m):
        x_ = x.clone().requires_grad_(True)
        y = m(x_)
        y.square().sum().backward()
        return y.detach(), x_.grad.clone(), [p.grad.clone() for p in m.parameters()]

    class Later(torch.nn.Linear):              # a subclass, defined before the hook
        pass

    model = torch.nn.Sequential(before, torch.nn.ReLU(), Later(3, 2))
    ref = run(model)
    for p in model.parameters():
        p.grad = None

    @register_hook("torch.nn.Linear", "forward")
    def on_forward(module, inp, out):
        pprobe.record_custom_data({"module": type(module).__name__, "in_shape": list(inp[0].shape),
                                   "out_sum": float(out.sum())})
        return torch.zeros(1)                  # ignored: a hook never changes a result

    @register_hook("torch.nn.Linear", "backward")
    def on_backward(module, gin, gout):
        pprobe.record("grads", {"module": type(module).__name__, "gout_shape": list(gout[0].shape)})
        return (torch.zeros(1),)

    got = run(model)
    pairs = zip([ref[0], ref[1], *ref[2]], [got[0], got[1], *got[2]])
    same = all(torch.equal(a, b) for a, b in pairs)
    after = torch.nn.Linear(2, 1)             # made after the hook
    z = after(got[0])
    print(json.dumps({"same": same, "out_sums": [float(model[0](x).sum()), float(z.sum())]}))
"""


def test_module_forward_and_backward_hooks(tmp_path: Path) -> None:
    r = run_script(tmp_path, TORCH_PROG, env={"PPROBE_MODE": "log"}).check()
    out = json.loads(r.out)
    assert out["same"] is True
    got = sql(r.run_dir, "SELECT module, in_shape, out_sum FROM python.custom_data ORDER BY ts_ns")
    # run(model): before (5,4) and Later (5,3); after(...) (5,2); then model[0](x) for the print.
    assert [(g["module"], g["in_shape"]) for g in got] == [
        ("Linear", [5, 4]), ("Later", [5, 3]), ("Linear", [5, 2]), ("Linear", [5, 4])
    ]  # fmt: skip
    assert got[2]["out_sum"] == pytest.approx(out["out_sums"][1], rel=1e-6)
    assert got[3]["out_sum"] == pytest.approx(out["out_sums"][0], rel=1e-6)
    g = sql(r.run_dir, "SELECT module, gout_shape FROM python.grads ORDER BY ts_ns")
    assert g == [{"module": "Later", "gout_shape": [5, 2]},
                 {"module": "Linear", "gout_shape": [5, 3]}]  # fmt: skip
    # the hook's own torch calls are not recorded as the program's ops
    ops = sql(r.run_dir, "SELECT count(*) AS n FROM ops WHERE caller LIKE '%on_forward%'")
    assert ops == [{"n": 0}]


def _pkg(tmp_path: Path) -> None:
    write(tmp_path / "pkgx" / "__init__.py", "")
    write(
        tmp_path / "pkgx" / "mod.py",
        """
        def func(a, b=1):
            return a + b

        class K:
            def run(self, x):
                return x * 2

        class Sub(K):
            def run(self, x):
                return x * 3

        class Plain(K):
            pass
        """,
    )


def test_hook_function_and_method_hooks_resolved_on_import(tmp_path: Path) -> None:
    _pkg(tmp_path)
    r = run_script(
        tmp_path,
        """
        import json, sys
        import pprobe
        from pprobe import hook_function, register_hook
        seen = []

        @hook_function("pkgx.mod.func")            # pkgx is not imported yet
        def f(a, b=1):
            seen.append(["func", a, b])

        @register_hook("pkgx.mod.K", "run")        # nor is the class
        def after_run(self, args, kwargs, result):
            seen.append([type(self).__name__, list(args), result])
            return "ignored"

        assert "pkgx.mod" not in sys.modules
        from pkgx.mod import func, K, Sub, Plain
        res = [func(2), func(2, b=5), K().run(5), Sub().run(5), Plain().run(1)]
        print(json.dumps({"res": res, "seen": seen}))
        """,
        env={"PPROBE_MODE": "log", "PYTHONPATH": None},
        probe=True,
    ).check()
    out = json.loads(r.out)
    assert out["res"] == [3, 7, 10, 15, 2]
    assert out["seen"] == [["func", 2, 1], ["func", 2, 5], ["K", [5], 10], ["Sub", [5], 15],
                           ["Plain", [1], 2]]  # fmt: skip


def test_hook_function_rebinds_names_imported_before(tmp_path: Path) -> None:
    _pkg(tmp_path)
    r = run_script(
        tmp_path,
        """
        import json
        from pkgx.mod import func             # bound before the hook
        import pkgx.mod
        from pprobe import hook_function
        seen = []
        h = hook_function("pkgx.mod.func", lambda a, b=1: seen.append([a, b]))
        res = [func(1), pkgx.mod.func(4, 4)]
        h.pprobe_hook.remove()                 # undone: the original again
        res.append(func(0))
        print(json.dumps({"res": res, "seen": seen, "orig": func is pkgx.mod.func}))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    assert json.loads(r.out) == {"res": [2, 8, 1], "seen": [[1, 1], [4, 4]], "orig": True}


def test_a_raising_hook_is_reported_once_and_switched_off(tmp_path: Path) -> None:
    _pkg(tmp_path)
    r = run_script(
        tmp_path,
        """
        from pkgx.mod import func
        from pprobe import hook_function
        calls = []
        @hook_function("pkgx.mod.func")
        def bad(a, b=1):
            calls.append(a)
            raise RuntimeError(f"hook failed on {a}")
        total = sum(func(i) for i in range(10))
        print(total, len(calls))
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    total, calls = map(int, r.out.split())
    assert total == sum(i + 1 for i in range(10))  # the program's results are its own
    assert calls == tables.MAX_FAILURES
    lines = [x for x in r.err.splitlines() if "hook pkgx.mod.func" in x]
    assert len(lines) == 2 and "RuntimeError: hook failed on 0" in lines[0], r.err
    errs = sql(r.run_dir, "SELECT source, event, message FROM python.errors ORDER BY failures")
    assert errs == [
        {"source": "hook pkgx.mod.func", "event": "raised",
         "message": "RuntimeError: hook failed on 0"},
        {"source": "hook pkgx.mod.func", "event": "switched off",
         "message": f"RuntimeError: hook failed on {tables.MAX_FAILURES - 1}"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: hooks.register_hook("nodots", "forward", print), "not valid"),
        (lambda: hooks.register_hook("a.B", "not a name", print), "not a method name"),
        (lambda: hooks.register_hook("a.B", "forward", 3), "not callable"),
        (lambda: hooks.hook_function("func", print), "not valid"),
    ],
)
def test_bad_arguments(call: object, match: str) -> None:
    with pytest.raises(tables.ExtensionError, match=match):
        call()  # type: ignore[operator]


def test_in_process_class_object_and_remove() -> None:
    class A:
        def go(self, x: int) -> int:
            return x + 1

    seen: list = []
    fn = hooks.register_hook(A, "go", lambda s, a, k, r: seen.append((a, r)))
    assert A().go(1) == 2 and seen == [((1,), 2)]
    fn.pprobe_hook.remove()
    assert A().go(1) == 2 and len(seen) == 1
    assert "go" in A.__dict__ and not hasattr(A.__dict__["go"], "__wrapped__")
