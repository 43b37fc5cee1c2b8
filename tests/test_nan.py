"""``pprobe nan`` and ``pprobe.nan_origins``: the op where a NaN or inf was born.

End to end: programs run through the bootstrap in subprocesses (stats and dump modes), then
``python -m pprobe nan`` reads their run folder. Expected origins, lines and statistics are
computed here from the programs' own source and NumPy, not copied from pprobe's output.
Below them, fast unit tests of the classification on synthetic calls.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PYTHON, Result, run, run_script, write

import pprobe
from pprobe import nan as nanmod
from pprobe.config import ConfigError


def pprobe_nan(tmp_path: Path, run_dir: Path | str, *args: str, **env: str) -> Result:
    return run(
        [PYTHON, "-m", "pprobe", "nan", str(run_dir), *args],
        tmp_path,
        probe=False,
        env=dict(env, COLUMNS="200"),
    )


def nan_json(tmp_path: Path, run_dir: Path | str, *args: str, rc: int = 1, **env: str) -> Any:
    r = pprobe_nan(tmp_path, run_dir, "--format", "json", *args, **env)
    assert r.rc == rc, (r.rc, r.out, r.err)
    return json.loads(r.out)


def line_of(source: str, needle: str) -> int:
    """The 1-based line of ``needle`` in the dedented program text that run_script writes."""
    import textwrap

    lines = textwrap.dedent(source).splitlines()
    hits = [i + 1 for i, s in enumerate(lines) if needle in s]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


# --------------------------------------------------------------------------- NumPy, end to end
LOG_THEN_MUL = """
    import numpy as np
    p = np.array([[0.7, 0.3, 0.0], [0.2, 0.0, 0.8]])
    onehot = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    ok = np.exp(p) + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(p)  # LOG
        terms = onehot * logp  # MUL
        loss = -np.sum(terms)
    print(float(loss))
"""


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_log_of_zero_is_the_origin_and_the_multiply_carries_it(tmp_path: Path, mode: str) -> None:
    r = run_script(tmp_path, LOG_THEN_MUL, env={"PPROBE_MODE": mode}).check()
    assert r.out.strip() == "nan"
    p = np.array([[0.7, 0.3, 0.0], [0.2, 0.0, 0.8]])
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(p)
        terms = np.array([[1.0, 0, 0], [0, 0, 1.0]]) * logp

    rep = nan_json(tmp_path, r.run_dir)
    assert [o["op"] for o in rep["origins"]] == ["numpy.log"]
    o = rep["origins"][0]
    assert o["how"] == "origin"
    assert o["caller"] == f"{tmp_path / 'prog.py'}:{line_of(LOG_THEN_MUL, '# LOG')}"
    assert o["source"] == "logp = np.log(p)  # LOG"
    (inp,), (out,) = o["inputs"], o["outputs"]
    assert (inp["nan"], inp["inf"]) == (0, 0)
    assert (inp["min"], inp["max"]) == (p.min(), p.max())
    assert out["inf"] == int(np.isinf(logp).sum()) == 2 and out["nan"] == 0
    finite = logp[np.isfinite(logp)]
    assert out["min"] == pytest.approx(finite.min()) and out["max"] == pytest.approx(finite.max())
    ch = o["chain"]
    assert ch["first_nan"]["op"] == "numpy.ndarray.__mul__"
    assert ch["ops"] == 2  # the multiply and the sum (NumPy scalar math is not recorded)
    assert rep["first"]["op"] == "numpy.log"
    if mode == "dump":
        assert all(t["dump_path"] for t in o["inputs"] + o["outputs"])
        np.testing.assert_array_equal(pprobe.load(str(r.run_dir / out["dump_path"])), logp)

    # NaN only: the multiply (0 * -inf) is where the NaN was born
    rep = nan_json(tmp_path, r.run_dir, "--no-inf")
    assert [o["op"] for o in rep["origins"]] == ["numpy.ndarray.__mul__"]
    o = rep["origins"][0]
    assert o["caller"].endswith(f":{line_of(LOG_THEN_MUL, '# MUL')}")
    assert o["nan"] == int(np.isnan(terms).sum()) == 2
    assert sorted(t["inf"] for t in o["inputs"]) == [0, 2]

    # text: the origin, its source line, the NaN it became; exit 1
    t = pprobe_nan(tmp_path, r.run_dir)
    assert t.rc == 1, t.err
    assert "ORIGIN  numpy.log produced 2 inf from finite inputs" in t.out
    assert "logp = np.log(p)  # LOG" in t.out
    assert "it became NaN at numpy.ndarray.__mul__" in t.out
    assert "\x1b[" not in t.out  # piped: plain text


def test_python_api_matches_the_cli(tmp_path: Path) -> None:
    r = run_script(tmp_path, LOG_THEN_MUL, env={"PPROBE_MODE": "stats"}).check()
    import pprobe

    rep = pprobe.nan_origins(str(r.run_dir))
    assert rep == nan_json(tmp_path, r.run_dir)
    assert pprobe.nan_origins(str(r.run_dir), inf=False)["first"]["op"] == "numpy.ndarray.__mul__"


CLEAN = """
    import numpy as np
    x = np.linspace(-1, 1, 50)
    for _ in range(3):
        x = np.tanh(x * 1.5) + np.exp(-x * x)
    print(float(x.sum()))
"""


def test_a_clean_run_exits_0(tmp_path: Path) -> None:
    r = run_script(tmp_path, CLEAN, env={"PPROBE_MODE": "stats"}).check()
    rep = nan_json(tmp_path, r.run_dir, rc=0)
    assert rep["origins"] == [] and rep["first"] is None
    assert [p["state"] for p in rep["processes"]] == ["clean"]
    t = pprobe_nan(tmp_path, r.run_dir)
    assert t.rc == 0 and "No NaN or inf was born in this run" in t.out


MASKS = """
    import numpy as np
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 4))
    pad = np.empty(4)                                        # uninitialised: noise
    pad.fill(-np.inf)                                        # in place: no output row
    edge = scores[0] + pad
    causal = np.triu(np.full((4, 4), -np.inf), 1)           # FULL
    keep = rng.random((4, 4)) > 0.3
    np.fill_diagonal(keep, True)
    masked = np.where(keep, scores + causal, -np.inf)        # WHERE
    bias = np.log(keep)                                      # LOGMASK (bool input)
    z = masked - masked.max(axis=1, keepdims=True)
    e = np.exp(z + bias)
    att = e / e.sum(axis=1, keepdims=True)
    print(bool(np.isfinite(att).all()))
    if len(__import__("sys").argv) > 1:                      # a fully masked row: NaN
        row = np.full((1, 4), -np.inf)
        bad = row - row.max(axis=1, keepdims=True)            # BADROW
        print(float(np.exp(bad).sum()))
"""


def test_allowlisted_masks_are_not_origins(tmp_path: Path) -> None:
    r = run_script(tmp_path, MASKS, env={"PPROBE_MODE": "stats"}).check()
    assert r.out.split() == ["True"]
    rep = nan_json(tmp_path, r.run_dir, rc=0)
    assert rep["origins"] == []
    assert [p["state"] for p in rep["processes"]] == ["allowed"]
    allowed = {"numpy.ndarray.fill", "numpy.full", "numpy.where", "numpy.log"}
    assert set(rep["allowed_ops"]) == allowed
    # without the built-in allowlist, the first -inf is from outside the log (the in-place
    # fill has no output), and np.full's -inf is an origin
    rep = nan_json(tmp_path, r.run_dir, "--no-default-allow")
    assert [o["how"] for o in rep["origins"]][:2] == ["entered", "origin"]
    assert rep["origins"][0]["caller"].endswith(f":{line_of(MASKS, 'edge = ')}")
    assert rep["origins"][1]["op"] == "numpy.full"
    assert rep["origins"][1]["caller"].endswith(f":{line_of(MASKS, '# FULL')}")


def test_a_nan_made_from_an_expected_inf_is_an_origin(tmp_path: Path) -> None:
    r = run_script(tmp_path, MASKS, "badrow", env={"PPROBE_MODE": "stats"}).check()
    assert r.out.split() == ["True", "nan"]
    rep = nan_json(tmp_path, r.run_dir)
    assert [o["op"] for o in rep["origins"]] == ["numpy.ndarray.__sub__"]
    o = rep["origins"][0]
    assert o["caller"].endswith(f":{line_of(MASKS, '# BADROW')}")
    assert o["nan"] == 4 and sum(t["inf"] for t in o["inputs"]) == 5


LOG_FLOAT_MASK = """
    import numpy as np
    keep = (np.arange(6) % 2).astype(np.float64)
    with np.errstate(divide="ignore"):
        bias = np.log(keep)
    print(float(np.exp(bias).sum()))
"""


def test_allowlist_is_user_extensible(tmp_path: Path) -> None:
    # stats cannot tell a float 0/1 mask from underflowed probabilities: an origin ...
    r = run_script(tmp_path, LOG_FLOAT_MASK, env={"PPROBE_MODE": "stats"}).check()
    assert nan_json(tmp_path, r.run_dir)["first"]["op"] == "numpy.log"
    # ... unless the user says so: --allow, PPROBE_NAN_ALLOW, pprobe.toml
    assert nan_json(tmp_path, r.run_dir, "--allow", "numpy.log", rc=0)["origins"] == []
    assert nan_json(tmp_path, r.run_dir, rc=0, PPROBE_NAN_ALLOW="log")["origins"] == []
    (tmp_path / "pprobe.toml").write_text('nan_allow = ["numpy.lo?"]\n')
    assert nan_json(tmp_path, r.run_dir, rc=0)["origins"] == []
    (tmp_path / "pprobe.toml").unlink()
    # a dump shows the values: log of a 0/1 float mask is expected there
    d = run_script(tmp_path, LOG_FLOAT_MASK, env={"PPROBE_MODE": "dump"}).check()
    assert nan_json(tmp_path, d.run_dir, rc=0)["origins"] == []
    # a wrong value names the variable and what it allows
    bad = pprobe_nan(tmp_path, r.run_dir, PPROBE_NAN_ALLOW="numpy.log:always")
    assert bad.rc == 2 and bad.out == ""
    assert len(bad.err.splitlines()) == 1
    assert "PPROBE_NAN_ALLOW" in bad.err and ":mask" in bad.err
    bad = pprobe_nan(tmp_path, r.run_dir, "--allow", "a b")
    assert bad.rc == 2 and "--allow" in bad.err and "glob patterns" in bad.err


def test_log_mode_cannot_be_checked_and_says_so(tmp_path: Path) -> None:
    r = run_script(tmp_path, LOG_THEN_MUL, env={"PPROBE_MODE": "log"}).check()
    t = pprobe_nan(tmp_path, r.run_dir)
    assert t.rc == 2 and t.out == ""
    assert len(t.err.splitlines()) == 1
    assert "log mode" in t.err and "PPROBE_MODE=stats" in t.err


def test_a_value_from_outside_the_log_and_run_names(tmp_path: Path) -> None:
    # the log is left out of the capture: the multiply is the first call to see its -inf
    r = run_script(
        tmp_path, LOG_THEN_MUL, env={"PPROBE_MODE": "stats", "PPROBE_EXCLUDE": "log"}
    ).check()
    name = r.run_dir.name
    rep = nan_json(tmp_path, name, PPROBE_OUTPUT=str(r.output))  # a run's name
    assert [(o["op"], o["how"]) for o in rep["origins"]] == [("numpy.ndarray.__mul__", "entered")]
    assert any("exclude" in n for n in rep["notes"])
    t = pprobe_nan(tmp_path, r.output)  # an output folder: its latest run
    assert t.rc == 1 and "its input already held it" in t.out and "note: " in t.out
    # a wrong PPROBE_NAN_ALLOW is a configuration error of the probed program too
    bad = run_script(tmp_path, CLEAN, env={"PPROBE_NAN_ALLOW": "numpy.log:often"})
    assert bad.rc == 0 and bad.pprobe_lines() == bad.err.splitlines()
    assert len(bad.err.splitlines()) == 1 and "PPROBE_NAN_ALLOW" in bad.err


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    t = pprobe_nan(tmp_path, tmp_path / "nowhere")
    assert t.rc == 2 and "no pprobe run found" in t.err and "Traceback" not in t.err
    t = run([PYTHON, "-m", "pprobe", "nan", "--format", "xml"], tmp_path, probe=False)
    assert t.rc == 2 and "invalid choice" in t.err


RANK_CHILD = """
    import os
    import numpy as np
    rank = int(os.environ["RANK"])
    x = np.linspace(0.5, 2.0, 8)
    for step in range(3):
        x = np.sqrt(x) + 0.1
        if step == 2 - rank:                          # rank 1 at step 1, rank 0 at step 2
            with np.errstate(invalid="ignore"):
                x = np.sqrt(x - 5.0)                  # SQRT
        x = x * 1.0
    print(rank, float(x.sum()))
"""
TWO_RANKS = """
    import os, subprocess, sys
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
    for rank in (1, 0):                               # rank 1 runs, and goes bad, first
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        subprocess.run([sys.executable, child], env=env, check=True)
"""


def test_two_ranks_the_first_to_go_bad(tmp_path: Path) -> None:
    write(tmp_path / "child.py", RANK_CHILD)
    r = run_script(tmp_path, TWO_RANKS, env={"PPROBE_MODE": "stats"}).check()
    rep = nan_json(tmp_path, r.run_dir)
    assert [(o["rank"], o["op"]) for o in rep["origins"]] == [(1, "numpy.sqrt"), (0, "numpy.sqrt")]
    assert rep["origins"][0]["ts_ns"] < rep["origins"][1]["ts_ns"]
    assert rep["first"]["rank"] == 1
    assert rep["origins"][0]["source"] == "x = np.sqrt(x - 5.0)                  # SQRT"
    states = {p["rank"]: p["state"] for p in rep["processes"] if p["rank"] is not None}
    assert states == {0: "origin", 1: "origin"}
    t = pprobe_nan(tmp_path, r.run_dir)
    assert t.rc == 1
    assert "First to go bad: rank 1" in t.out


# --------------------------------------------------------------------------- torch, end to end
TORCH_MODEL = """
    import torch
    import torch.nn as nn

    class Attention(nn.Module):
        def forward(self, x):
            scores = x @ x.transpose(-1, -2)
            causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(causal, float("-inf"))     # MASK
            return torch.softmax(scores, dim=-1) @ x

    class Fragile(nn.Module):
        def forward(self, x):
            return torch.sqrt(x - 0.5)                            # SQRT

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), Attention(), nn.Linear(3, 3), Fragile(), nn.Linear(3, 2))
    out = model(torch.randn(4, 3))
    print(bool(torch.isnan(out).any()))
"""


def test_torch_a_nan_born_in_one_layer(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    r = run_script(
        tmp_path, TORCH_MODEL, env={"PPROBE_MODE": "stats", "PPROBE_TORCH_LEVEL": "api,module"}
    ).check()
    assert r.out.strip() == "True"
    rep = nan_json(tmp_path, r.run_dir)
    assert [o["op"] for o in rep["origins"]] == ["torch.sqrt"]
    o = rep["origins"][0]
    assert o["module_path"] == "model.3"
    assert o["within"] == ["__main__.Fragile", "torch.nn.modules.container.Sequential"]
    assert o["caller"].endswith(f"prog.py:{line_of(TORCH_MODEL, '# SQRT')}")
    assert o["source"].startswith("return torch.sqrt(x - 0.5)")
    assert o["inputs"][0]["nan"] == 0 and o["outputs"][0]["nan"] > 0
    assert o["chain"]["ops"] >= 1  # the last Linear carried it
    assert "torch.Tensor.masked_fill" in rep["allowed_ops"]


COLLECTIVE = """
    import os, sys
    import torch
    import torch.distributed as dist
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    t = torch.linspace(1.0, 2.0, 4)
    if rank == 1:
        t = torch.log(t - 1.5)                                   # LOG
    dist.all_reduce(t)
    u = t * 2.0
    dist.destroy_process_group()
    with open(f"result-{rank}.txt", "w") as f:  # the ranks' stdout lines interleave
        f.write(repr(bool(torch.isnan(u).any())))
"""


def test_torch_a_collective_that_received_a_nan_is_propagation(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    launcher = f"""
        import os, subprocess, sys
        prog = {str(tmp_path / "coll.py")!r}
        store = {str(tmp_path / "store")!r}
        ps = [subprocess.Popen([sys.executable, prog, str(r), store]) for r in (0, 1)]
        sys.exit(max(p.wait() for p in ps))
    """
    (tmp_path / "coll.py").write_text(__import__("textwrap").dedent(COLLECTIVE))
    r = run_script(
        tmp_path, launcher, env={"PPROBE_MODE": "stats", "OMP_NUM_THREADS": "1"}, timeout=240
    ).check()
    for rank in (0, 1):
        assert (tmp_path / f"result-{rank}.txt").read_text() == "True"
    rep = nan_json(tmp_path, r.run_dir)
    assert [(o["rank"], o["op"]) for o in rep["origins"]] == [(1, "torch.log")]
    assert rep["first"]["rank"] == 1
    states = {p["rank"]: p for p in rep["processes"] if p["rank"] is not None}
    assert states[0]["state"] == "received" and states[0]["origins"] == 0
    assert states[0]["received"]["op"] == "torch.distributed.all_reduce"
    assert states[1]["state"] == "origin"


# --------------------------------------------------------------------------- unit tests
def T(role: str, nan: int = 0, inf: int = 0, dtype: str = "float32", lo: float = -1.0,
      hi: float = 1.0) -> nanmod.Tensor:  # fmt: skip
    return nanmod.Tensor(role, "0", [4], dtype, "cpu", lo, hi, 0.0, 1.0, nan, inf, None, None)


def C(seq: int, op: str, *tensors: nanmod.Tensor, kind: str = "function", parent: int = -1,
      args: str | None = None) -> nanmod.Call:  # fmt: skip
    return nanmod.Call.of(tensors, host="h", pid=1, rank=None, seq=seq, ts_ns=seq * 10, op=op,
                          kind=kind, step=0, caller="f.py:1", parent=parent, args=args)  # fmt: skip


def kinds(calls: list[nanmod.Call], **kw: Any) -> list[tuple[str, str]]:
    kw.setdefault("allow", nanmod.allowlist())
    return [(c.op, w) for c, w in nanmod.classify(calls, **kw)]


def test_unit_origin_propagation_absorbed() -> None:
    calls = [
        C(1, "log", T("input"), T("output", inf=1)),
        C(2, "mul", T("input"), T("input", inf=1), T("output", nan=1)),
        C(3, "isnan", T("input", nan=1), T("output")),
        C(4, "div", T("input"), T("output", nan=2)),
    ]
    assert kinds(calls) == [
        ("log", "origin"),
        ("mul", "propagation"),
        ("isnan", "absorbed"),
        ("div", "origin"),
    ]
    assert kinds(calls, count_inf=False) == [
        ("mul", "origin"),
        ("isnan", "absorbed"),
        ("div", "origin"),
    ]


def test_unit_entered_collective_grad_and_containers() -> None:
    calls = [
        C(1, "add", T("input", nan=1), T("output", nan=1)),  # no recorded call made it
        C(2, "torch.distributed.all_reduce", T("input"), T("output", nan=1), kind="collective"),
    ]
    assert kinds(calls) == [("add", "entered"), ("torch.distributed.all_reduce", "received")]
    assert kinds(calls[1:]) == [("torch.distributed.all_reduce", "received")]
    # an in-place collective has no output row: what it received shows in the next input
    inplace = C(2, "torch.distributed.all_reduce", T("input"), kind="collective")
    later = [C(3, "mul", T("input", nan=1), T("output", nan=1))]
    assert kinds(later, collectives=[inplace]) == [
        ("torch.distributed.all_reduce", "received"),
        ("mul", "propagation"),
    ]
    sent = [C(2, "torch.distributed.all_reduce", T("input", nan=1), kind="collective")]
    assert kinds([calls[0], *sent]) == [
        ("add", "entered"),
        ("torch.distributed.all_reduce", "propagation"),
    ]
    grads = [C(1, "torch.autograd.accumulate_grad", T("grad", nan=3), kind="grad")]
    assert kinds(grads) == [("torch.autograd.accumulate_grad", "origin")]
    # uninitialised memory is noise; what overwrites it absorbs it
    init = [
        C(1, "torch.empty", T("output", nan=2, inf=1)),
        C(2, "torch.Tensor.uniform_", T("input", nan=2, inf=1), T("output")),
        C(3, "torch.Tensor.add", T("input", nan=1), T("output", nan=1)),
    ]
    assert kinds(init) == [("torch.Tensor.uniform_", "absorbed"), ("torch.Tensor.add", "entered")]
    nested = [
        C(1, "Linear", T("input"), T("output", nan=1), kind="module"),
        C(2, "torch.nn.functional.linear", T("input"), T("output", nan=1), parent=1),
    ]
    assert kinds(nested) == [("torch.nn.functional.linear", "origin")]


def test_unit_allowlist_expected_infs_and_their_nans() -> None:
    calls = [
        C(1, "torch.full", T("output", inf=6), args="1=-inf"),
        C(2, "torch.triu", T("input", inf=6), T("output", inf=3)),
        C(3, "torch.softmax", T("input", inf=3), T("output", nan=4)),
        C(4, "torch.Tensor.add", T("input", nan=4), T("output", nan=4)),
    ]
    assert kinds(calls) == [
        ("torch.full", "allowed"),
        ("torch.triu", "expected"),
        ("torch.softmax", "origin"),
        ("torch.Tensor.add", "propagation"),
    ]
    # an in-place fill with no output (ndarray.fill) makes the next inf expected, not entered
    fill = [
        C(1, "numpy.ndarray.fill", T("input"), args="1=-inf"),
        C(2, "numpy.triu", T("input", inf=4), T("output", inf=2)),
    ]
    assert kinds(fill) == [("numpy.ndarray.fill", "allowed"), ("numpy.triu", "expected")]
    assert kinds(fill[1:]) == [("numpy.triu", "entered")]
    # log is expected only on a 0/1 mask: bool/int inputs by statistics
    mask = [C(1, "numpy.log", T("input", dtype="bool", lo=0, hi=1), T("output", inf=2))]
    assert kinds(mask) == [("numpy.log", "allowed")]
    probs = [C(1, "numpy.log", T("input", lo=0, hi=1), T("output", inf=2))]
    assert kinds(probs) == [("numpy.log", "origin")]
    assert kinds(probs, allow=nanmod.allowlist(["numpy.log"])) == [("numpy.log", "allowed")]
    # a real inf origin makes later infs bad values
    real = [
        C(1, "exp", T("input"), T("output", inf=1)),
        C(2, "torch.full", T("output", inf=6)),
        C(3, "sub", T("input", inf=7), T("output", nan=1)),
    ]
    assert kinds(real) == [("exp", "origin"), ("torch.full", "allowed"), ("sub", "propagation")]


def test_unit_allow_patterns() -> None:
    a = nanmod.Allow.parse("masked_fill*")
    assert a.matches("torch.Tensor.masked_fill_") and not a.mask
    assert nanmod.Allow.parse("torch.*").matches("torch.Tensor.fill_")
    assert not nanmod.Allow.parse("torch.full").matches("torch.full_like")
    assert nanmod.Allow.parse("numpy.log:mask").mask
    with pytest.raises(ConfigError, match="--allow"):
        nanmod.allowlist(["numpy.log:sometimes"])
    assert nanmod.configured_allow(env={"PPROBE_NAN_ALLOW": "a,b:mask"}) == ("a", "b:mask")


def test_unit_source_line(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("a = 1\n    b = np.log(a)  \n")
    assert nanmod.source_line(f"{f}:2") == "b = np.log(a)"
    assert nanmod.source_line("m.py:1", cwd=str(tmp_path)) == "a = 1"
    assert nanmod.source_line(f"{f}:99") is None
    assert nanmod.source_line("<stdin>:3") is None
    assert nanmod.source_line(None) is None


def test_nothing_is_imported_into_the_probed_program(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import sys
        import numpy as np
        np.add(np.ones(2), 1)
        print(sorted(m for m in sys.modules if m in ("pprobe.nan", "pprobe.nancli", "rich")))
        """,
        env={"PPROBE_MODE": "stats"},
    ).check()
    assert r.out.strip() == "[]"
    assert os.path.isdir(r.run_dir)


def _origin(pid: int, rank: int | None, seq: int, ts: int, op: str) -> dict[str, Any]:
    t = {"role": "output", "idx": "0", "shape": [2], "dtype": "float32", "device": "cpu",
         "min": None, "max": None, "mean": None, "std": None, "nan": 2, "inf": 0,
         "dump_path": None, "note": None}  # fmt: skip
    chain = {"ops": 0, "absorbed": 0, "steps": None, "last": None, "first_nan": None,
             "collectives": 0}  # fmt: skip
    return {"host": "h", "pid": pid, "rank": rank, "seq": seq, "ts_ns": ts, "step": 3, "op": op,
            "kind": "function", "phase": None, "module_path": "model.fc", "caller": "x.py:7",
            "caller_function": "f", "args": "1=nan", "source": "y = f(x)", "inputs": [],
            "outputs": [t], "how": "origin", "nan": 2, "inf": 0, "within": [],
            "chain": chain}  # fmt: skip


def render_text(report: dict[str, Any], **kw: Any) -> str:
    import io

    from rich.console import Console

    from pprobe.nancli import render

    buf = io.StringIO()
    render(report, console=Console(file=buf, force_terminal=False, width=300), **kw)
    return buf.getvalue()


def test_unit_render_ranks_further_origins_and_received_only() -> None:
    from pprobe.nancli import found

    procs = [
        {"host": "h", "pid": 10, "rank": 0, "ops": 5, "state": "origin", "origins": 3,
         "received": None},
        {"host": "h", "pid": 11, "rank": 1, "ops": 5, "state": "origin", "origins": 1,
         "received": None},
    ]  # fmt: skip
    origins = [
        _origin(11, 1, 4, 1_000_000, "torch.log"),
        _origin(10, 0, 5, 3_000_000, "torch.sqrt"),
        _origin(10, 0, 8, 4_000_000, "torch.div"),
        _origin(10, 0, 9, 5_000_000, "torch.rsqrt"),
    ]
    report = {"run": "/r", "mode": "stats", "count_inf": True, "processes": procs,
              "origins": origins, "first": {k: origins[0][k] for k in ("host", "pid", "rank",
              "seq", "ts_ns", "step", "op")}, "allowed_ops": {}, "notes": []}  # fmt: skip
    out = render_text(report, max_further=1)
    assert out.count("ORIGIN  ") == 2  # each process's first origin in full
    assert "Further independent origins (2):" in out and "torch.div" in out
    assert "torch.rsqrt" not in out and "1 more (--max 0 lists all" in out
    assert "First to go bad: rank 1 pid 11, torch.log" in out
    assert "origin torch.sqrt (step 3, seq 5), +2.000 ms; 2 more" in out
    assert "args    1=nan" in out and "y = f(x)" in out
    assert found(report)
    # a rank that only received a value, from a rank that recorded no origin
    coll = {"host": "h", "pid": 10, "rank": 0, "seq": 2, "ts_ns": 9, "step": 3,
            "op": "torch.distributed.all_reduce"}  # fmt: skip
    procs = [dict(procs[0], state="received", origins=0, received=coll)]
    report = dict(report, processes=procs, origins=[], first=None)
    out = render_text(report)
    assert "No origin in the log" in out
    assert "received it through torch.distributed.all_reduce (step 3, seq 2)" in out
    assert found(report)
    clean = dict(report, processes=[dict(procs[0], state="clean", received=None)])
    assert not found(clean) and "No NaN or inf was born" in render_text(clean)
