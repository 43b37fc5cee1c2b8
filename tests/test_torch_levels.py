"""The torch capture levels: aten (dispatcher ops, backward, phase), module (one row per
nn.Module call, parameters and gradients on request), their nesting with api rows, module
names, and torch.compile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch_progs
from helpers import meta, npy_files, op_names, ops, run_script, sql, tensors

torch = pytest.importorskip("torch")

STEP = """
import torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x)) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.blocks(x))


class Holder:  # not a module: its attribute name names the root
    def __init__(self):
        self.network = Net()

    def step(self, x, y, opt):
        opt.zero_grad()
        loss = F.cross_entropy(self.network(x), y)
        loss.backward()
        opt.step()
        return loss


h = Holder()
opt = torch.optim.SGD(h.network.parameters(), lr=0.1)
x, y = torch.randn(4, 8), torch.tensor([0, 1, 1, 0])
for _ in range(2):
    h.step(x, y, opt)
"""


def test_aten_level_records_backward_with_phase_and_nests_under_api(tmp_path: Path) -> None:
    r = run_script(tmp_path, STEP, env={"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "api,aten"})
    r.check()
    run = r.run_dir
    aten = ops(run, "kind = 'aten'")
    assert aten and all(a["op"].startswith("aten.") for a in aten)
    phases = {a["phase"] for a in aten}
    assert phases == {"init", "forward", "other", "backward", "optimizer"}  # docs/schema.md
    back = [a["op"] for a in aten if a["phase"] == "backward"]
    assert "aten.threshold_backward.default" in back
    assert "aten.mm.default" in back
    # aten rows inside an api row are its children (depth 1); backward ops are the
    # children of Tensor.backward
    (bw,) = ops(run, "op = 'torch.Tensor.backward' AND step = 0")
    kids = ops(run, f"parent = {bw['seq']}")
    assert kids and {k["depth"] for k in kids} == {1}
    assert "backward" in {k["phase"] for k in kids}
    addmm = ops(run, "op = 'aten.addmm.default' AND step = 0")
    parents = {p["seq"]: p["op"] for p in ops(run, "kind <> 'aten'")}
    assert {parents[a["parent"]] for a in addmm} == {"torch.nn.functional.linear"}
    assert {a["module_path"] for a in addmm} == {
        "network.blocks.0.lin",
        "network.blocks.1.lin",
        "network.head",
    }
    # aten alone: no api rows
    r = run_script(
        tmp_path,
        STEP,
        env={"PPROBE_MODE": "stats", "PPROBE_TORCH_LEVEL": "aten"},
        output=tmp_path / "aten",
    ).check()
    kinds = {x["kind"] for x in ops(r.run_dir)}
    assert kinds == {"aten"}
    assert sql(r.run_dir, "SELECT count(*) AS n FROM tensors WHERE mean IS NOT NULL")[0]["n"] > 0


def test_module_level_rows_params_and_grads(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        STEP,
        env={
            "PPROBE_MODE": "dump",
            "PPROBE_TORCH_LEVEL": "module",
            "PPROBE_TORCH_PARAMS": "params,grads",
        },
    ).check()
    run = r.run_dir
    assert not meta(run)["errors"], r.err
    mods = ops(run, "kind = 'module' AND step = 0")
    assert [(m["op"], m["module_path"]) for m in mods] == [
        ("__main__.Net", "network"),
        ("torch.nn.modules.container.Sequential", "network.blocks"),
        ("__main__.Block", "network.blocks.0"),
        ("torch.nn.modules.linear.Linear", "network.blocks.0.lin"),
        ("torch.nn.modules.activation.ReLU", "network.blocks.0.act"),
        ("__main__.Block", "network.blocks.1"),
        ("torch.nn.modules.linear.Linear", "network.blocks.1.lin"),
        ("torch.nn.modules.activation.ReLU", "network.blocks.1.act"),
        ("torch.nn.modules.linear.Linear", "network.head"),
    ]
    # nesting by parent (module rows do not count in depth)
    by_seq = {m["seq"]: m for m in mods}
    assert by_seq[mods[3]["parent"]]["module_path"] == "network.blocks.0"
    assert {m["depth"] for m in mods} == {0}
    lin = tensors(run, f"seq = {mods[3]['seq']}")
    roles = {(t["role"], t["idx"]): t for t in lin}
    assert roles[("input", "0")]["shape"] == [4, 8]
    assert roles[("output", "0")]["shape"] == [4, 8]
    assert roles[("param", "weight")]["shape"] == [8, 8]
    assert roles[("param", "bias")]["requires_grad"] is True
    assert roles[("param", "weight")]["dump_path"].startswith(
        "op_torch.nn.modules.linear.Linear_param_weight_"
    )
    # one gradient row per parameter per backward, after accumulation
    grads = ops(run, "kind = 'grad' AND step = 0")
    assert len(grads) == 6
    assert {g["phase"] for g in grads} == {"backward"}
    assert {g["module_path"] for g in grads} == {
        "network.blocks.0.lin",
        "network.blocks.1.lin",
        "network.head",
    }
    (gw,) = tensors(run, f"seq = {grads[0]['seq']}")
    assert gw["role"] == "grad" and gw["mean"] is not None and gw["dump_path"]
    assert any("_grad_" in f for f in npy_files(run))
    assert {x["kind"] for x in ops(run)} == {"module", "grad"}


def test_module_names_rule_and_raising_forward(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import torch
        import torch.nn as nn

        class Bad(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = nn.Linear(2, 2)

            def forward(self, x):
                self.inner(x)
                raise ValueError("no")

        encoder = nn.Sequential(nn.Linear(2, 2), nn.Tanh())   # a global

        def main():
            local_net = nn.Sequential(nn.Linear(2, 2))
            local_net(torch.ones(1, 2))
            encoder(torch.ones(1, 2))
            encoder[0](torch.ones(1, 2))          # a submodule alone keeps its path
            nn.Linear(2, 2)(torch.ones(1, 2))     # no name anywhere: "model"
            bad = Bad()
            try:
                bad(torch.ones(1, 2))
            except ValueError:
                pass
            torch.zeros(1)                        # back at top level: no module

        main()
        """,
        env={"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "api,module"},
    ).check()
    run = r.run_dir
    mods = [(m["module_path"], m["status"]) for m in ops(run, "kind = 'module'")]
    assert mods == [
        ("local_net", "ok"),
        ("local_net.0", "ok"),
        ("encoder", "ok"),
        ("encoder.0", "ok"),
        ("encoder.1", "ok"),
        ("encoder.0", "ok"),
        ("model", "ok"),
        ("bad", "ValueError"),
        ("bad.inner", "ok"),
    ]
    assert ops(run)[-1]["op"] == "torch.zeros" and ops(run)[-1]["module_path"] is None


@pytest.mark.slow
def test_torch_compile_works_and_gives_the_same_results(tmp_path: Path) -> None:
    prog = """
        import json, warnings
        import torch
        import torch.nn as nn
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        compiled = torch.compile(m)
        x = torch.randn(8, 16)
        with warnings.catch_warnings(record=True) as caught:  # the same warnings (none)
            warnings.simplefilter("always")
            y = compiled(x)
        y.square().mean().backward()
        out = [y.sum().item().hex(), m[0].weight.grad.sum().item().hex()]
        out.append(sorted(str(w.message)[:60] for w in caught))
        print(json.dumps(out))
    """
    bare = run_script(tmp_path, prog, probe=False, timeout=300).check()
    probed = run_script(
        tmp_path,
        prog,
        env={"PPROBE_MODE": "stats", "PPROBE_TORCH_LEVEL": "api,aten,module"},
        timeout=300,
    ).check()
    assert json.loads(bare.out.splitlines()[-1]) == json.loads(probed.out.splitlines()[-1])
    run = probed.run_dir
    assert not meta(run)["errors"], probed.err
    # Inside compiled code: the extern kernels the generated wrapper calls (addmm) and the
    # aten ops they run are rows, with the compiled module's path; fused kernels are not.
    inside = ops(run, "module_path = 'compiled'")
    assert "torch._dynamo.eval_frame.OptimizedModule" in {o["op"] for o in inside}
    assert "torch.addmm" in {o["op"] for o in inside}
    assert "torch.nn.functional.linear" not in op_names(run)
    assert "aten.mm.out" in op_names(run, "phase = 'backward'") or "aten.mm.default" in op_names(
        run, "phase = 'backward'"
    )


def test_transformer_paths_at_every_level(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        torch_progs.TRAIN,
        "1",
        env={"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "api,aten,module"},
    ).check()
    run = r.run_dir
    paths = {o["module_path"] for o in ops(run, "kind = 'module'")}
    for p in (
        "model",
        "model.embed",
        "model.encoder",
        "model.encoder.layers.0",
        "model.encoder.layers.0.self_attn",
        "model.encoder.layers.0.linear1",
        "model.encoder.layers.1.norm2",
        "model.head",
        "net",
        "net.fc1",
    ):
        assert p in paths, p
    attn = ops(run, "module_path = 'model.encoder.layers.0.self_attn' AND kind = 'aten'")
    # backward aten rows carry the module path of the forward they differentiate
    assert attn and {a["phase"] for a in attn} == {"forward", "backward"}
