"""Module paths and phases read from the frames (the api level alone, native engine) are the
ones the global module hooks give (the module level on, or the Python engine).

With the api level alone the native core finds the running module when a row is recorded, in
the innermost frame of ``nn.Module._call_impl`` / ``_wrapped_call_impl``, and installs no
global module hook (torch's ``_call_impl`` keeps its fast path). Adding the module level
installs the hooks; its module rows are left out of the comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import meta, run_script, sql

torch = pytest.importorskip("torch")

PROG = """
import threading
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x)) + float(np.sum(np.ones(2)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)

    def forward(self, x, helper=None):
        h = self.blocks(x)
        if helper is not None:
            h = helper(h)  # a module that is not a descendant: named where it is called
        return self.head(h)


class Boom(nn.Module):
    def forward(self, x):
        x = x * 2
        raise ValueError("boom")


class Trainer:
    def __init__(self):
        self.enc = nn.Linear(4, 4)  # a root named by the attribute of ``self`` that holds it

    def run(self, x):
        return self.enc(x).relu()


head = nn.Linear(4, 4)  # a root named by a global
x = torch.randn(3, 4)
torch.zeros(2).add(1)  # before training: init
model = Net()
extra = nn.Linear(4, 4)
out = model(x, helper=extra)
model.blocks[1].fc(x).sum()  # a descendant called on its own: its path below the root
Trainer().run(x)
head(x).mean()
try:
    Boom()(x)
except ValueError:
    pass
torch.ones(2).mul(3)  # after a forward that raised: no module, phase other

# LBFGS: the closure runs inside opt.step(): forward rows in the model, optimizer rows outside
opt = torch.optim.LBFGS(model.parameters(), max_iter=2)


def closure():
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


opt.step(closure)

# another thread: its own frames
t = threading.Thread(target=lambda: model.head(x).abs(), name="worker")
t.start()
t.join()
print("ok")
"""


def _paths_fact(run: Path) -> str:
    return meta(run)["coverage"]["frameworks"]["torch"]["torch"]["module_paths"]  # type: ignore[no-any-return]


def _rows(run: Path) -> list[tuple]:
    return [
        (r["op"], r["caller"].rsplit(":", 1)[1], r["thread"], r["module_path"], r["phase"])
        for r in sql(
            run,
            "SELECT op, caller, thread, module_path, phase FROM ops "
            "WHERE kind <> 'module' AND caller LIKE '%prog.py:%' ORDER BY pid, seq",
        )
    ]


def _line(prog: str, text: str) -> str:
    """The line number (as a str) of the line of ``prog`` that holds ``text``."""
    (n,) = [i for i, t in enumerate(prog.splitlines(), 1) if text in t]
    return str(n)


# stats mode with PPROBE_ON_NAN: the native core hands each row to recorder._end (its module
# and phase from the core's where()); log mode: the rows are the core's own
@pytest.mark.parametrize(
    "env", [{"PPROBE_MODE": "log"}, {"PPROBE_MODE": "stats", "PPROBE_ON_NAN": "warn"}]
)
def test_frames_give_the_hooks_paths_and_phases(tmp_path: Path, env: dict[str, str]) -> None:
    api = run_script(tmp_path / "a", PROG, env=env).check()
    hooks = run_script(
        tmp_path / "b", PROG, env={**env, "PPROBE_TORCH_LEVEL": "api,module"}
    ).check()
    assert api.out.strip() == hooks.out.strip() == "ok"
    engine = meta(api.run_dir)["core"]["engine"]
    assert _paths_fact(api.run_dir) == ("frames" if engine == "native" else "hooks")
    assert _paths_fact(hooks.run_dir) == "hooks"
    got = _rows(api.run_dir)
    assert got == _rows(hooks.run_dir)

    def at(text: str) -> set[tuple[str, str, str | None, str]]:
        line = _line(PROG, text)
        return {(op, th, p, ph) for op, ln, th, p, ph in got if ln == line}

    assert at("torch.zeros(2).add(1)") == {
        ("torch.zeros", "MainThread", None, "init"),
        ("torch.Tensor.add", "MainThread", None, "init"),
    }
    block = at("return self.act(self.fc(x))")
    for i in (0, 1):
        assert {
            ("torch.nn.functional.linear", "MainThread", f"model.blocks.{i}.fc", "forward"),
            ("torch.tanh", "MainThread", f"model.blocks.{i}.act", "forward"),
            ("numpy.ones", "MainThread", f"model.blocks.{i}", "forward"),  # NumPy in a forward
            ("numpy.sum", "MainThread", f"model.blocks.{i}", "forward"),
            ("torch.Tensor.add", "MainThread", f"model.blocks.{i}", "forward"),
        } <= block
    assert len(block) == 10
    assert at("h = helper(h)") == {
        ("torch.nn.functional.linear", "MainThread", "helper", "forward")
    }
    assert at("return self.head(h)") == {
        ("torch.nn.functional.linear", "MainThread", "model.head", "forward")
    }
    assert at("model.blocks[1].fc(x).sum()") == {
        ("torch.nn.functional.linear", "MainThread", "model.blocks.1.fc", "forward"),
        ("torch.Tensor.sum", "MainThread", None, "other"),
    }
    assert at("return self.enc(x).relu()") == {
        ("torch.nn.functional.linear", "MainThread", "enc", "forward"),
        ("torch.Tensor.relu", "MainThread", None, "other"),
    }
    assert at("head(x).mean()") == {
        ("torch.nn.functional.linear", "MainThread", "head", "forward"),
        ("torch.Tensor.mean", "MainThread", None, "other"),
    }
    # a temporary module that no name holds: "model" (docs/torch.md); after it raised, no module
    assert at("x = x * 2") == {("torch.Tensor.mul", "MainThread", "model", "forward")}
    assert at("torch.ones(2).mul(3)") == {
        ("torch.ones", "MainThread", None, "other"),
        ("torch.Tensor.mul", "MainThread", None, "other"),
    }
    # LBFGS: the closure runs inside opt.step(): the model's rows forward, the loss optimizer
    assert at("loss = model(x).pow(2).mean()") == {
        ("torch.Tensor.pow", "MainThread", None, "optimizer"),
        ("torch.Tensor.mean", "MainThread", None, "optimizer"),
    }
    lbfgs_forwards = [r for r in got if r[1] == _line(PROG, "return self.head(h)")]
    assert len(lbfgs_forwards) == 1 + 2  # the first call, then the closure's (max_iter=2)
    # another thread's rows: its own frames
    assert at("model.head(x).abs()") == {
        ("torch.nn.functional.linear", "worker", "model.head", "forward"),
        ("torch.Tensor.abs", "worker", None, "other"),
    }


def test_no_global_module_hook_with_frames(tmp_path: Path) -> None:
    """The api level alone leaves torch's module calls on their fast path (native engine)."""
    prog = """
    import torch
    from torch.nn.modules import module as m

    lin = torch.nn.Linear(2, 2)
    lin(torch.ones(1, 2))
    print(len(m._global_forward_pre_hooks), len(m._global_forward_hooks_always_called))
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log"}).check()
    engine = meta(r.run_dir)["core"]["engine"]
    assert _paths_fact(r.run_dir) == ("frames" if engine == "native" else "hooks")
    assert r.out.split() == (["0", "0"] if engine == "native" else ["1", "1"])
    rows = sql(r.run_dir, "SELECT module_path, phase FROM ops WHERE op LIKE '%linear'")
    assert rows == [{"module_path": "lin", "phase": "forward"}]


ZERO_GRAD = """
import torch
from torch.overrides import TorchFunctionMode

torch.manual_seed(0)
net = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


class Count(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def step():
    net(torch.ones(4, 3)).sum().backward()


step()
opt.zero_grad()                          # mark none: no row
torch.ones(1).add(1)                     # mark after: the mode is back
step()
opt.zero_grad(set_to_none=False)         # mark zero: rows
step()
with Count() as c:
    opt.zero_grad()                      # mark counted: a program's mode sees every call
print(c.n, [p.grad for p in net.parameters()])
opt.param_groups[0]["params"].append(object())
try:
    opt.zero_grad()                      # mark raises
except AttributeError as e:
    print(type(e).__name__, e)
torch.ones(1).mul(2)                     # mark last: the mode is back
"""


def test_zero_grad_without_the_mode(tmp_path: Path) -> None:
    """zero_grad() (set_to_none) runs with pprobe's api mode off the stack: no row is lost, a
    program's own mode above it sees what it sees unprobed, and an exception leaves the mode
    on."""
    bare = run_script(tmp_path / "a", ZERO_GRAD, probe=False).check()
    r = run_script(tmp_path / "b", ZERO_GRAD, env={"PPROBE_MODE": "log"}).check()
    assert r.out == bare.out
    assert r.out.splitlines() == [
        "6 [None, None]",  # p.grad read and set for 2 parameters, the profiler's 2 calls
        "AttributeError 'object' object has no attribute 'grad'",
    ]
    marks = {}
    for number, text in enumerate(ZERO_GRAD.splitlines(), 1):
        if "# mark " in text:
            marks[str(number)] = text.split("# mark ")[1].split(":")[0].split()[0]
    rows = sql(r.run_dir, "SELECT op, caller FROM ops WHERE caller LIKE '%prog.py:%'")
    got: dict[str, set[str]] = {}
    for x in rows:
        mark = marks.get(x["caller"].rsplit(":", 1)[1])
        if mark is not None:
            got.setdefault(mark, set()).add(x["op"])
    assert got == {
        "after": {"torch.ones", "torch.Tensor.add"},
        "zero": {"torch.Tensor.requires_grad_", "torch.Tensor.zero_"},
        "last": {"torch.ones", "torch.Tensor.mul"},
    }


def test_zero_grad_takes_the_mode_off(tmp_path: Path) -> None:
    """What the parameters' ``grad`` reads see of the mode stack inside zero_grad."""
    prog = """
    import torch

    class Param:  # zero_grad reads p.grad: here a property that looks at the mode stack
        seen = []

        @property
        def grad(self):
            Param.seen.append(torch._C._len_torch_function_stack())
            return None

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    opt.param_groups[0]["params"].append(Param())
    opt.zero_grad()
    opt.zero_grad(set_to_none=False)
    opt.zero_grad(True)
    print(Param.seen, torch._C._len_torch_function_stack())
    """
    assert run_script(tmp_path / "a", prog, probe=False).check().out.split("]")[0] == "[0, 0, 0"
    r = run_script(tmp_path / "b", prog, env={"PPROBE_MODE": "log"}).check()
    assert r.out.strip() == "[0, 1, 0] 1"


EDGES = """
import torch
from torch import nn

torch.manual_seed(0)


class TrainStep(nn.Module):  # a module whose forward steps an optimizer (meta-learning style)
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

    def forward(self, x):
        loss = self.net(x).pow(2).mean()
        loss.backward()
        self.opt.step()                                  # mark step: optimizer rows
        return loss


class Quiet(nn.Module):
    def forward(self, x):
        return torch.nn.functional.relu(x)               # excluded: no row


quiet = Quiet()
quiet(torch.ones(2))                                     # the first module call: no row
torch.ones(2).add(1)                                     # mark after: training started
TrainStep()(torch.ones(4, 3))
"""


def test_optimizer_inside_a_forward_and_training_start(tmp_path: Path) -> None:
    """An optimizer stepped inside a module's forward gives optimizer rows (the hooks set the
    phase at the step's start, after the module's); a first module call that records nothing
    still starts training (rows after it are ``other``, not ``init``)."""
    env = {"PPROBE_MODE": "log", "PPROBE_EXCLUDE": "torch.nn.functional.relu"}
    api = run_script(tmp_path / "a", EDGES, env=env).check()
    hooks = run_script(tmp_path / "b", EDGES, env={**env, "PPROBE_TORCH_LEVEL": "api,module"})
    assert _rows(api.run_dir) == _rows(hooks.check().run_dir)
    line = {k: _line(EDGES, f"# mark {k}") for k in ("step", "after")}
    got = {(ln, op, p, ph) for op, ln, _, p, ph in _rows(api.run_dir) if ln in line.values()}
    assert {(op, p, ph) for ln, op, p, ph in got if ln == line["after"]} == {
        ("torch.ones", None, "other"),
        ("torch.Tensor.add", None, "other"),
    }
    step = {(op, p, ph) for ln, op, p, ph in got if ln == line["step"]}
    assert step and {ph for _, _, ph in step} == {"optimizer"}
    assert {p for _, p, _ in step} == {"model"}  # inside the (unnamed) TrainStep's call


SESSIONS = """
import functools
import pprobe
import torch

net = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
kept = opt.zero_grad                       # a bound method kept across sessions
orig = torch.optim.Optimizer.zero_grad


@functools.wraps(orig)
def wrapped(self, *a, **k):                # a library's wrapper over pprobe's
    return orig(self, *a, **k)


torch.optim.Optimizer.zero_grad = wrapped
net(torch.ones(1, 2)).sum().backward()
pprobe.disable()
kept()
opt.zero_grad()
pprobe.enable()
net(torch.ones(1, 2)).sum().backward()
opt.zero_grad()
net(torch.ones(1, 2)).sum().backward()
kept(set_to_none=False)
print([p.grad for p in net.parameters()][0] is None, torch._C._len_torch_function_stack())
"""


def test_zero_grad_across_sessions(tmp_path: Path) -> None:
    """pprobe's zero_grad keeps working after the probe stops and starts again, also when it
    was kept as a bound method or wrapped by someone else."""
    r = run_script(tmp_path, SESSIONS, env={"PPROBE_MODE": "log"}).check()
    assert r.out.split() == ["False", "1"]  # zeroed in place (set_to_none=False); mode on
    assert "Error" not in r.err


#: The optimizer programs' start: a parameter whose ``grad`` property records the length of
#: the torch function mode stack at each read, and a program's own pass-through mode.
OPT_PRELUDE = """
import contextlib
import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class Param:  # _init_group reads p.grad: here a property that looks at the mode stack
    seen = []

    @property
    def grad(self):
        Param.seen.append(torch._C._len_torch_function_stack())
        return None


class PassThrough(TorchFunctionMode):  # a program's mode above pprobe's: its mode stays
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
"""

INIT_GROUP = (
    OPT_PRELUDE
    + """
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
for kw in ({}, {"momentum": 0.9}, {"momentum": 0.9, "fused": True}):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, **kw)
    opt.param_groups[0]["params"].append(Param())
    for mine in (False, True, False, True):  # (the first step makes momentum's buffers)
        opt.zero_grad()
        net(torch.ones(5, 4)).pow(2).sum().backward()
        with PassThrough() if mine else contextlib.nullcontext():
            opt.step()
print(Param.seen, torch._C._len_torch_function_stack())
"""
)


def test_sgd_init_group_runs_without_the_mode(tmp_path: Path) -> None:
    """SGD's ``_init_group`` (its parameters' ``grad`` and ``is_sparse`` reads: no row) runs
    with pprobe's api mode off the stack, unless ``fused`` is set (its check calls a torch
    function) or a program's mode is above pprobe's; the optimizer's rows are the same with
    the mode off as with it on, momentum's buffers included."""
    # each step's two reads of Param.grad: zero_grad's (the mode off, as before), then
    # _init_group's
    bare = run_script(tmp_path / "a", INIT_GROUP, probe=False).check()
    assert bare.out.strip() == f"{[0, 0, 0, 1] * 6} 0"
    r = run_script(tmp_path / "b", INIT_GROUP, env={"PPROBE_MODE": "log"}).check()
    # off in the plain steps without and with momentum; on under the program's mode (pprobe's
    # below it) and in the fused steps
    assert r.out.strip() == f"{[0, 0, 0, 2] * 4 + [0, 1, 0, 2] * 2} 1"
    rows = sql(r.run_dir, "SELECT step, op FROM ops WHERE phase = 'optimizer' ORDER BY seq")
    by_step: dict[int, list[str]] = {}
    for x in rows:
        by_step.setdefault(x["step"], []).append(x["op"])
    assert len(by_step) == 12, by_step
    ops = [by_step[s] for s in sorted(by_step)]
    for k in range(0, 12, 4):  # the steps without the mode against those with it
        assert ops[k + 2] == ops[k + 1] == ops[k + 3] and ops[k], (k, ops[k : k + 4])
    off = meta(r.run_dir)["coverage"]["frameworks"]["torch"]["torch"]["mode_off"]
    assert off[0] == "torch.optim.Optimizer.zero_grad"
    assert "torch.optim.sgd.SGD._init_group" in off


def test_only_known_init_groups_run_without_the_mode() -> None:
    """The optimizers whose ``_init_group`` runs with the mode off are chosen by their code:
    SGD's (this torch), not Adam's (it makes its state's tensors), and not a function that
    names the same things as SGD's but computes with the tensors."""
    from pprobe.interceptors import torch_api

    def quiet(code: Any) -> bool:
        return torch_api._init_group_digest(code) in torch_api._QUIET_INIT_GROUPS

    assert quiet(torch.optim.SGD._init_group.__code__)
    assert not quiet(torch.optim.Adam._init_group.__code__)
    assert not quiet(torch.optim.AdamW._init_group.__code__)

    def _init_group(self, group, params, grads, momentum_buffer_list):  # type: ignore[no-untyped-def]
        for p in group["params"]:
            if p.grad is not None:
                grads.append(p.grad * 2)
        return False

    assert not quiet(_init_group.__code__)


#: Five steps of each optimizer made by ``makers`` (name -> (model, make)), one more
#: parameter (Param) appended to its group; each prints what its parameter's ``grad`` reads
#: saw of the mode stack, and at the end the stack's depth and the models' outputs.
OPT_STEPS = (
    OPT_PRELUDE
    + """
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
flat = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 2, bias=False))
O = torch.optim
makers = MAKERS
for name, (model, make) in makers.items():
    opt = make(list(model.parameters()))
    opt.param_groups[0]["params"].append(Param())
    Param.seen = []
    for mine in (False, False, True, False, True):  # (the first step makes the state)
        opt.zero_grad()
        model(torch.ones(5, 4)).pow(2).sum().backward()
        with PassThrough() if mine else contextlib.nullcontext():
            opt.step()
    print(name, Param.seen)
with torch.no_grad():
    print(torch._C._len_torch_function_stack(), float(net(torch.ones(1, 4)).sum()),
          float(flat(torch.ones(1, 4)).sum()))
"""
)

INIT_GROUP_STATE = OPT_STEPS.replace(
    "MAKERS",
    """{
    "adam": (net, lambda ps: O.Adam(ps, lr=0.01)),
    "adamw": (net, lambda ps: O.AdamW(ps, lr=0.01, amsgrad=True)),
    "rmsprop": (net, lambda ps: O.RMSprop(ps, lr=0.01, momentum=0.9, centered=True)),
    "adam-fused": (net, lambda ps: O.Adam(ps, lr=0.01, fused=True)),
}""",
)


def _optimizer_ops_by_step(run_dir: Path) -> list[list[str]]:
    """The ops of each step's optimizer phase, step by step."""
    rows = sql(run_dir, "SELECT step, op FROM ops WHERE phase = 'optimizer' ORDER BY seq")
    by_step: dict[int, list[str]] = {}
    for x in rows:
        by_step.setdefault(x["step"], []).append(x["op"])
    return [by_step[s] for s in sorted(by_step)]


def test_adam_and_rmsprop_init_group_without_the_mode_once_their_state_exists(
    tmp_path: Path,
) -> None:
    """Adam's (AdamW's) and RMSprop's ``_init_group`` run with pprobe's api mode off once every
    parameter with a gradient has its state (checked with the mode off, which reads each
    ``grad`` once more); at the first step, which makes the state's tensors, the mode stays
    on and those tensors are rows. Not with ``fused`` or under a program's mode. The rows are
    the same with the mode off as with it on, and so are the results."""
    bare = run_script(tmp_path / "a", INIT_GROUP_STATE, probe=False).check()
    r = run_script(tmp_path / "b", INIT_GROUP_STATE, env={"PPROBE_MODE": "log"}).check()
    seen = [line.split(" ", 1) for line in r.out.splitlines()]
    # the same weights at the end; pprobe's mode on the stack (1) after the steps
    assert seen[-1] == ["1", bare.out.splitlines()[-1].split(" ", 1)[1]]
    # each step: zero_grad's read (mode off), [the check's read, then] _init_group's
    plain = [0, 1] + [0, 0, 0] + [0, 2] + [0, 0, 0] + [0, 2]
    kept = [0, 1] * 2 + [0, 2] + [0, 1] + [0, 2]
    assert dict(seen[:-1]) == {
        "adam": str(plain),
        "adamw": str(plain),
        "rmsprop": str(plain),
        "adam-fused": str(kept),
    }
    for line in bare.out.splitlines()[:-1]:
        assert line.split(" ", 1)[1] == str([0, 0, 0, 0, 0, 1, 0, 0, 0, 1])
    ops = _optimizer_ops_by_step(r.run_dir)
    assert len(ops) == 20, ops
    for k in range(0, 20, 5):  # per optimizer: its first step makes the state (rows)
        assert "torch.zeros_like" in ops[k], (k, ops[k])
        assert ops[k + 1] == ops[k + 2] == ops[k + 3] == ops[k + 4] and ops[k + 1], k
        assert "torch.zeros_like" not in ops[k + 1], (k, ops[k + 1])
    off = meta(r.run_dir)["coverage"]["frameworks"]["torch"]["torch"]["mode_off"]
    assert "torch.optim.adam.Adam._init_group" in off
    assert "torch.optim.rmsprop.RMSprop._init_group" in off


INIT_GROUP_MORE = OPT_STEPS.replace(
    "MAKERS",
    """{
    "adagrad": (net, lambda ps: O.Adagrad(ps, lr=0.01)),
    "nadam": (net, lambda ps: O.NAdam(ps, lr=0.01)),
    "radam": (net, lambda ps: O.RAdam(ps, lr=0.01)),
    "adamax": (net, lambda ps: O.Adamax(ps, lr=0.01)),
    "adadelta": (net, lambda ps: O.Adadelta(ps)),
    "asgd": (net, lambda ps: O.ASGD(ps, lr=0.01)),
    "rprop": (net, lambda ps: O.Rprop(ps, lr=0.01)),
    "muon": (flat, lambda ps: O.Muon(ps, lr=0.01)),  # (2-D parameters only)
}""",
)


def test_more_optimizers_init_group_without_the_mode_once_their_state_exists(
    tmp_path: Path,
) -> None:
    """Adagrad's, NAdam's, RAdam's, Adamax's, Adadelta's, ASGD's, Rprop's and Muon's
    ``_init_group`` run with the api mode off once every parameter with a gradient has its
    state, as Adam's: the mode stays for the step that makes the state (rows), Adagrad's
    constructor makes it (its first step is quiet too), and a program's mode above pprobe's
    keeps it. The rows of the steps after the first are the same, and so are the weights."""
    bare = run_script(tmp_path / "a", INIT_GROUP_MORE, probe=False).check()
    r = run_script(tmp_path / "b", INIT_GROUP_MORE, env={"PPROBE_MODE": "log"}).check()
    seen = dict(line.split(" ", 1) for line in r.out.splitlines())
    last = r.out.splitlines()[-1].split(" ")
    assert last == ["1", *bare.out.splitlines()[-1].split(" ")[1:]]
    # each step: zero_grad's read (mode off), [the check's read, then] _init_group's
    lazy = [0, 1] + [0, 0, 0] + [0, 2] + [0, 0, 0] + [0, 2]
    eager = [0, 0, 0] + [0, 0, 0] + [0, 2] + [0, 0, 0] + [0, 2]
    names = ["adagrad", "nadam", "radam", "adamax", "adadelta", "asgd", "rprop", "muon"]
    for name in names:
        assert seen[name] == str(eager if name == "adagrad" else lazy), (name, seen[name])
    for line in bare.out.splitlines()[:-1]:
        assert line.split(" ", 1)[1] == str([0, 0, 0, 0, 0, 1, 0, 0, 0, 1])
    ops = _optimizer_ops_by_step(r.run_dir)
    assert len(ops) == 5 * len(names), ops
    for k, name in zip(range(0, len(ops), 5), names):
        first = ops[k]
        makes = [o for o in first if o in ("torch.zeros_like", "torch.full_like")]
        assert bool(makes) == (name != "adagrad"), (name, first)
        assert ops[k + 1] == ops[k + 2] == ops[k + 3] == ops[k + 4] and ops[k + 1], name
        assert not {"torch.zeros_like", "torch.full_like"} & set(ops[k + 1]), (name, ops[k + 1])
    off = meta(r.run_dir)["coverage"]["frameworks"]["torch"]["torch"]["mode_off"]
    for cls in ("adagrad.Adagrad", "nadam.NAdam", "radam.RAdam", "adamax.Adamax"):
        assert f"torch.optim.{cls}._init_group" in off, off
    for cls in ("adadelta.Adadelta", "asgd.ASGD", "rprop.Rprop", "Muon"):
        assert f"torch.optim.{cls}._init_group" in off, off


def test_init_groups_quiet_once_their_state_exists_are_known_by_their_code() -> None:
    """The ``_init_group`` methods of this torch's optimizers that make rows only for their
    state (Adam, RMSprop, Adagrad, NAdam, RAdam, Adamax, Adadelta, ASGD, Rprop, Muon) are the
    ones run with the mode off once their state exists; SGD's is quiet from the start; a
    tweaked copy is neither."""
    from pprobe.interceptors import torch_api

    def digest(f: Any) -> str:
        return torch_api._init_group_digest(f.__code__)

    opt = torch.optim
    for name in ("Adam", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD"):
        assert digest(getattr(opt, name)._init_group) in torch_api._QUIET_WITH_STATE, name
    for cls in (opt.Rprop, opt.Muon):
        assert digest(cls._init_group) in torch_api._QUIET_WITH_STATE, cls
    assert digest(opt.SGD._init_group) not in torch_api._QUIET_WITH_STATE
    assert digest(opt.SGD._init_group) in torch_api._QUIET_INIT_GROUPS
    code = opt.Adam._init_group.__code__
    tweaked = torch_api._init_group_digest(code.replace(co_names=(*code.co_names, "extra")))
    assert tweaked not in torch_api._QUIET_WITH_STATE | torch_api._QUIET_INIT_GROUPS
