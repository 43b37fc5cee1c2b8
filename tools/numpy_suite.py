"""NumPy's own test suite with and without the probe: the same outcome for every test.

Runs the test suites shipped in the NumPy wheel twice, in subprocesses, the way ``np.test()``
runs them (``--pyargs``, its ``-W`` filters, no xdist, no cache): once unprobed and once
probed (``PYTHONPATH=bootstrap``, ``PPROBE_MODE=log``, default coverage: operators and
ndarray methods too). Each test's outcome (passed, failed, error, skipped, xfailed, xpassed)
is collected by this file acting as a pytest plugin (``-p numpy_suite``), then the two sets
are compared: every test whose outcome differs (or that ran in one run only) is printed with
the first lines of its failure, then a count table. Exit status 1 on any difference, on a
pprobe internal error, or when the probed runs recorded nothing.

    python tools/numpy_suite.py                       # core, linalg, lib: the full figures
    python tools/numpy_suite.py --slice               # a ~2-minute subset (CI)
    python tools/numpy_suite.py --suites linalg,lib   # some suites
    python tools/numpy_suite.py --per-file            # one pytest process per test file
    python tools/numpy_suite.py --tests numpy._core.tests.test_umath::TestDivision
    python tools/numpy_suite.py --keep /tmp/nps       # keep logs, outcomes and the probe's runs

Memory-hungry tests (``requires_memory``) run or skip depending on the memory free at that
moment; ``NPY_AVAILABLE_MEM`` is pinned (``--available-memory``) so both runs decide alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
BOOTSTRAP = REPO / "bootstrap"
RESULTS_ENV = "NUMPY_SUITE_RESULTS"

SUITES = {
    "core": "numpy._core.tests",
    "linalg": "numpy.linalg.tests",
    "lib": "numpy.lib.tests",
    "ma": "numpy.ma.tests",
    "fft": "numpy.fft.tests",
    "random": "numpy.random.tests",
    "polynomial": "numpy.polynomial.tests",
    "matrixlib": "numpy.matrixlib.tests",
    "testing": "numpy.testing.tests",
}
DEFAULT_SUITES = ("core", "linalg", "lib")

#: The --slice subset (CI): operators and ndarray methods (TestBinop, TestMethods...), ufuncs
#: and their methods, __array_ufunc__/__array_function__, indexing, stacking, linalg and lib
#: functions, and the places the full run found differences in (TestResize: refcheck,
#: TestTextSignatures: __wrapped__, test_api/test_arrayobject: dtype references,
#: test_custom_dtypes and test_stride_tricks: C code reading numpy.<ufunc>).
SLICE = (
    "numpy._core.tests.test_multiarray::TestBinop",
    "numpy._core.tests.test_multiarray::TestMethods",
    "numpy._core.tests.test_multiarray::TestArrayPriority",
    "numpy._core.tests.test_multiarray::TestResize",
    "numpy._core.tests.test_multiarray::TestTextSignatures",
    "numpy._core.tests.test_multiarray::TestMatmul",
    "numpy._core.tests.test_overrides",
    "numpy._core.tests.test_regression::TestRegression::test_load_ufunc_pickle",
    "numpy._core.tests.test_api",
    "numpy._core.tests.test_arrayobject",
    "numpy._core.tests.test_custom_dtypes",
    "numpy._core.tests.test_shape_base",
    "numpy._core.tests.test_indexing",
    "numpy._core.tests.test_umath::TestDivision",
    "numpy._core.tests.test_umath::TestRemainder",
    "numpy._core.tests.test_umath::TestComparisons",
    "numpy._core.tests.test_umath::TestSpecialMethods",
    "numpy._core.tests.test_umath::TestAdd_newdoc_ufunc",
    "numpy._core.tests.test_ufunc::TestUfunc",
    "numpy._core.tests.test_scalarmath",
    "numpy.linalg.tests.test_linalg::TestSolve",
    "numpy.linalg.tests.test_linalg::TestInv",
    "numpy.linalg.tests.test_linalg::TestEigh",
    "numpy.linalg.tests.test_linalg::TestNormDouble",
    "numpy.linalg.tests.test_linalg::TestQR",
    "numpy.linalg.tests.test_linalg::TestMultiDot",
    "numpy.lib.tests.test_function_base",
    "numpy.lib.tests.test_twodim_base",
    "numpy.lib.tests.test_arraysetops",
    "numpy.lib.tests.test_nanfunctions",
    "numpy.lib.tests.test_stride_tricks",
    "numpy.lib.tests.test_mixins",
)

#: Differences that are understood and cannot be removed without changing how pprobe works;
#: each run still prints them (under "explained"), and they fail the run unless
#: --allow-explained. Test-id patterns (fnmatch) -> why.
EXPLAINED: dict[str, str] = {}  # empty: the full comparison shows no difference (issue #4)


#: Tests whose outcome under the probe can differ from run to run, for a reason that is
#: not a defect of the call's recording: a probed run where one of them differs reruns it
#: (probed, up to :data:`RERUNS` times); the same outcome as without the probe on a rerun
#: counts as the same outcome, and is printed under "transient". Test-id patterns -> why.
_DTYPE_REFS = (
    "they count the references to a builtin dtype (a NumPy singleton) around a call, and "
    "pprobe's writer thread holds some while it turns buffered rows into columns, as any "
    "other thread of the program using NumPy would (the rows themselves and pprobe's caches "
    "hold none: tests/test_dtype_refs.py)"
)
TRANSIENT: dict[str, str] = dict.fromkeys(
    (
        "numpy/_core/tests/test_api.py::test___array___refcount",
        "numpy/_core/tests/test_arrayobject.py::test_cleanup_with_refs_non_contig",
        "numpy/_core/tests/test_indexing.py::TestIndexing::test_small_regressions",
        "numpy/_core/tests/test_multiarray.py::TestArrayInterface::test_scalar_interface*",
        "numpy/_core/tests/test_nditer.py::test_iter_refcount",
        "numpy/_core/tests/test_regression.py::TestRegression::test_take_object_fail",
        "numpy/lib/tests/test_function_base.py::TestBincount::test_dtype_reference_leaks",
    ),
    _DTYPE_REFS,
)
RERUNS = 2


def _match(table: dict[str, str], tid: str) -> str | None:
    import fnmatch

    return next((why for pat, why in table.items() if fnmatch.fnmatchcase(tid, pat)), None)


def explained(tid: str) -> str | None:
    return _match(EXPLAINED, tid)


def transient(tid: str) -> str | None:
    return _match(TRANSIENT, tid)


#: np.test()'s own warning filters (numpy/_pytesttester.py).
NP_TEST_W = (
    "ignore:Not importing directory",
    "ignore:numpy.dtype size changed",
    "ignore:numpy.ufunc size changed",
    "ignore::UserWarning:cpuinfo",
    "ignore:the matrix subclass is not",
    "ignore:Importing from numpy.matlib is",
)


# ================================================================== the pytest plugin side
# Loaded into the test process by ``-p numpy_suite`` (tools/ is on PYTHONPATH there). Writes
# one JSON line per event to $NUMPY_SUITE_RESULTS, flushed at once: a crash keeps what ran.
_out: Any = None


def _emit(rec: dict[str, Any]) -> None:
    global _out
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    if _out is None:
        _out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the session
    _out.write(json.dumps(rec) + "\n")
    _out.flush()


def _failure_text(report: Any) -> str:
    try:
        crash = getattr(report.longrepr, "reprcrash", None)
        head = f"{crash.message}\n" if crash is not None else ""
        text = report.longreprtext or ""
    except Exception as e:  # a report we cannot render: say so
        return f"<unreadable report: {type(e).__name__}>"
    lines = text.splitlines()
    return (head + "\n".join(lines[-25:]))[-4000:]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _emit({"id": nodeid, "when": "start"})


def pytest_runtest_logreport(report: Any) -> None:
    rec = {"id": report.nodeid, "when": report.when, "outcome": report.outcome}
    if hasattr(report, "wasxfail"):
        rec["xfail"] = True
    if report.failed:
        rec["text"] = _failure_text(report)
    elif report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        rec["text"] = str(report.longrepr[2])[:500]
    if report.when == "call":
        rec["dur"] = round(report.duration, 4)
    _emit(rec)


def pytest_collectreport(report: Any) -> None:
    if report.failed or report.skipped:
        rec = {"id": report.nodeid or "<session>", "when": "collect", "outcome": report.outcome}
        if report.failed:
            rec["text"] = _failure_text(report)
        _emit(rec)


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    _emit({"id": "", "when": "finish", "exit": int(exitstatus)})


def pytest_unconfigure(config: Any) -> None:
    global _out
    if _out is not None:
        _out.close()
        _out = None


# ================================================================== the driver side
@dataclass
class Outcome:
    outcome: str
    text: str = ""


@dataclass
class RunResult:
    label: str  # "without" / "with"
    target: str
    rc: int
    seconds: float
    timed_out: bool
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    running_at_end: str = ""  # a test started but never reported (crash, timeout)
    finished: bool = False
    log: Path | None = None


def combine(records: list[dict[str, Any]]) -> tuple[dict[str, Outcome], str, bool]:
    """Per test id: one outcome from its setup/call/teardown reports (pytest's own rules)."""
    phases: dict[str, dict[str, dict[str, Any]]] = {}
    started = ""
    finished = False
    for r in records:
        when = r["when"]
        if when == "finish":
            finished = True
            continue
        if when == "start":
            started = r["id"]
            continue
        phases.setdefault(r["id"], {})[when] = r
        if when == "teardown" and r["id"] == started:
            started = ""
    out: dict[str, Outcome] = {}
    for tid, ph in phases.items():
        if "collect" in ph:
            c = ph["collect"]
            out[f"collect:{tid}"] = Outcome(
                "collect-error" if c["outcome"] == "failed" else "collect-skipped",
                c.get("text", ""),
            )
            continue
        setup, call, teardown = ph.get("setup"), ph.get("call"), ph.get("teardown")
        text = ""
        if setup is None:
            res = "not-run"
        elif setup["outcome"] == "failed":
            res, text = "error", setup.get("text", "")
        elif setup["outcome"] == "skipped":
            res = "xfailed" if setup.get("xfail") else "skipped"
            text = setup.get("text", "")
        elif call is None:
            res = "not-run"
        elif call["outcome"] == "failed":
            res, text = "failed", call.get("text", "")
        elif call["outcome"] == "skipped":
            res = "xfailed" if call.get("xfail") else "skipped"
            text = call.get("text", "")
        else:
            res = "xpassed" if call.get("xfail") else "passed"
        if teardown is None and res not in ("not-run",):
            res += "+no-teardown"
        elif teardown is not None and teardown["outcome"] == "failed":
            res += "+teardown-error"
            text = (text + "\n" + teardown.get("text", "")).strip()
        out[tid] = Outcome(res, text)
    return out, started, finished


def child_env(probed: bool, output: Path, available_memory: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k == "PPROBE" or k.startswith("PPROBE_")) and k not in ("PYTHONPATH",)
    }
    env["PYTHONPATH"] = os.pathsep.join(
        ([str(BOOTSTRAP)] if probed else []) + [str(TOOLS)] + _user_pythonpath()
    )
    env["PYTHONHASHSEED"] = "0"
    env["NPY_AVAILABLE_MEM"] = available_memory
    if probed:
        env["PPROBE_MODE"] = "log"
        env["PPROBE_OUTPUT"] = str(output)
    return env


def _user_pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def build_cmd(targets: list[str], args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "numpy_suite"]
    cmd += ["-o", f"faulthandler_timeout={args.test_timeout}", "-o", "console_output_style=classic"]
    for w in NP_TEST_W:
        cmd += ["-W", w]
    if args.label == "fast":
        cmd += ["-m", "not slow"]
    if args.k:
        cmd += ["-k", args.k]
    # Test ids relative to site-packages ("numpy/_core/tests/test_umath.py::..."), whatever
    # the targets and the working folder: per-file and whole-suite runs compare.
    cmd += ["--rootdir", str(numpy_root())]
    cmd += list(args.pytest_arg or [])
    return [*cmd, "--pyargs", *targets]


def run_once(
    label: str, targets: list[str], args: argparse.Namespace, work: Path, n: int
) -> RunResult:
    probed = label == "with"
    tag = f"{label}-{n:03d}"
    results = work / f"{tag}.jsonl"
    log = work / f"{tag}.log"
    cwd = work / f"cwd-{tag}"  # a fresh folder: no pyproject.toml/pprobe.toml, files land here
    cwd.mkdir(parents=True, exist_ok=True)
    env = child_env(probed, work / "pprobe-runs", args.available_memory)
    env[RESULTS_ENV] = str(results)
    env["TMPDIR"] = str(cwd)
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w") as f:
        f.write(" ".join(build_cmd(targets, args)) + "\n")
        f.flush()
        p = subprocess.Popen(
            build_cmd(targets, args),
            cwd=cwd,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, 9)
            rc = p.wait()
    seconds = time.perf_counter() - t0
    shutil.rmtree(cwd, ignore_errors=True)
    summary = {"target": " ".join(targets), "rc": rc, "seconds": seconds, "timed_out": timed_out}
    (work / f"{tag}.json").write_text(json.dumps(summary))
    return load_run(work / f"{tag}.json")


def load_run(summary_path: Path) -> RunResult:
    """A run from its ``{side}-{n}.json`` summary and ``.jsonl`` outcomes (also --baseline)."""
    s = json.loads(summary_path.read_text())
    records = []
    results = summary_path.with_suffix(".jsonl")
    if results.exists():
        for line in results.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut by a crash
                pass
    outcomes, running, finished = combine(records)
    label = summary_path.name.split("-")[0]
    log = summary_path.with_suffix(".log")
    return RunResult(
        label, s["target"], s["rc"], s["seconds"], s["timed_out"], outcomes, running, finished,
        log,
    )  # fmt: skip


def numpy_root() -> Path:
    """The folder holding the numpy package (found without importing numpy)."""
    import importlib.util

    spec = importlib.util.find_spec("numpy")
    if spec is None or spec.origin is None:
        raise SystemExit("numpy is not installed")
    return Path(spec.origin).parent.parent


def suite_files(module: str) -> list[str]:
    """``numpy._core.tests`` -> its test modules, as dotted names (for --per-file)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{module}: not a package")
    folder = Path(list(spec.submodule_search_locations)[0])
    return [f"{module}.{p.stem}" for p in sorted(folder.glob("test_*.py"))]


def chunks(args: argparse.Namespace) -> list[list[str]]:
    if args.tests:
        targets = list(args.tests)
    elif args.slice:
        targets = list(SLICE)
    else:
        targets = [SUITES[s] for s in args.suites]
    if not args.per_file:
        return [targets]
    out: list[list[str]] = []
    for t in targets:
        if "::" not in t and t in SUITES.values():
            out += [[m] for m in suite_files(t)]
        else:
            out.append([t])
    return out


def probe_facts(runs_dir: Path) -> dict[str, Any]:
    """What the probed runs recorded: rows by kind, coverage, pprobe's own errors."""
    facts: dict[str, Any] = {
        "runs": 0,
        "processes": 0,
        "rows": 0,
        "by_kind": Counter(),
        "coverage": Counter(),
        "errors": [],
        "warnings": set(),
    }
    if not runs_dir.is_dir():
        return facts
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        facts["runs"] += 1
        meta = run / "meta.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            facts["coverage"][str(m.get("coverage", {}).get("coverage"))] += 1
        for proc in (run / "procs").glob("*.json"):
            try:
                pm = json.loads(proc.read_text())
            except ValueError:
                continue
            facts["processes"] += 1
            for e in pm.get("errors", []):
                facts["errors"].append({**e, "run": run.name, "proc": proc.stem})
            facts["warnings"].update(pm.get("warnings", []))
        for shard in (run / "log").glob("ops-*.arrows"):
            facts["rows"] += _count_kinds(shard, facts["by_kind"])
    return facts


def _count_kinds(path: Path, by_kind: Counter) -> int:
    import pyarrow as pa

    n = 0
    try:
        with pa.OSFile(str(path), "rb") as f:
            for batch in pa.ipc.open_stream(f):
                n += batch.num_rows
                kinds = batch.column(batch.schema.get_field_index("kind"))
                for k, c in zip(*_value_counts(kinds)):
                    by_kind[k] += c
    except (OSError, pa.ArrowInvalid):  # a shard cut short by a crash: its complete batches
        pass
    return n


def _value_counts(arr: Any) -> tuple[list[str], list[int]]:
    vc = arr.value_counts()
    return vc.field("values").to_pylist(), vc.field("counts").to_pylist()


ORDER = (
    "passed",
    "failed",
    "error",
    "skipped",
    "xfailed",
    "xpassed",
    "collect-error",
    "collect-skipped",
    "not-run",
)


def _outcomes(runs: list[RunResult]) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for r in runs:
        out.update(r.outcomes)
    return out


def rerun_transient(
    plain: list[RunResult],
    probed: list[RunResult],
    args: argparse.Namespace,
    work: Path,
    n0: int,
) -> dict[str, list[str]]:
    """The TRANSIENT tests whose probed outcome differs, rerun probed (each rerun one pytest
    process for all of them) until they give the outcome without the probe, at most
    :data:`RERUNS` times: test id -> the reruns' outcomes."""
    if not plain or not probed:
        return {}
    a, b = _outcomes(plain), _outcomes(probed)
    todo = sorted(tid for tid in set(a) & set(b)
                  if a[tid].outcome != b[tid].outcome and transient(tid))  # fmt: skip
    got: dict[str, list[str]] = {tid: [] for tid in todo}
    root = numpy_root()
    for k in range(RERUNS):
        if not todo:
            break
        r = run_once("with", [str(root / tid) for tid in todo], args, work, n0 + k)
        print(f"   rerun    {len(todo)} transient test(s): {len(r.outcomes)} tests "
              f"{r.seconds:>8.1f}s rc={r.rc}", flush=True)  # fmt: skip
        for tid in todo:
            o = r.outcomes.get(tid)
            got[tid].append(o.outcome if o else "absent")
        todo = [tid for tid in todo if got[tid][-1] != a[tid].outcome]
    return got


def report(
    plain: list[RunResult],
    probed: list[RunResult],
    facts: dict[str, Any],
    max_diffs: int,
    allow_explained: bool = False,
    reruns: dict[str, list[str]] | None = None,
) -> int:
    a: dict[str, Outcome] = {}
    b: dict[str, Outcome] = {}
    for r in plain:
        a.update(r.outcomes)
    for r in probed:
        b.update(r.outcomes)
    diffs = []
    for tid in sorted(set(a) | set(b)):
        oa, ob = a.get(tid), b.get(tid)
        if oa is None or ob is None or oa.outcome != ob.outcome:
            diffs.append((tid, oa, ob))
    problems = 0
    for r in plain + probed:
        # pytest's exit status: 0 passed, 1 tests failed, 2 interrupted (collection errors,
        # listed as such), 3 internal error, 4 usage error, 5 no tests; <0 a signal.
        if r.timed_out or r.running_at_end or not r.finished or r.rc not in (0, 1, 2):
            problems += 1
            why = "timed out" if r.timed_out else f"exit status {r.rc}"
            print(f"!! run {r.label} [{r.target}]: {why}; last test started: {r.running_at_end!r}")
            print(f"   log: {r.log}")
    reruns = reruns or {}
    # a TRANSIENT test that gave the outcome without the probe on a rerun
    settled = [d for d in diffs
               if d[1] is not None and d[1].outcome in reruns.get(d[0], ())]  # fmt: skip
    if settled:
        print(f"== {len(settled)} transient differences: the same outcome on a probed rerun "
              f"(TRANSIENT in {Path(__file__).name})")  # fmt: skip
        for why in dict.fromkeys(transient(tid) for tid, _, _ in settled):
            print(f"-- because {why}:")
            for tid, oa, ob in settled:
                if transient(tid) == why:
                    sb = ob.outcome if ob else "absent"
                    print(f"   {tid}: {oa.outcome if oa else 'absent'} -> {sb}, reruns "
                          f"{', '.join(reruns[tid])}")  # fmt: skip
        diffs = [d for d in diffs if d not in settled]
    known = [d for d in diffs if explained(d[0])]
    diffs = [d for d in diffs if not explained(d[0])]
    if known:
        print(f"== {len(known)} explained differences (EXPLAINED in {Path(__file__).name})")
        for why in dict.fromkeys(explained(tid) for tid, _, _ in known):
            ids = [(tid, oa, ob) for tid, oa, ob in known if explained(tid) == why]
            print(f"-- {len(ids)} because {why}:")
            for tid, oa, ob in ids:
                sa = oa.outcome if oa else "absent"
                sb = ob.outcome if ob else "absent"
                print(f"   {tid}: {sa} -> {sb}")
    if diffs:
        print(f"== {len(diffs)} tests differ (outcome without the probe -> with it)")
        for tid, oa, ob in diffs[:max_diffs]:
            sa = oa.outcome if oa else "absent"
            sb = ob.outcome if ob else "absent"
            print(f"-- {tid}\n   without: {sa}\n   with:    {sb}")
            text = (ob.text if ob and ob.text else (oa.text if oa else "")).strip()
            for line in text.splitlines()[:12]:
                print(f"   | {line}")
        if len(diffs) > max_diffs:
            print(f"   ... and {len(diffs) - max_diffs} more")
    ca = Counter(o.outcome for o in a.values())
    cb = Counter(o.outcome for o in b.values())
    names = [k for k in ORDER if ca[k] or cb[k]] + sorted((set(ca) | set(cb)) - set(ORDER))
    print("\n== outcomes")
    print(f"{'outcome':<28}{'without':>10}{'with':>10}")
    for k in names:
        print(f"{k:<28}{ca[k]:>10}{cb[k]:>10}")
    print(f"{'total':<28}{sum(ca.values()):>10}{sum(cb.values()):>10}")
    ta = sum(r.seconds for r in plain)
    tb = sum(r.seconds for r in probed)
    print(f"{'time (s)':<28}{ta:>10.1f}{tb:>10.1f}")
    if ta:
        print(f"{'slowdown':<28}{'':>10}{tb / ta:>9.2f}x")
    kinds = ", ".join(f"{k} {n}" for k, n in facts["by_kind"].most_common())
    print(
        f"\n== probe: {facts['rows']} rows recorded ({kinds}) in {facts['runs']} runs, "
        f"{facts['processes']} processes; coverage {dict(facts['coverage'])}"
    )
    for w in sorted(facts["warnings"]):
        print(f"   warning: {w}")
    for e in facts["errors"]:
        print(f"!! pprobe internal error ({e['proc']}): {e['where']}: {e['type']}: {e['message']}")
        print("   " + e.get("traceback", "").strip().replace("\n", "\n   "))
    bad = bool(diffs) or bool(facts["errors"]) or problems > 0 or facts["rows"] == 0
    if known and not allow_explained:
        bad = True
    if not bad:
        verdict = "same outcomes" + (f" but {len(known)} explained differences" if known else "")
    else:
        verdict = (
            f"{len(diffs)} differences, {len(known)} explained differences, "
            f"{len(facts['errors'])} pprobe errors, {problems} incomplete runs, "
            f"{facts['rows']} rows"
        )
    print("\nRESULT: " + verdict)
    return 1 if bad else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="numpy_suite.py",
        description="Compare NumPy's test suite outcomes without and with the probe.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--slice", action="store_true", help="the fast subset (SLICE) for CI")
    ap.add_argument(
        "--suites",
        default=",".join(DEFAULT_SUITES),
        help=f"comma-separated, of {', '.join(SUITES)} (default: %(default)s)",
    )
    ap.add_argument("--tests", nargs="+", help="explicit --pyargs targets (module[::node])")
    ap.add_argument("--per-file", action="store_true", help="one pytest process per test file")
    ap.add_argument("-k", help="pytest -k expression, for both runs")
    ap.add_argument("--label", choices=("full", "fast"), default="full", help="fast: -m 'not slow'")
    ap.add_argument(
        "--only", choices=("without", "with"), help="run one side only (timing, debugging)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="pytest processes at once (default 1)")
    ap.add_argument(
        "--timeout", type=float, default=7200, help="seconds per pytest process (default 7200)"
    )
    ap.add_argument(
        "--test-timeout",
        type=int,
        default=600,
        help="faulthandler_timeout: dump stacks of a test running longer (default 600)",
    )
    ap.add_argument(
        "--available-memory",
        default="4GB",
        help="NPY_AVAILABLE_MEM for both runs: tests needing more are skipped (default 4GB)",
    )
    ap.add_argument("--keep", type=Path, help="keep logs, outcomes and probe runs in this folder")
    ap.add_argument(
        "--baseline",
        type=Path,
        help="take the unprobed outcomes from a folder an earlier --keep run left (same targets)",
    )
    ap.add_argument(
        "--probed",
        type=Path,
        help="take the probed outcomes from a folder an earlier --keep run left (with "
        "--baseline: compare only, run nothing)",
    )
    ap.add_argument(
        "--allow-explained",
        action="store_true",
        help="exit 0 when every difference is in EXPLAINED (they are still printed)",
    )
    ap.add_argument("--max-diffs", type=int, default=200, help="differences printed at most")
    ap.add_argument("--pytest-arg", action="append", help="extra pytest argument (repeatable)")
    args = ap.parse_args(argv)
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        ap.error(f"unknown suites {unknown}; known: {', '.join(SUITES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="numpy_suite-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        todo = chunks(args)
        sides = [s for s in ("without", "with") if args.only in (None, s)]
        if args.baseline:
            sides = [s for s in sides if s != "without"]
        if args.probed:
            sides = [s for s in sides if s != "with"]
        jobs = [(side, c, i) for i, c in enumerate(todo) for side in sides]
        print(
            f"numpy_suite: {len(todo)} pytest process(es) per side, sides {sides}, "
            f"work folder {work}",
            flush=True,
        )

        def one(job: tuple[str, list[str], int]) -> RunResult:
            side, c, i = job
            r = run_once(side, c, args, work, i)
            print(
                f"   {side:<8} {' '.join(c)[:70]:<70} {len(r.outcomes):>6} tests "
                f"{r.seconds:>8.1f}s rc={r.rc}",
                flush=True,
            )
            return r

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(one, jobs))
        plain = [r for r in results if r.label == "without"]
        if args.baseline:
            plain = [load_run(p) for p in sorted(args.baseline.glob("without-*.json"))]
            if not plain:
                raise SystemExit(f"--baseline {args.baseline}: no without-*.json runs there")
            print(f"   without: {len(plain)} runs read from {args.baseline}", flush=True)
        probed = [r for r in results if r.label == "with"]
        if args.probed:
            probed = [load_run(p) for p in sorted(args.probed.glob("with-*.json"))]
            print(f"   with: {len(probed)} runs read from {args.probed}", flush=True)
        reruns = rerun_transient(plain, probed, args, work, len(todo))
        facts = probe_facts((args.probed or work) / "pprobe-runs")
        if args.only:
            only = plain or probed
            c = Counter(o.outcome for r in only for o in r.outcomes.values())
            print(dict(c), f"{sum(r.seconds for r in only):.1f}s")
            return 0
        return report(plain, probed, facts, args.max_diffs, args.allow_explained, reruns)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
