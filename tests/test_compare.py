"""pprobe compare: metrics against NumPy computed here, alignment on synthetic ops, and
end-to-end compares of runs made by the bootstrap (fp32 vs fp64 NumPy, fp32 vs bf16 autocast,
an inserted op, a perturbed weight, two ranks, stats mode, a mapping file, the CLI)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PYTHON, REPO, clean_env, run_script, write

from pprobe import compare as C
from pprobe import compare_metrics as cm

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


# ------------------------------------------------------------------ independent reference
def reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> dict[str, Any]:
    """The metrics of docs/compare.md, computed in one go with float64 NumPy."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    fin = np.isfinite(a) & np.isfinite(b)
    same_nonfinite = ~np.isfinite(a) & ~np.isfinite(b) & ((np.isnan(a) & np.isnan(b)) | (a == b))
    fa, fb = a[fin], b[fin]
    d = np.abs(fb - fa)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(fa == 0, np.where(d == 0, 0.0, np.inf), d / np.abs(fa))
    na, nb = np.linalg.norm(fa), np.linalg.norm(fb)
    return {
        "cosine": float(fa @ fb / (na * nb)) if na and nb else (1.0 if na == nb else 0.0),
        "max_abs": float(d.max()),
        "max_rel": float(rel.max()),
        "rmse": float(np.sqrt(np.mean(d**2))),
        "within_1e3": float((np.sum(d <= 1e-3 * np.abs(fa)) + same_nonfinite.sum()) / a.size),
        "within_5e3": float((np.sum(d <= 5e-3 * np.abs(fa)) + same_nonfinite.sum()) / a.size),
        "ratio": float(np.max(d / (atol + rtol * np.abs(fa)))),
        "nan_a": int(np.isnan(a).sum()),
        "nan_b": int(np.isnan(b).sum()),
        "inf_a": int(np.isinf(a).sum()),
        "inf_b": int(np.isinf(b).sum()),
        "mismatch": int(a.size - fin.sum() - same_nonfinite.sum()),
    }


def check_metrics(got: dict[str, Any], ref: dict[str, Any]) -> None:
    for k in ("cosine", "max_abs", "max_rel", "rmse", "within_1e3", "within_5e3", "ratio"):
        assert got[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12, nan_ok=True), k


# ------------------------------------------------------------------ unit: metrics
def _el_dict(e: cm.Elementwise) -> dict[str, Any]:
    return {
        "cosine": e.cosine,
        "max_abs": e.max_abs,
        "max_rel": e.max_rel,
        "rmse": e.rmse,
        "within_1e3": e.within_1e3,
        "within_5e3": e.within_5e3,
        "ratio": e.ratio,
    }


@pytest.mark.parametrize("chunk", [7, 1000, cm.CHUNK])
def test_metrics_match_numpy_across_chunks(chunk: int) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(5003).astype(np.float32)
    b = (a.astype(np.float64) * (1 + 1e-3 * rng.standard_normal(5003))).astype(np.float32)
    a[10], b[10] = np.nan, np.nan  # same NaN: within, not a mismatch
    a[20], b[20] = np.inf, 1.0  # a mismatch
    b[30] = np.nan  # a mismatch
    a[40] = b[40] = 0.0
    e = cm.compare_arrays(a, b, 1.3e-6, 1e-5, "float32", "float32", chunk=chunk)
    assert e is not None
    ref = reference(a, b, 1.3e-6, 1e-5)
    check_metrics(_el_dict(e), ref)
    assert (e.nan_a, e.nan_b, e.inf_a, e.inf_b) == (
        ref["nan_a"],
        ref["nan_b"],
        ref["inf_a"],
        ref["inf_b"],
    )
    assert e.nonfinite_mismatch == ref["mismatch"] == 2
    assert e.n == a.size and e.n_finite == a.size - 3


def test_metrics_zero_reference_and_identical() -> None:
    a = np.array([0.0, 1.0, 2.0])
    e = cm.compare_arrays(a, a.copy(), 1e-7, 1e-7, "float64", "float64")
    assert e is not None and e.identical and e.max_abs == 0 and e.max_rel == 0 and e.cosine == 1
    e = cm.compare_arrays(a, np.array([1e-9, 1.0, 2.0]), 1e-7, 1e-7, "float64", "float64")
    assert e is not None and not e.identical and e.max_rel == math.inf and e.max_abs == 1e-9


def test_bfloat16_bits_decoded() -> None:
    vals = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact for these
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    e = cm.compare_arrays(vals, bits, 1.6e-2, 1e-5, "float32", "bfloat16")
    assert e is not None
    check_metrics(_el_dict(e), reference(vals, back, 1.6e-2, 1e-5))


def test_compare_stats_formula() -> None:
    sa = {"min": -2.0, "max": 4.0, "mean": 0.5, "std": 1.0}
    sb = {"min": -2.0, "max": 4.004, "mean": 0.5, "std": 1.01}
    d = cm.compare_stats(sa, sb, 1e-3, 1e-5)
    assert d is not None
    assert d.rel["max"] == pytest.approx(0.001) and d.rel["std"] == pytest.approx(0.01)
    assert d.rel["min"] == 0 and d.rel["mean"] == 0
    assert d.ratio == pytest.approx(0.01 / (1e-5 + 1e-3 * 4.0))
    assert cm.compare_stats({"min": None}, sb, 1e-3, 1e-5) is None


def test_dtype_tolerances_and_verdicts() -> None:
    assert cm.dtype_tolerance("float32", "bfloat16") == (1.6e-2, 1e-5)
    assert cm.dtype_tolerance("float64", "float64") == (1e-7, 1e-7)
    assert cm.dtype_tolerance("int64", "int64") == (0.0, 0.0)
    assert cm.verdict_of(1.0, 10) == "pass"
    assert cm.verdict_of(5.0, 10) == "warn"
    assert cm.verdict_of(11.0, 10) == "fail"
    assert cm.verdict_of(math.nan, 10) == "fail"


# ------------------------------------------------------------------ unit: alignment
def _ops(names: list[str], module: str = "m") -> list[C.Op]:
    out = []
    for i, n in enumerate(names):
        mod, _, op = n.rpartition("/")
        out.append(C.Op(1, i, None, op, mod or module, 0, None, None, i))
    return out


def test_align_inserted_op_keeps_later_matches() -> None:
    a = _ops(["linear", "relu", "add", "linear", "add", "add", "mul", "add"])
    b = _ops(["linear", "relu", "add", "linear", "add", "add", "add", "mul", "add"])
    got = C.align_ops(a, b, C.Mapping())
    # the 4th add of A is the 5th of B (after the extra one), not the 4th: no shift
    assert {i: j for i, j, _ in got} == {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 7, 7: 8}
    hows = {i: h for i, _, h in got}
    assert hows[0] == hows[6] == "key" and hows[7] == "lcs"


def test_align_key_join_and_mapping() -> None:
    a = _ops(["enc/linear", "enc/relu", "dec/linear"])
    b = _ops(["encoder/linear", "encoder/gelu", "dec/linear"])
    m = C.Mapping(modules={"encoder": "enc"}, ops={"gelu": "relu"})
    assert [(i, j) for i, j, _ in C.align_ops(a, b, m)] == [(0, 0), (1, 1), (2, 2)]
    assert [(i, j) for i, j, _ in C.align_ops(a, b, C.Mapping())] == [(2, 2)]


def test_align_pairs_unmatched_listed() -> None:
    ra = C.Run("A", "A", {"main": _ops(["x", "y", "z"])})
    rb = C.Run("B", "B", {"main": _ops(["x", "new", "y", "z"]), "child0": _ops(["w"])})
    pairs = C.align(ra, rb)
    hows = [(p.how, (p.a or p.b).op) for p in pairs]  # type: ignore[union-attr]
    assert hows == [("key", "x"), ("only_b", "new"), ("key", "y"), ("key", "z"), ("only_b", "w")]


def test_mapping_file_errors(tmp_path: Path) -> None:
    good = write(
        tmp_path / "m.toml",
        """
        [modules]
        "model.encoder" = "model.enc"
        [[thresholds]]
        op = "*softmax"
        rtol = 0.01
        """,
    )
    m = C.load_mapping(str(good))
    assert m.module("model.encoder.layer.0") == "model.enc.layer.0"
    assert m.module("model.encoderx") == "model.encoderx"
    assert m.rules[0].matches("torch.softmax", None) and m.rules[0].rtol == 0.01
    (tmp_path / "j.json").write_text(json.dumps({"ops": {"a": "b"}}))
    assert C.load_mapping(str(tmp_path / "j.json")).ops == {"a": "b"}
    (tmp_path / "bad.toml").write_text("[colors]\nx = 1\n")
    with pytest.raises(C.CompareError, match="unknown key 'colors'"):
        C.load_mapping(str(tmp_path / "bad.toml"))
    with pytest.raises(C.CompareError, match="cannot read"):
        C.load_mapping(str(tmp_path / "missing.toml"))


# ------------------------------------------------------------------ end to end
NUMPY_PROG = """
import os
import numpy as np

dt = np.float32 if os.environ.get("DT") == "32" else np.float64
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 64)).astype(dt)
w = rng.standard_normal((64, 64)).astype(dt)
y = x + 1.0
z = np.exp(y * 0.5)
big = x * 1e4
v = (big + 1.0) - big  # cancellation: 1.0 in float64, ~1 +- 1e-3 in float32
s = np.tanh(x @ w) + z * v
print(float(s.sum()))
"""

TORCH_PROG = """
import os
import torch

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        if os.environ.get("EXTRA"):
            torch.relu(x)  # an inserted op, of a name the step calls again just after
        h = torch.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        return self.head(h)


model = Net()
if os.environ.get("PERTURB"):
    model.fc2.weight.detach().numpy()[1, 3] += 0.5
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(8, 16)
for step in range(2):
    if os.environ.get("AUTOCAST"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
    else:
        y = model(x)
    loss = (y.float() ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

RANK_PARENT = """
import os, subprocess, sys
ps = [subprocess.Popen([sys.executable, "worker.py"],
                       env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2"}) for r in range(2)]
assert all(p.wait() == 0 for p in ps)
"""

RANK_WORKER = """
import os
import numpy as np

rank = int(os.environ["RANK"])
x = np.arange(100, dtype=np.float64) * (rank + 1)
if os.environ.get("PERTURB") and rank == 1:
    x[5] = 7.0  # item assignment is not an op: the difference enters unseen
y = np.sin(x)
z = np.cumsum(y)
print(float(z[-1]))
"""


def make_run(tmp: Path, prog: str, name: str, **env: str) -> Path:
    d = tmp / name
    d.mkdir()
    r = run_script(d, prog, env=env).check()
    return r.run_dir


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    e = clean_env(**env)
    return subprocess.run(
        [PYTHON, "-m", "pprobe", "compare", *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=str(cwd or REPO),
        timeout=300,
    )


def pairs_json(tmp: Path, a: Path, b: Path, settings: C.Settings | None = None) -> dict[str, Any]:
    """The compare's JSON document, made in this process (runs are made by subprocesses)."""
    from pprobe import compare_cli

    out = tmp / f"cmp-{a.name}-{b.name}.json"
    compare_cli.write(C.compare(str(a), str(b), settings), "json", str(out))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def torch_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torch model in float32, the reference run of the torch tests."""
    return make_run(tmp_path_factory.mktemp("torch"), TORCH_PROG, "a")


def load_dump(path: str) -> np.ndarray:
    import pprobe

    x = pprobe.load(path)
    if not isinstance(x, np.ndarray):  # a torch tensor (bfloat16)
        x = x.float().numpy()
    return np.asarray(x, dtype=np.float64)


def check_rows_against_dumps(doc: dict[str, Any]) -> int:
    """Every dump-compared row's metrics equal those computed here from the two files."""
    n = 0
    for r in doc["pairs"]:
        if r["source"] != "dump":
            continue
        a, b = load_dump(r["dump_a"]), load_dump(r["dump_b"])
        ref = reference(a, b, r["rtol"], r["atol"])
        got = {
            "cosine": r["cosine"],
            "max_abs": r["max_abs_err"],
            "max_rel": _num(r["max_rel_err"]),
            "rmse": r["rmse"],
            "within_1e3": r["within_1e-3"],
            "within_5e3": r["within_5e-3"],
            "ratio": _num(r["error_ratio"]),
        }
        if ref["mismatch"]:  # NaN/inf at different places: fails whatever the ratio
            assert r["tensor_verdict"] == "fail"
        check_metrics(got, ref)
        n += 1
    return n


def _num(v: Any) -> float:
    return math.inf if v == "inf" else math.nan if v is None else float(v)


def expected_first(doc: dict[str, Any], warn_factor: float = 10.0) -> tuple[int, str] | None:
    """The first op (A order) whose output fails while no input fails, computed here from
    the dumps (allclose ratio > warn_factor, or a shape difference)."""
    by_op: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in doc["pairs"]:
        if r["a_seq"] is not None and r["b_seq"] is not None and r["role"]:
            by_op.setdefault((r["a_pid"], r["a_seq"]), []).append(r)
    for key in sorted(by_op):
        rows = by_op[key]

        def fails(r: dict[str, Any]) -> bool:
            if r["source"] != "dump":
                return False
            ref = reference(load_dump(r["dump_a"]), load_dump(r["dump_b"]), r["rtol"], r["atol"])
            return ref["ratio"] > warn_factor or ref["mismatch"] > 0

        outs = [r for r in rows if r["role"] == "output"]
        ins = [r for r in rows if r["role"] == "input"]
        if any(fails(r) for r in outs) and not any(fails(r) for r in ins):
            return key[1], rows[0]["op"]
    return None


@pytest.fixture(scope="module")
def numpy_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """NUMPY_PROG in float32 (A), then float64 (B, the latest), in one output folder."""
    d = tmp_path_factory.mktemp("numpy")
    a = run_script(d, NUMPY_PROG, env={"DT": "32"}).check().run_dir
    b = run_script(d, NUMPY_PROG, env={"DT": "64"}).check().run_dir
    return a, b


def test_numpy_fp32_vs_fp64(tmp_path: Path, numpy_runs: tuple[Path, Path]) -> None:
    a, b = numpy_runs
    doc = pairs_json(tmp_path, a, b)
    s = doc["summary"]
    assert s["only_a"] == s["only_b"] == 0 and s["aligned"] == s["key"] > 0
    assert check_rows_against_dumps(doc) >= 10
    # dtypes differ and are compared in float64 with float32's tolerance
    outs = [r for r in doc["pairs"] if r["role"] == "output" and r["op"] == "numpy.exp"]
    assert outs and outs[0]["dtype_a"] == "float32" and outs[0]["dtype_b"] == "float64"
    assert outs[0]["rtol"] == 1.3e-6
    exp = expected_first(doc)
    assert exp is not None, "fp32 vs fp64 matmul must diverge"
    first = [r for r in doc["pairs"] if r["first_divergence"]]
    assert first and first[0]["a_seq"] == exp[0] and first[0]["op"] == exp[1]
    fd = doc["first_divergence"]
    assert fd["op"] == exp[1] and fd["caller"].endswith("prog.py:" + fd["caller"].split(":")[-1])
    assert fd["source_line"] and fd["source_line"] in (a.parents[1] / "prog.py").read_text()


@needs_torch
def test_torch_fp32_vs_bf16_autocast(tmp_path: Path, torch_base: Path) -> None:
    a = torch_base
    b = make_run(tmp_path, TORCH_PROG, "b", AUTOCAST="1")
    doc = pairs_json(tmp_path, a, b)
    assert doc["summary"]["only_a"] == doc["summary"]["only_b"] == 0
    assert check_rows_against_dumps(doc) >= 20
    lin = [
        r for r in doc["pairs"] if r["op"] == "torch.nn.functional.linear" and r["role"] == "output"
    ]
    assert lin and all(r["dtype_b"] == "bfloat16" and r["dtype_a"] == "float32" for r in lin)
    assert all(r["rtol"] == 1.6e-2 for r in lin)
    exp = expected_first(doc)
    fd = doc["first_divergence"]
    assert exp is not None and fd["a_seq"] == exp[0] and fd["op"] == exp[1]
    assert fd["module_path"] == "model.fc1" and fd["step"] == 0


@needs_torch
def test_torch_inserted_op_aligns_the_rest(tmp_path: Path, torch_base: Path) -> None:
    a = torch_base
    b = make_run(tmp_path, TORCH_PROG, "b", EXTRA="1")
    doc = pairs_json(tmp_path, a, b)
    s = doc["summary"]
    only_b = [r for r in doc["pairs"] if r["match"] == "only_b"]
    # one extra relu per forward (two steps), nothing else unmatched
    assert [(r["op"], r["step"], r["b_module_path"]) for r in only_b] == [
        ("torch.relu", 0, "model"),
        ("torch.relu", 1, "model"),
    ]
    # A's relu is B's second relu of the step (the sequence alignment), and they agree:
    # matched on occurrence alone it would be B's first (of another shape)
    relus = [r for r in doc["pairs"] if r["op"] == "torch.relu" and r["match"] != "only_b"]
    assert relus and all(r["match"] == "lcs" and r["identical"] for r in relus)
    assert all(r["b_seq"] == r["a_seq"] + 1 + r["step"] for r in relus)
    assert s["only_a"] == 0 and s["fail"] == 0 and s["warn"] == 0
    n_a = len({(r["a_pid"], r["a_seq"]) for r in doc["pairs"] if r["a_seq"] is not None})
    assert s["aligned"] == n_a
    # every match pairs the same op in the same module, and later ops keep their partners
    for r in doc["pairs"]:
        if r["match"] in ("key", "lcs"):
            assert r["op"] == r["b_op"] and r["module_path"] == r["b_module_path"]
    heads = [r for r in doc["pairs"] if r["module_path"] == "model.head" and r["role"] == "output"]
    assert len(heads) == 2 and all(r["identical"] for r in heads)
    c = C.compare(str(a), str(b))
    assert c.exit_status("fail") == 0 and c.exit_status("warn") == 1


@needs_torch
def test_torch_perturbed_weight_first_divergence(tmp_path: Path, torch_base: Path) -> None:
    a = torch_base
    b = make_run(tmp_path, TORCH_PROG, "b", PERTURB="1")
    doc = pairs_json(tmp_path, a, b)
    fd = doc["first_divergence"]
    assert fd["op"] == "torch.nn.functional.linear" and fd["module_path"] == "model.fc2"
    assert fd["step"] == 0 and "input 1" in fd["why"]
    assert fd["source_line"] == "h = torch.tanh(self.fc2(h))"
    # the terminal summary (plain text when piped) says the same, and the exit status is 1
    p = cli(str(a), str(b))
    assert p.returncode == 1
    assert "First divergence (main, step 0): torch.nn.functional.linear in model.fc2" in p.stdout
    assert "h = torch.tanh(self.fc2(h))" in p.stdout
    # the carried differences after it are not origins
    assert sum(r["first_divergence"] for r in doc["pairs"] if r["role"] != "input") == 1


def test_two_ranks(tmp_path: Path) -> None:
    runs = []
    for name, env in (("a", {}), ("b", {"PERTURB": "1"})):
        d = tmp_path / name
        d.mkdir()
        write(d / "worker.py", RANK_WORKER)
        runs.append(run_script(d, RANK_PARENT, env=env).check().run_dir)
    doc = pairs_json(tmp_path, runs[0], runs[1])
    procs = {r["process"] for r in doc["pairs"]}
    assert {"rank0", "rank1"} <= procs
    by = {p: {r["verdict"] for r in doc["pairs"] if r["process"] == p} for p in procs}
    assert by["rank0"] == {"pass"}
    assert "fail" in by["rank1"]
    fd = doc["first_divergence"]
    assert fd["process"] == "rank1" and fd["op"] == "numpy.sin"
    assert check_rows_against_dumps(doc) >= 4


def test_stats_mode_and_cli(tmp_path: Path) -> None:
    a = make_run(tmp_path, NUMPY_PROG, "a", DT="32", PPROBE_MODE="stats")
    b = make_run(tmp_path, NUMPY_PROG, "b", DT="64", PPROBE_MODE="stats")
    doc = pairs_json(tmp_path, a, b)
    rows = [r for r in doc["pairs"] if r["role"]]
    assert rows and all(r["source"] == "stats" for r in rows)
    from helpers import tensors

    ta = {(t["seq"], t["role"], t["idx"]): t for t in tensors(a)}
    tb = {(t["seq"], t["role"], t["idx"]): t for t in tensors(b)}
    for r in rows:
        sa, sb = ta[(r["a_seq"], r["role"], r["idx"])], tb[(r["b_seq"], r["role"], r["idx"])]
        for k in ("min", "max", "mean", "std"):
            want = abs(sb[k] - sa[k]) / abs(sa[k]) if sa[k] else (0.0 if sb[k] == sa[k] else None)
            got = r[f"{k}_rel_diff"]
            if want is None:
                assert got == "inf"
            else:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (r["op"], k)
        assert r["nan_diff"] == 0 and r["inf_diff"] == 0
    # exit status: same run within tolerance with --fail-on diff; usage errors are 2
    assert C.compare(str(a), str(a)).exit_status("diff") == 0
    assert cli(str(a), str(b), "--fail-on", "diff").returncode == 1
    bad = cli(str(a), str(tmp_path / "nope"))
    assert bad.returncode == 2 and bad.stderr.startswith("pprobe compare: no run")
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert cli(str(a)).returncode == 2
    assert cli(str(a), str(b), "--format", "parquet").returncode == 2


def test_run_ids_latest_save_and_query(tmp_path: Path, numpy_runs: tuple[Path, Path]) -> None:
    a, b = numpy_runs
    env = {"PPROBE_OUTPUT": str(a.parent)}
    save = tmp_path / "cmp"
    csv_path = tmp_path / "all.csv"
    p = cli(a.name, "latest", "--save", str(save), "--format", "csv", "-o", str(csv_path), **env)
    assert p.returncode == 1, p.stderr
    text = csv_path.read_text().splitlines()
    assert text[0].startswith("process,step,match,verdict")
    q = subprocess.run(
        [PYTHON, "-m", "pprobe", "query", "--run", str(save), "--format", "json",
         "SELECT op, count(*) AS n, bool_or(first_divergence) AS first FROM compare "
         "WHERE role = 'output' GROUP BY op ORDER BY op"],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert q.returncode == 0, q.stderr
    got = {r["op"]: r for r in json.loads(q.stdout)}
    assert sum(r["first"] for r in got.values()) == 1
    meta = json.loads((save / "meta.json").read_text())
    assert meta["run_a"] == str(a) and meta["run_b"] == str(b)
    assert got[meta["first_divergence"]["op"]]["first"]
    c = C.compare(str(a), str(b))
    assert len(text) - 1 == sum(1 for r in C.rows(c))
    # parquet holds the same rows, with the documented columns
    import pyarrow.parquet as pq

    from pprobe import compare_cli

    compare_cli.write(c, "parquet", str(tmp_path / "all.parquet"))
    t = pq.read_table(tmp_path / "all.parquet")
    assert t.num_rows == len(text) - 1 and t.column_names == [n for n, _ in C.COLUMNS]
    assert t.column_names == text[0].split(",")


def test_mapping_renamed_module_and_thresholds(tmp_path: Path) -> None:
    prog = """
    import os
    import numpy as np
    x = np.linspace(-1, 1, 1000)
    y = np.sin(x) if not os.environ.get("RENAME") else np.cos(x - np.pi / 2)
    z = np.exp(y)
    """
    a = make_run(tmp_path, prog, "a")
    b = make_run(tmp_path, prog, "b", RENAME="1")
    doc = pairs_json(tmp_path, a, b)
    assert {r["op"] for r in doc["pairs"] if r["match"] == "only_a"} == {"numpy.sin"}
    m = write(
        tmp_path / "map.toml",
        """
        [ops]
        "numpy.cos" = "numpy.sin"
        [[thresholds]]
        op = "exp"
        rtol = 1e-3
        """,
    )
    doc = pairs_json(tmp_path, a, b, C.Settings(mapping=C.load_mapping(str(m))))
    mapped = [r for r in doc["pairs"] if r["match"] == "mapping"]
    assert mapped and mapped[0]["op"] == "numpy.sin" and mapped[0]["b_op"] == "numpy.cos"
    exp_rows = [r for r in doc["pairs"] if r["op"] == "numpy.exp"]
    assert exp_rows and all(r["rtol"] == 1e-3 for r in exp_rows)
    assert doc["summary"]["only_a"] == 0
    bad = write(tmp_path / "bad.toml", "[ops]\nx = 1\n")
    p = cli(str(a), str(b), "--map", str(bad))
    assert p.returncode == 2 and "ops must map names to names" in p.stderr


def test_cli_parser_does_without_numpy() -> None:
    """Building the command line (compare included) imports neither NumPy nor the compare
    engine: they load when `pprobe compare` runs."""
    code = (
        "import sys, pprobe.cli; pprobe.cli._parser(); "
        "print('numpy' in sys.modules, 'pprobe.compare' in sys.modules)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env()
    )
    assert p.stdout.split() == ["False", "False"], p.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from pprobe import compare_cli

    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    with compare_cli._progress() as update:
        assert update is None  # no bar: the compare gets no callback
    assert piped.getvalue() == ""
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with compare_cli._progress() as update:
        update(50 << 20, 100 << 20)
        update(100 << 20, 100 << 20)
    assert "comparing dumps" in term.getvalue() and "104.9/104.9 MB" in term.getvalue()


def test_dump_compare_memory_is_bounded(tmp_path: Path) -> None:
    """Two 32 MB dumps are compared with a few MB of NumPy memory: memory-mapped, in chunks
    (tracemalloc sees NumPy's allocations; the mapped pages are the page cache's)."""
    import tracemalloc

    n = 8 << 20
    a = np.linspace(-1, 1, n, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a * np.float32(1.001))
    del a
    tracemalloc.start()
    try:
        e = cm.compare_files(
            str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), 1.3e-6, 1e-5, "float32", "float32"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e is not None and e.n == n and e.bytes_read == 2 * 4 * n
    assert e.max_rel == pytest.approx(1e-3, rel=1e-3)
    assert peak < 4 << 20, f"peak {peak / 1e6:.1f} MB for 64 MB of dumps"
