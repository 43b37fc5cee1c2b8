"""The PyTorch probe at the api level: what is a row, transparency (bit-identical training,
same exceptions, autograd, no_grad, inference_mode, jit), threads, pprobe's own torch work
hidden, lossless dumps of every dtype, and a clean uninstall."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch_progs
from helpers import meta, npy_files, op_names, ops, run, run_script, sql, tensors

torch = pytest.importorskip("torch")


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bare_training(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("bare")
    return _json_line(run_script(tmp, torch_progs.TRAIN, probe=False).check().out)


@pytest.mark.parametrize(
    "env",
    [
        # Step windows keep this fast; outside them every call still goes through the probe.
        {"PPROBE_MODE": "dump", "PPROBE_BUDGET": "16MiB", "PPROBE_STEPS": "0-1,38-39"},
        {
            "PPROBE_MODE": "stats",
            "PPROBE_TORCH_LEVEL": "api,aten,module",
            "PPROBE_TORCH_PARAMS": "params,grads",
            # both optimizers count steps: the MLP runs steps 0-19, the transformer 20-39
            "PPROBE_STEPS": "0-1,19-21,39",
        },
    ],
    ids=["api-dump", "all-levels-stats"],
)
def test_training_is_bit_identical_with_and_without_the_probe(
    tmp_path: Path, env: dict, bare_training: dict
) -> None:
    probed = run_script(tmp_path, torch_progs.TRAIN, env=env).check()
    a, b = bare_training, _json_line(probed.out)
    assert len(a["mlp"]) == len(a["transformer"]) == 20
    assert a == b  # float.hex of every loss, the eval outputs and the final parameters
    assert ops(probed.run_dir, "kind = 'module'") or env["PPROBE_MODE"] == "dump"
    assert not meta(probed.run_dir)["errors"], probed.err
    assert "pprobe" not in probed.err, probed.err


def test_exceptions_are_the_same_and_recorded(tmp_path: Path) -> None:
    bare = run_script(tmp_path, torch_progs.ERRORS, probe=False).check()
    probed = run_script(tmp_path, torch_progs.ERRORS, env={"PPROBE_MODE": "stats"}).check()
    assert _json_line(bare.out) == _json_line(probed.out)
    rows = ops(probed.run_dir, "status <> 'ok'")
    statuses = {(r["op"], r["status"]) for r in rows}
    # operators arrive under their method's name (Tensor.__add__ dispatches as Tensor.add)
    assert ("torch.Tensor.add", "RuntimeError") in statuses
    assert ("torch.Tensor.matmul", "RuntimeError") in statuses
    assert ("torch.Tensor.__getitem__", "IndexError") in statuses
    assert ("torch.Tensor.backward", "RuntimeError") in statuses
    # The module that raised is unwound: the last linear runs at top level as "lin".
    last = ops(probed.run_dir, "op = 'torch.nn.functional.linear'")[-1]
    assert last["module_path"] == "lin"


@pytest.mark.parametrize("levels", ["api", "api,aten"])
def test_warnings_point_at_the_users_line(tmp_path: Path, levels: str) -> None:
    # torch's C-level warnings (copy-constructing a tensor) and Python-level ones whose
    # stacklevel counts frames through the __torch_function__ protocol (softmax without dim)
    prog = """
        import warnings
        import torch
        warnings.simplefilter("default")
        x = torch.ones(3)
        torch.nn.functional.softmax(x)
        torch.tensor(x)
        def f():
            return torch.tensor(x)
        f()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            f()
            torch.nn.functional.softmax(x)
        print([(w.filename, w.lineno, w.category.__name__) for w in got])
    """
    plain = run_script(tmp_path, prog, probe=False).check()
    probed = run_script(tmp_path, prog, env={"PPROBE_TORCH_LEVEL": levels}).check()
    assert plain.err.count("UserWarning") == 3 and str(tmp_path / "prog.py") in plain.err
    assert probed.err == plain.err
    assert probed.out == plain.out
    assert "torch.nn.functional.softmax" in op_names(probed.run_dir)


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_tensors_pprobe_read_stay_resizable(tmp_path: Path, mode: str) -> None:
    # Tensor.numpy() would mark each statted or dumped tensor's storage as not resizable for
    # good: an out= of another shape, or resize_, would then raise under the probe only.
    prog = """
        import warnings
        import torch
        warnings.simplefilter("ignore")   # out= of another shape is deprecated (and works)
        x = torch.arange(3.0)
        out = torch.empty(1)
        torch.neg(out)                    # pprobe reads out's storage
        torch.add(x, x, out=out)
        w = torch.zeros(2)
        torch.mul(w, 2)
        w.resize_(6)
        print(out.tolist(), w.shape)
    """
    plain = run_script(tmp_path, prog, probe=False).check()
    probed = run_script(tmp_path, prog, env={"PPROBE_MODE": mode}).check()
    assert plain.out == probed.out == "[0.0, 2.0, 4.0] torch.Size([6])\n"
    rows = tensors(probed.run_dir)
    # torch.empty's memory is whatever was there (a NaN now and then: min is then NULL): pprobe
    # read it when the row has counts
    assert any(
        r["role"] == "input" and r["shape"] == [1] and r["nan_count"] is not None for r in rows
    )


def test_api_rows_module_paths_steps_and_tensor_metadata(tmp_path: Path) -> None:
    r = run_script(tmp_path, torch_progs.TRAIN, "3", env={"PPROBE_MODE": "log"}).check()
    run = r.run_dir
    names = set(op_names(run))
    # torch.* functions, Tensor methods, operators and torch.nn.functional are rows
    for expected in (
        "torch.randn",
        "torch.relu",
        "torch.nn.functional.relu",
        "torch.nn.functional.linear",
        "torch.nn.functional.cross_entropy",
        "torch.nn.functional.embedding",
        "torch.Tensor.backward",
        "torch.Tensor.item",
        "torch.Tensor.reshape",
        "torch.Tensor.__getitem__",
    ):
        assert expected in names, expected
    # property reads (__get__), introspection and grad-mode switches are not
    assert not [n for n in names if n.endswith(("__get__", "_set_grad_enabled", ".size"))]
    assert {r["framework"] for r in ops(run)} == {"torch"}
    kinds = {r["op"]: r["kind"] for r in ops(run)}
    assert kinds["torch.randn"] == "function"
    assert kinds["torch.Tensor.item"] == "method"
    assert kinds["torch.Tensor.__getitem__"] == "operator"

    # module paths from the root's variable name and named_modules()
    paths = {r["module_path"] for r in ops(run)}
    assert {"net.fc1", "net.fc2", "net.out", "net"} <= paths
    assert "model.encoder.layers.0.self_attn" in paths
    assert "model.encoder.layers.1.linear2" in paths
    assert "model.embed" in paths
    fc1 = ops(run, "module_path = 'net.fc1'")
    assert {r["op"] for r in fc1} == {"torch.nn.functional.linear"}
    # steps: the SGD loop's 3 optimizer steps, then Adam's 3
    steps = sql(run, "SELECT step, count(*) AS n FROM ops GROUP BY step ORDER BY step")
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 5, 6]
    first_backward = ops(run, "op = 'torch.Tensor.backward'")
    assert [b["step"] for b in first_backward] == [0, 1, 2, 3, 4, 5]
    # Tensor.backward is called outside any module (docs/schema.md: phase)
    assert {b["phase"] for b in first_backward} == {"other"}

    lin = tensors(run, f"seq = {fc1[0]['seq']}")
    by = {(t["role"], t["idx"]): t for t in lin}
    assert by[("input", "0")]["shape"] == [64, 16]
    assert by[("input", "1")]["shape"] == [32, 16]
    assert by[("input", "1")]["requires_grad"] is True
    assert by[("input", "0")]["requires_grad"] is False
    assert by[("output", "0")]["dtype"] == "float32"
    assert by[("output", "0")]["device"] == "cpu"
    assert by[("output", "0")]["min"] is None  # log mode: no statistics
    # every row has rank/world size columns (no torch.distributed here: null)
    assert {(r["rank"], r["world_size"]) for r in ops(run)} == {(None, None)}


def test_threads_started_later_are_recorded(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor
        import torch

        # All threads stay alive to the end: a finished thread's ident is reused, and rows
        # are named by ident when the writer flushes.
        done = threading.Event()
        ran = threading.Barrier(3)

        def work():
            torch.mul(torch.ones(3), 2)
            ran.wait()
            done.wait()

        class Sub(threading.Thread):  # overrides run(): still recorded
            def run(self):
                torch.sub(torch.ones(2), 1)
                ran.wait()
                done.wait()

        t = threading.Thread(target=work, name="plain")
        s = Sub(name="subclass")
        s.start(); t.start()
        ex = ThreadPoolExecutor(2, thread_name_prefix="pool")
        list(ex.map(lambda i: torch.add(torch.ones(2), i), range(4)))
        ran.wait()
        import pprobe
        pprobe.disable()  # flush while every thread is alive
        done.set(); t.join(); s.join(); ex.shutdown()
        """,
        env={"PPROBE_MODE": "log"},
    ).check()
    rows = ops(r.run_dir)
    by_thread = {(x["thread"], x["op"]) for x in rows}
    assert ("plain", "torch.mul") in by_thread
    assert ("subclass", "torch.sub") in by_thread
    assert len([x for x in rows if x["thread"].startswith("pool") and x["op"] == "torch.add"]) == 4
    assert len({x["seq"] for x in rows}) == len(rows)


def test_autograd_no_grad_inference_mode_and_jit_work_probed(tmp_path: Path) -> None:
    prog = """
        import json
        import torch
        import torch.nn as nn
        torch.manual_seed(0)
        out = {}
        w = torch.randn(3, requires_grad=True)
        (w.sin() * 2).sum().backward()
        out["grad"] = w.grad.tolist()
        out["jac"] = torch.autograd.functional.jacobian(torch.tanh, torch.ones(2)).tolist()
        with torch.no_grad():
            z = w * 2
        out["no_grad"] = [z.requires_grad, z.tolist()]
        with torch.inference_mode():
            z = w * 3
        out["inference"] = [z.is_inference(), z.tolist()]

        @torch.jit.script
        def f(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x * 2 - 1)

        out["script"] = f(torch.linspace(-1, 1, 5)).tolist()
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        x = torch.randn(3, 4)
        traced = torch.jit.trace(m, x)
        scripted = torch.jit.script(m)
        out["trace"] = [torch.equal(traced(x), m(x)), traced(x).tolist()]
        out["script_module"] = [torch.equal(scripted(x), m(x)), scripted(x).tolist()]
        out["trace_graph_nodes"] = len(list(traced.graph.nodes()))
        out["vmap"] = torch.vmap(lambda a: a * 2)(torch.ones(2, 2)).tolist()
        out["func_grad"] = torch.func.grad(lambda a: (a ** 2).sum())(torch.ones(2)).tolist()
        print(json.dumps(out))
    """
    bare = run_script(tmp_path, prog, probe=False).check()
    probed = run_script(tmp_path, prog, env={"PPROBE_MODE": "stats"}).check()
    assert _json_line(bare.out) == _json_line(probed.out)
    assert "TracerWarning" not in probed.err  # pprobe's statistics are not traced
    assert not meta(probed.run_dir)["errors"]
    notes = {t["note"] for t in tensors(probed.run_dir) if t["note"]}
    assert any("functorch" in n for n in notes)


def test_pprobes_own_torch_work_is_not_recorded(tmp_path: Path) -> None:
    prog = """
        import torch
        a = torch.ones(4, dtype=torch.bfloat16)
        b = a * 2
        c = torch.full((3,), 7.0).to(torch.float16) + 1
    """
    for env in (
        {"PPROBE_MODE": "dump"},
        {"PPROBE_MODE": "dump", "PPROBE_TORCH_LEVEL": "api,aten"},
    ):
        r = run_script(tmp_path, prog, env=env, output=tmp_path / env["PPROBE_MODE"]).check()
        api = op_names(r.run_dir, "kind <> 'aten'")
        assert api == [
            "torch.ones",
            "torch.Tensor.mul",
            "torch.full",
            "torch.Tensor.to",
            "torch.Tensor.add",
        ]
        if "aten" in env.get("PPROBE_TORCH_LEVEL", ""):
            aten = op_names(r.run_dir, "kind = 'aten'")
            # the statistics (isfinite, amin, ...) and dumps never show up
            assert not [a for a in aten if "isfinite" in a or "amin" in a or "_to_copy" in a][1:], (
                aten
            )
        assert not meta(r.run_dir)["errors"]
        import shutil

        shutil.rmtree(r.output)


DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "complex64",
    "complex128",
    "complex32",
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
]


def test_dtype_battery_statistics_and_lossless_dumps(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        f"""
        import warnings
        import torch
        warnings.simplefilter("ignore")
        for name in {DTYPES!r}:
            dt = getattr(torch, name)
            base = torch.linspace(-3, 3, 7)
            if dt == torch.bool:
                x = base > 0
            elif dt.is_complex:
                x = torch.complex(base, -base).to(dt)
            elif dt.is_floating_point:
                x = base.to(dt)
            else:
                x = torch.arange(7).to(dt)
            y = x.clone()
        q = torch.quantize_per_tensor(torch.linspace(0, 1, 5), 0.1, 2, torch.quint8)
        q2 = q.int_repr()
        s = torch.eye(3).to_sparse() * 2
        nj = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged)
        nj2 = nj * 2
        ns = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)]) * 2
        m = torch.empty(3, device="meta") + 1
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            f = torch.empty(4) * 2
        e = torch.ones(0, 3).sum(0)
        n = torch.tensor([1.0, float("nan"), float("inf"), -2.0]) * 1
        print("done")
        """,
        env={"PPROBE_MODE": "dump"},
    ).check()
    run = r.run_dir
    assert not meta(run)["errors"], r.err
    import numpy as np
    import torch as t

    import pprobe

    clones = ops(run, "op = 'torch.Tensor.clone'")
    assert len(clones) == len(DTYPES)
    for row, name in zip(clones, DTYPES):
        (out,) = tensors(run, f"seq = {row['seq']} AND role = 'output'")
        (inp,) = tensors(run, f"seq = {row['seq']} AND role = 'input'")
        assert out["dtype"] == name
        assert out["dump_path"], (name, out["note"])
        dt = getattr(t, name)
        if dt.is_complex or dt.is_floating_point or dt == t.bool:
            assert out["nan_count"] == 0 and out["min"] is not None, name
        loaded = pprobe.load(str(run / out["dump_path"]))
        before = pprobe.load(str(run / inp["dump_path"]))
        if name in ("bfloat16", "complex32") or name.startswith("float8"):
            # stored as raw bits, the true dtype in the file name; loads as that torch dtype
            assert out["dump_path"].endswith(f".{name}.npy")
            assert isinstance(loaded, t.Tensor) and loaded.dtype == dt
            assert loaded.shape == (7,)
            assert t.equal(loaded.view(t.uint8), before.view(t.uint8))
            as_float = loaded.to(t.complex64 if dt.is_complex else t.float32)
            assert as_float.real.abs().max().item() > 0
        else:
            assert isinstance(loaded, np.ndarray) and str(loaded.dtype) == name
            assert np.array_equal(loaded, before)
            tt = pprobe.load(str(run / out["dump_path"]), torch=True)
            assert isinstance(tt, t.Tensor) and tt.dtype == dt

    notes = {tt["note"] for tt in tensors(run) if tt["note"]}
    assert any(n.startswith("quint8: int_repr saved, scale=0.1, zero_point=2") for n in notes)
    assert "sparse_coo tensor: values not read" in notes
    assert "nested tensor: values not read" in notes
    assert "meta tensor: no data" in notes
    assert any(n.startswith("NestedTensor:") for n in notes)
    assert any(n.startswith("FakeTensor:") for n in notes)
    jag = [tt for tt in tensors(run) if (tt["note"] or "").startswith("NestedTensor")]
    assert jag[0]["shape"] == [2, -1, 3]  # the ragged dimension
    (nanrow,) = ops(run, "op = 'torch.Tensor.mul' AND seq = (SELECT max(seq) FROM ops)")
    (o,) = tensors(run, f"seq = {nanrow['seq']} AND role = 'output'")
    assert (o["nan_count"], o["inf_count"], o["min"], o["max"]) == (1, 1, -2.0, 1.0)
    assert any(f.endswith(".bfloat16.npy") for f in npy_files(run))


def test_step_windows_optimizer_steps_and_manual_steps(tmp_path: Path) -> None:
    r = run_script(tmp_path, torch_progs.TRAIN, "6", env={"PPROBE_STEPS": "2-3,5"}).check()
    steps = {x["step"] for x in ops(r.run_dir)}
    assert steps == {2, 3, 5}  # step 0-1 and 4 and beyond are not captured
    # pprobe.step() takes over: optimizer steps then leave the counter alone
    r = run_script(
        tmp_path,
        """
        import pprobe, torch
        w = torch.ones(2, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for i in range(3):
            opt.zero_grad(); (w * 2).sum().backward(); opt.step()
            pprobe.step()
        torch.zeros(1)
        """,
        env={"PPROBE_MODE": "log"},
        output=tmp_path / "manual",
    ).check()
    last = ops(r.run_dir)[-1]
    assert last["op"] == "torch.zeros" and last["step"] == 3


def test_uninstall_removes_modes_hooks_and_patches(tmp_path: Path) -> None:
    run_script(
        tmp_path,
        """
        import threading
        import torch
        import torch.distributed as dist
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_mod
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        import pprobe

        def state():
            return (
                len(_get_current_function_mode_stack()),
                len(_get_current_dispatch_mode_stack()),
                len(nn_module._global_forward_pre_hooks),
                len(nn_module._global_forward_hooks),
                len(optim_mod._global_optimizer_post_hooks),
                threading.Thread._bootstrap_inner.__module__,
                hasattr(dist.all_reduce, "__pprobe_original__"),
                hasattr(dist.init_process_group, "__pprobe_original__"),
                nn_module._has_any_global_hook.__module__,
            )

        on = state()
        assert on == (
            1, 1, 1, 1, 1, "pprobe.interceptors.torch_api", True, True,
            "pprobe.interceptors.torch_modules",
        ), on
        pprobe.disable()
        off = state()
        assert off == (
            0, 0, 0, 0, 0, "threading", False, False, "torch.nn.modules.module"
        ), off
        torch.nn.Linear(2, 2)(torch.ones(1, 2))  # still works, nothing recorded
        print("ok")
        """,
        env={"PPROBE_TORCH_LEVEL": "api,aten,module"},
    ).check()


def test_sync_setting_and_unknown_level_are_reported(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        "import torch; print(float(torch.ones(2).sum()))",
        env={"PPROBE_TORCH_LEVEL": "api,kernel"},
    ).check()
    assert "PPROBE_TORCH_LEVEL" in r.err and "api, aten, module" in r.err
    r = run_script(
        tmp_path,
        "import torch; print(float(torch.ones(2).sum()))",
        env={"PPROBE_SYNC": "1", "PPROBE_MODE": "log"},
        output=tmp_path / "sync",
    ).check()
    assert op_names(r.run_dir) == ["torch.ones", "torch.Tensor.sum", "torch.Tensor.__float__"]


def test_pytest_hides_the_modes_frame_in_tracebacks(tmp_path: Path) -> None:
    # A torch op that raises inside a test: pytest's report shows the user's frames and
    # torch's error, not pprobe's __torch_function__ (it sets __tracebackhide__).
    (tmp_path / "test_user.py").write_text(
        "import torch\ndef test_shapes():\n    torch.add(torch.ones(2), torch.ones(3))\n"
    )
    r = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        tmp_path,
        env={"PPROBE_MODE": "log"},
    )
    assert r.rc == 1, r.out + r.err
    assert "RuntimeError" in r.out and "test_user.py:3" in r.out
    assert "torch_api.py" not in r.out


def test_past_the_budget_no_tensor_is_read_for_a_dump(tmp_path: Path) -> None:
    """Once the dump budget is used up, a tensor's dump is refused before the handler reads
    it for one (``dumpable``: for a CUDA tensor, pinned host memory and a copy off the device
    per tensor): the row says why, whichever engine records it."""
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        import torch
        from pprobe.interceptors import torch_values
        calls = []
        real = torch_values.HANDLER.dumpable

        def dumpable(x):
            calls.append(1)
            return real(x)

        torch_values.HANDLER.dumpable = dumpable
        t = torch.arange(12.0).reshape(3, 4)
        torch.neg(t.t())                  # a strided tensor: read by the handler
        before = len(calls)
        for i in range(200):              # 1.3 MB of new small contents: the budget
            np.negative(np.full(400, float(i)))   # (1 MB) is used up
        torch.neg(t.t() + 1)              # PAST
        print(json.dumps({"before": before, "after": len(calls) - before}))
        """,
        env={"PPROBE_MODE": "dump", "PPROBE_BUDGET": "1MB"},
    ).check()
    out = json.loads(r.out.strip().splitlines()[-1])
    assert out["before"] >= 1 and out["after"] == 0, out
    src = (tmp_path / "prog.py").read_text().splitlines()
    line = next(i for i, t in enumerate(src, 1) if "# PAST" in t)
    rows = [t for o in ops(r.run_dir) if o["caller"].endswith(f":{line}")
            for t in tensors(r.run_dir, f"seq = {o['seq']}")]  # fmt: skip
    assert rows and all(
        t["dump_path"] is None and t["note"] == "not dumped: dump budget exhausted" for t in rows
    ), rows
