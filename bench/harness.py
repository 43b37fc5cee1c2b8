"""Running child programs: fresh interpreters, interleaved variants, medians.

A :class:`Variant` says how a child starts: bare, or with pprobe's bootstrap on PYTHONPATH and
``PPROBE_*`` settings, with its own temporary ``PPROBE_OUTPUT`` that is emptied after every
run and deleted at the end. :func:`interleave` runs variants A B C, B C A, ... round by round,
so that slow drift of the machine (other processes, thermal state) falls on all of them alike.
A variant whose child fails, or that needs a part of pprobe that is not there yet (the torch
interceptor, a torch level) or a peer tool that is not installed (msprobe), is reported with
its status and error, never raised.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOTSTRAP = os.path.join(REPO, "bootstrap")
WORKLOADS = os.path.join(REPO, "bench", "workloads")
MARK = "BENCH_RESULT "
#: Set by ``python -m bench --threads N``: BLAS/OpenMP thread counts for every child.
#: Threads of the libraries in every child: one BLAS/OpenMP thread, as the workloads give torch
#: one (``torch_threads``). On the process's CPU clock a second BLAS thread's spinning
#: counted in the unprobed NumPy MLP only (its "none" runs read as the slowest).
#: ``python -m bench --threads N`` sets N; ``--threads 0`` clears it (the libraries' defaults).
THREAD_ENV: dict[str, str] = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                              "MKL_NUM_THREADS": "1"}  # fmt: skip


@dataclass
class Variant:
    """One way of running a workload's child program."""

    name: str
    probe: bool = False  # bootstrap on PYTHONPATH
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    needs_torch: bool = False  # fails as "unavailable" when the torch interceptor is missing
    torch_level: str | None = None  # checked in the log: aten / module rows must be there
    python: str = sys.executable
    pythonpath: str | None = None  # extra PYTHONPATH entry (e.g. the repo, to import pprobe)
    #: The recording engine this variant measures (``PPROBE_CORE``): the run's meta.json must
    #: say that this engine ran (``core.engine``), else the run is "fell back", not timed.
    engine: str | None = None

    def __post_init__(self) -> None:
        if self.engine:
            self.env.setdefault("PPROBE_CORE", self.engine)


@dataclass
class Outcome:
    status: str  # ok | failed | unavailable
    data: dict[str, Any]
    wall_s: float
    maxrss_mb: float
    error: str | None = None
    cpu_s: float = 0.0  # the child's user + system CPU time (rusage)


_compiled: set[str] = set()


def ensure_bytecode(*trees: str) -> None:
    """Byte-compile pprobe, the bootstrap and the workloads of each tree the children import
    them from (``__pycache__``, ignored by git). The children run with
    PYTHONDONTWRITEBYTECODE=1, so no run writes into the tree it measures; without the
    compiled files every probed child compiled pprobe's modules from source inside its
    timing, which an installed pprobe (pip compiles at install) or an editable one after its
    first import does not do. Stale files are compiled again; the children only read them."""
    import compileall

    for tree in trees:
        if tree in _compiled:
            continue
        _compiled.add(tree)
        for sub in ("pprobe", "bootstrap", os.path.join("bench", "workloads")):
            folder = os.path.join(tree, sub)
            if os.path.isdir(folder):
                compileall.compile_dir(folder, quiet=2)


def base_env() -> dict[str, str]:
    """This environment less anything that would probe a child or change its settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PPROBE") and k not in ("PYTHONPATH", "PYTHONSTARTUP")
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the compiled files: ensure_bytecode
    env.update(THREAD_ENV)
    ensure_bytecode(REPO)
    return env


def child_env(v: Variant, output: str | None) -> dict[str, str]:
    env = base_env()
    paths = []
    if v.probe:
        paths.append(BOOTSTRAP)
        if output:
            env["PPROBE_OUTPUT"] = output
    if v.pythonpath:
        paths.append(v.pythonpath)
        ensure_bytecode(v.pythonpath)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(v.env)
    return env


def run_process(
    argv: list[str], env: dict[str, str], cwd: str, timeout: float
) -> tuple[int, str, str, float, float, float]:
    """Run to the end: (exit code, stdout, stderr, wall s, peak RSS MB, user+system CPU s).

    The child is reaped with ``os.wait4`` so that its own peak RSS comes back (ru_maxrss),
    not the maximum over every child this process ever had.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL
        )
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        so = out.read().decode(errors="replace")
        se = err.read().decode(errors="replace")
    if rc == -9 and wall >= timeout:
        se += f"\n(killed after the {timeout:.0f} s time limit)"
    return rc, so, se, wall, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


def run_child(
    script: str, args: dict[str, Any], v: Variant, output: str | None, timeout: float = 600
) -> Outcome:
    """Run ``bench/workloads/<script>.py`` once as variant ``v`` and judge its result."""
    cwd = tempfile.mkdtemp(prefix="pprobe-bench-cwd-")  # no pyproject.toml / pprobe.toml here
    try:
        argv = [v.python, os.path.join(WORKLOADS, script + ".py"), json.dumps({**args, **v.args})]
        rc, so, se, wall, rss, cpu = run_process(argv, child_env(v, output), cwd, timeout)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    data = None
    for line in so.splitlines():
        if line.startswith(MARK):
            data = json.loads(line[len(MARK) :])
    if rc != 0 or data is None:
        return Outcome("failed", data or {}, wall, rss, f"exit {rc}: {_tail(se)}", cpu)
    if data.get("unavailable"):  # the child lacks something the variant needs (a peer tool)
        return Outcome("unavailable", data, wall, rss, str(data["unavailable"]), cpu)
    out = Outcome("ok", data, wall, rss, cpu_s=cpu)
    if v.probe and v.env.get("PPROBE") != "0":
        judge_probe(v, out, se)
    return out


def judge_probe(v: Variant, out: Outcome, stderr: str = "") -> None:
    """Mark a probed run unavailable when the probe did not do what the variant measures."""
    facts = out.data.get("probe") or {}
    if not facts.get("active"):
        out.status, out.error = (
            "failed",
            "the probe did not start in the child"
            + (f"; stderr: {_tail(stderr, 400)}" if stderr.strip() else ""),
        )
        return
    if facts.get("errors"):
        out.data["probe_errors"] = facts["errors"]
    core = engine_of(facts.get("run_dir"))
    if core is None:
        core = facts.get("core")  # as the child read it (its run folder may be gone)
    out.data["core"] = core
    if v.engine:
        ran = (core or {}).get("engine")
        if ran != v.engine:
            out.status = "fell back"
            out.error = (
                f"PPROBE_CORE={v.engine} asked, but meta.json says engine={ran!r} "
                f"(reason: {(core or {}).get('reason')!r})"
                + (f"; stderr: {_tail(stderr, 300)}" if stderr.strip() else "")
            )
            return
    if v.needs_torch and "torch" not in facts.get("installed", []):
        out.status = "unavailable"
        out.error = "torch interceptor not installed: " + str(facts.get("torch_error"))
        return
    if v.torch_level and facts.get("run_dir"):
        ok, what = level_evidence(facts["run_dir"], v.torch_level)
        out.data["log_kinds"] = what
        if not ok:
            out.status = "unavailable"
            out.error = f"PPROBE_TORCH_LEVEL={v.torch_level} produced no {v.torch_level} rows " + (
                f"(rows by framework/kind: {what})"
            )


def engine_of(run_dir: str | None) -> dict[str, Any] | None:
    """``core`` of a run's meta.json ({"engine": "native" | "python", "reason": ...})."""
    if not run_dir:
        return None
    try:
        with open(os.path.join(run_dir, "meta.json")) as f:
            core = json.load(f).get("core")
    except (OSError, ValueError):
        return None
    return core if isinstance(core, dict) else None


def level_evidence(run_dir: str, level: str) -> tuple[bool, dict[str, int]]:
    """Whether the log holds rows of a torch level: aten ops, or nn.Module calls."""
    import glob

    import pyarrow as pa

    kinds: dict[str, int] = {}
    hit = 0
    for path in glob.glob(os.path.join(run_dir, "log", "ops-*.arrows")):
        try:
            with pa.OSFile(path, "rb") as f:
                table = pa.ipc.open_stream(f).read_all()
        except Exception:
            continue
        d = table.select(
            [
                c
                for c in ("framework", "kind", "op", "module_path", "phase")
                if c in table.column_names
            ]
        ).to_pylist()
        for r in d:
            key = f"{r.get('framework')}/{r.get('kind')}"
            kinds[key] = kinds.get(key, 0) + 1
            text = f"{r.get('kind')} {r.get('op')}".lower()
            if level == "aten" and ("aten" in text or r.get("phase") == "backward"):
                hit += 1
            if level == "module" and ("module" in text or r.get("kind") == "module"):
                hit += 1
    return hit > 0, kinds


def _tail(s: str, n: int = 600) -> str:
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


class Outputs:
    """One temporary PPROBE_OUTPUT per variant: emptied after each run, deleted at the end."""

    def __init__(self) -> None:
        self.dirs: dict[str, str] = {}

    def get(self, name: str) -> str:
        d = self.dirs.get(name)
        if d is None:
            d = self.dirs[name] = tempfile.mkdtemp(prefix=f"pprobe-bench-{name}-")
        return d

    def empty(self, name: str) -> None:
        d = self.dirs.get(name)
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d, exist_ok=True)

    def close(self) -> None:
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()


@dataclass
class VariantRuns:
    """Every run of one variant in one workload."""

    variant: Variant
    runs: list[Outcome] = field(default_factory=list)

    @property
    def status(self) -> str:
        """ok when any run succeeded (a failed round keeps its error in ``runs``)."""
        if not self.runs:
            return "skipped"
        if any(r.status == "ok" for r in self.runs):
            return "ok"
        return self.runs[0].status

    @property
    def error(self) -> str | None:
        for r in self.runs:
            if r.status != "ok":
                return r.error
        return None

    def values(self, get: Callable[[Outcome], float | None]) -> list[float]:
        out = []
        for r in self.runs:
            if r.status == "ok":
                v = get(r)
                if v is not None:
                    out.append(float(v))
        return out

    def median(self, get: Callable[[Outcome], float | None]) -> float | None:
        xs = self.values(get)
        return median(xs) if xs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "settings": {"probe": self.variant.probe, **self.variant.env, **self.variant.args},
            "runs": [
                {
                    "status": r.status,
                    "wall_s": r.wall_s,
                    "cpu_s": r.cpu_s,
                    "maxrss_mb": r.maxrss_mb,
                    **r.data,
                }
                | ({"error": r.error} if r.error else {})
                for r in self.runs
            ],
        }


def interleave(
    script: str,
    variants: list[Variant],
    rounds: int,
    args: dict[str, Any],
    timeout: float = 600,
    log: Callable[[str], None] = print,
) -> dict[str, VariantRuns]:
    """Run every variant ``rounds`` times, one of each per round, rotating the order.

    A variant that failed or is unavailable is not run again (its error is kept).
    """
    outputs = Outputs()
    res = {v.name: VariantRuns(v) for v in variants}
    try:
        for r in range(rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                vr = res[v.name]
                if vr.runs and vr.status != "ok":
                    continue  # failed or unavailable in every run so far: no use repeating
                out_dir = outputs.get(v.name) if v.probe else None
                o = run_child(script, args, v, out_dir, timeout)
                outputs.empty(v.name)
                vr.runs.append(o)
                if o.status != "ok":
                    log(f"    {script}/{v.name}: {o.status}: {o.error}")
    finally:
        outputs.close()
    return res


def rotate_rounds(
    keys: list[Any], rounds: int, run: Callable[[Any, str], Any], prefix: str
) -> dict[Any, list[Any]]:
    """``run(key, out)`` for every key, ``rounds`` times, one of each per round in an order
    that rotates round by round (drift cancels within a round), each with ``out`` an empty
    scratch folder (made with ``prefix``, removed at the end). Returns the results by key."""
    runs: dict[Any, list[Any]] = {k: [] for k in keys}
    out = tempfile.mkdtemp(prefix=prefix)
    try:
        for r in range(rounds):
            j = r % len(keys)
            for key in keys[j:] + keys[:j]:
                runs[key].append(run(key, out))
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out, exist_ok=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return runs


def median(xs: Iterable[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        raise ValueError("median of nothing")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def untouched_all(facts: list[Any]) -> bool:
    """Every ``untouched`` report of a PPROBE=0 child (see _child.untouched) is clean.

    Runs without the report (older results) are ignored; at least one must be there.
    """
    got = [f for f in facts if isinstance(f, dict)]
    return bool(got) and all(
        not f.get("pprobe_session_imported")
        and all(v for k, v in f.items() if k != "pprobe_session_imported")
        for f in got
    )


def paired_ci(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float]:
    """Bootstrap confidence interval of :func:`paired_delta` (fixed seed: reproducible)."""
    import random

    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        return (d[0], d[0]) if d else (0.0, 0.0)
    rng = random.Random(0)
    meds = sorted(median(rng.choices(d, k=len(d))) for _ in range(2000))
    k = int((1 - level) / 2 * len(meds))
    return meds[k], meds[-k - 1]


def paired_delta(a: list[float], b: list[float]) -> float | None:
    """Median of round-by-round differences a[i] - b[i] (drift cancels within a round)."""
    n = min(len(a), len(b))
    return median([a[i] - b[i] for i in range(n)]) if n else None
