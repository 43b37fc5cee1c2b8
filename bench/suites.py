"""The workloads: which variants run, how often, and which figures come out.

Each suite returns a :class:`Section`: the table rows printed for it, the figures the targets
are judged on, and every run's raw data (written to the JSON). Sizes come from :class:`Plan`:
the full plan, or the ``--quick`` one that CI runs as a smoke test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .harness import (
    BOOTSTRAP,
    REPO,
    Outcome,
    Variant,
    VariantRuns,
    base_env,
    interleave,
    median,
    paired_ci,
    paired_delta,
    run_child,
    run_process,
    untouched_all,
)

CACHE = os.path.join(REPO, "bench", ".cache")


@dataclass(frozen=True)
class Plan:
    """How much of each workload to run."""

    quick: bool
    rounds: int  # interleaved rounds for program workloads
    micro_rounds: int
    micro_n: int  # calls per timed loop (numpy)
    micro_n_torch: int
    micro_n_dump: int
    micro_reps: int
    micro_target_s: float  # seconds per timed loop (the child picks the call count)
    mlp_steps: int
    scipy_iters: int
    startup_reps_numpy: int
    startup_reps_torch: int
    dump_counts: tuple[tuple[int, int], ...]  # (array bytes, arrays per run)
    dump_rounds: int
    query_sizes: tuple[int, ...]
    query_rounds: int
    memory_steps: tuple[int, int]
    memory_rounds: int
    compare_arrays: tuple[int, int] = (1 << 20, 4)  # (float32 elements per array, arrays)
    compare_rounds: int = 1
    clock: str = "cpu"
    torch_threads: int = 1

    def common(self) -> dict[str, Any]:
        """Arguments every child gets: its clock and torch's intra-op thread count."""
        return {"clock": self.clock, "torch_threads": self.torch_threads}

    @classmethod
    def make(cls, quick: bool, clock: str = "cpu", torch_threads: int = 1) -> Plan:
        if quick:
            return cls(
                clock=clock,
                torch_threads=torch_threads,
                quick=True,
                rounds=1,
                micro_rounds=1,
                micro_n=5_000,
                micro_n_torch=2_000,
                micro_n_dump=200,
                micro_reps=3,
                micro_target_s=0.03,
                mlp_steps=10,
                scipy_iters=50,
                startup_reps_numpy=3,
                startup_reps_torch=0,
                dump_counts=((1 << 10, 200), (64 << 10, 50), (1 << 20, 10)),
                dump_rounds=1,
                query_sizes=(100_000,),
                query_rounds=1,
                memory_steps=(3, 30),
                memory_rounds=1,
                compare_arrays=(1 << 20, 4),
                compare_rounds=1,
            )
        return cls(
            clock=clock,
            torch_threads=torch_threads,
            quick=False,
            rounds=5,
            micro_rounds=3,
            micro_n=200_000,
            micro_n_torch=100_000,
            micro_n_dump=1_000,
            micro_reps=5,
            micro_target_s=0.25,
            mlp_steps=200,
            scipy_iters=2_000,
            startup_reps_numpy=30,
            startup_reps_torch=8,
            dump_counts=((1 << 10, 3_000), (64 << 10, 1_000), (1 << 20, 150)),
            dump_rounds=3,
            query_sizes=(1_000_000, 10_000_000),
            query_rounds=2,
            memory_steps=(50, 500),
            memory_rounds=1,
            compare_arrays=(4 << 20, 20),
            compare_rounds=3,
        )


@dataclass
class Section:
    name: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def row(self, variant: str, metric: str, value: Any, unit: str = "", vs: str = "") -> None:
        self.rows.append(
            {"variant": variant, "metric": metric, "value": value, "unit": unit, "vs": vs}
        )

    def keep(self, runs: dict[str, VariantRuns], prefix: str = "") -> None:
        for name, vr in runs.items():
            self.variants[prefix + name] = vr.to_json()

    def unavailable(self, runs: dict[str, VariantRuns]) -> None:
        for name, vr in runs.items():
            if vr.status != "ok":
                self.row(name, vr.status, vr.error or "", "", "")
            elif vr.error:  # some rounds failed or fell back: left out of the medians
                bad = [r for r in vr.runs if r.status != "ok"]
                self.notes.append(
                    f"{name}: {len(bad)} of {len(vr.runs)} runs {bad[0].status}, left out of "
                    f"the medians: {vr.error}"
                )

    def engines(self, runs: dict[str, VariantRuns], prefix: str = "") -> None:
        """A note naming the engine each probed variant ran with (meta.json ``core``)."""
        seen = {}
        for name, vr in runs.items():
            got = sorted(
                {str((r.data.get("core") or {}).get("engine")) for r in vr.runs if r.status == "ok"}
                - {"None"}
            )
            if got:
                seen[prefix + name] = "/".join(got)
        if seen:
            self.figures.setdefault("engines", {}).update(seen)
            self.notes.append(
                "engine that recorded (meta.json core.engine): "
                + ", ".join(f"{k}: {v}" for k, v in seen.items())
            )


Log = Callable[[str], None]


def _probe(name: str, mode: str | None = None, **env: str) -> dict[str, Any]:
    e = dict(env)
    if mode:
        e["PPROBE_MODE"] = mode
    return {"name": name, "probe": True, "env": e}


#: Log mode under each recording engine (PPROBE_CORE; pprobe/core.py). Each run's meta.json
#: must name the engine asked for, else the run is "fell back" and is not timed as that engine.
ENGINES = ("native", "python")
LOG = {e: f"log ({e})" for e in ENGINES}
#: dump mode past its budget (the NumPy MLP)
SPENT = "dump, budget spent"


def _log_variants(torch: bool) -> list[Variant]:
    return [
        Variant(LOG[e], probe=True, env={"PPROBE_MODE": "log"}, needs_torch=torch, engine=e)
        for e in ENGINES
    ]


def _variants(torch: bool, extra: list[Variant] | None = None) -> list[Variant]:
    """none, installed-but-off, log (native), log (python), stats, dump (+ extra).

    stats and dump run the default engine (PPROBE_CORE unset: ``auto``)."""
    vs = [
        Variant("none"),
        Variant("off", probe=True, env={"PPROBE": "0"}),
        *_log_variants(torch),
        Variant("stats", probe=True, env={"PPROBE_MODE": "stats"}, needs_torch=torch),
        Variant("dump", probe=True, env={"PPROBE_MODE": "dump"}, needs_torch=torch),
    ]
    return vs + (extra or [])


def _ratio(v: float | None, base: float | None) -> str:
    return f"x{v / base:.2f}" if v is not None and base else ""


# ------------------------------------------------------------------ 1, 2: micro
def micro(plan: Plan, log: Log, framework: str) -> Section:
    torch = framework == "torch"
    sec = Section(
        f"micro_{framework}",
        f"{'2' if torch else '1'}. {framework} micro: ns per call on 10-element "
        f"{'tensors' if torch else 'arrays'}",
    )
    n = plan.micro_n_torch if torch else plan.micro_n
    extra = []
    if torch:
        extra.append(Variant("torch.profiler", args={"profiler": True}))
    vs = _variants(torch, extra)
    if torch and plan.quick:  # each torch child pays ~2 s of import: keep the smoke run short
        vs = [v for v in vs if v.name in ("none", *LOG.values(), "torch.profiler")]
    for v in vs:
        if v.env.get("PPROBE_MODE") == "dump":
            v.args["n"] = plan.micro_n_dump  # every call writes 3 files
    runs = interleave(
        "micro_torch" if torch else "micro_numpy",
        vs,
        plan.micro_rounds,
        {**plan.common(), "n": n, "reps": plan.micro_reps, "target_s": plan.micro_target_s},
        log=log,
    )
    sec.keep(runs)
    base = runs["none"]
    ops = list((base.runs[0].data.get("ns_per_call") or {}) if base.runs else {})
    sec.figures = {"ns_per_call": {}, "delta_us": {}, "covered": {}, "writer_us_per_row": {}}
    for op in ops:
        b = base.median(lambda o, op=op: o.data["ns_per_call"].get(op))
        sec.row("none", op, _f(b), "ns/call")
        for name, vr in runs.items():
            if name == "none" or vr.status != "ok":
                continue
            m = vr.median(lambda o, op=op: o.data["ns_per_call"].get(op))
            rpc = vr.median(lambda o, op=op: (o.data.get("rows_per_call") or {}).get(op))
            delta = (m - b) / 1000 if m is not None and b is not None else None
            cov = "" if rpc is None else (" (recorded)" if rpc >= 0.5 else " (NOT recorded)")
            sec.row(
                name, op + cov, _f(m), "ns/call", f"{delta:+.2f} us" if delta is not None else ""
            )
            sec.figures["ns_per_call"].setdefault(name, {})[op] = m
            sec.figures["delta_us"].setdefault(name, {})[op] = delta
            if rpc is not None:
                sec.figures["covered"].setdefault(name, {})[op] = rpc
            if name == "torch.profiler":
                me = vr.median(lambda o, op=op: o.data["ns_per_call_with_exit"].get(op))
                de = (me - b) / 1000 if me is not None and b is not None else None
                sec.row(name, op + " incl. exit", _f(me), "ns/call", f"{de:+.2f} us")
                sec.figures["delta_us"].setdefault("torch.profiler+exit", {})[op] = de
    # The writer thread's CPU per op row over each op's timed loops (steady state).
    for name, vr in runs.items():
        if name == "none" or vr.status != "ok" or not vr.variant.probe:
            continue
        per_op = {
            op: vr.median(lambda o, op=op: (o.data.get("writer_us_per_row") or {}).get(op))
            for op in ops
        }
        per_op = {k: v for k, v in per_op.items() if v is not None}
        if not per_op:
            continue
        sec.figures["writer_us_per_row"][name] = per_op
        sec.row(
            name,
            "writer CPU per op row: " + ", ".join(f"{k} {v:.2f}" for k, v in per_op.items()),
            f"{max(per_op.values()):.2f}",
            "us/row (max)",
        )
    sec.notes.append(
        "writer CPU per op row: CPU time of pprobe's writer thread (pthread CPU clock) over each "
        "op's timed loops, divided by the op rows it wrote in them (the writer's one-time imports "
        "are before them)"
    )
    sec.engines(runs)
    sec.unavailable(runs)
    return sec


def _f(x: float | None, nd: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{nd}f}"


# ------------------------------------------------------------------ 3, 4: programs
def _total(o: Outcome) -> float:
    return o.data["loop_s"] + o.data.get("finish_s", 0.0)


def _program(
    sec: Section, script: str, vs: list[Variant], plan: Plan, args: dict, log: Log, per: str
) -> None:
    runs = interleave(script, vs, plan.rounds, {**plan.common(), **args}, log=log)
    sec.keep(runs, prefix=script + "/" if script != "mlp_torch" else "")
    base = runs["none"].median(_total)
    fig = sec.figures.setdefault(
        script, {"ratio": {}, "seconds": {}, "rows_per_" + per: {}, "writer": {}}
    )
    for name, vr in runs.items():
        if vr.status != "ok":
            continue
        tot = vr.median(_total)
        loop = vr.median(lambda o: o.data["loop_s"])
        fin = vr.median(lambda o: o.data.get("finish_s", 0.0))
        rows = vr.median(
            lambda o: (
                ((o.data.get("probe") or {}).get("rows") or 0) / o.data.get("units", 1)
                if (o.data.get("probe") or {}).get("active")
                else None
            )
        )
        label = f"{script} total" if script != "mlp_torch" else "total"
        extra = f" (loop {loop:.3f} + finish {fin:.3f})" if fin else ""
        if rows is not None:
            extra += f", {rows:.1f} rows/{per}"
            fig["rows_per_" + per][name] = rows
        for key, what in (("trace_mb", "trace"), ("dump_mb", "dump"), ("setup_s", "")):
            x = vr.median(_data(key))
            if x is None:
                continue
            fig.setdefault(key, {})[name] = x
            if what:  # a peer's output: the profiler's Chrome trace, msprobe's dump folder
                extra += f", {what} {x:,.1f} MB"
        w = _writer_figures(vr)
        if w:
            fig["writer"][name] = w
            if w.get("us_per_row") is not None:
                extra += f", writer {w['us_per_row']:.2f} us/row"
        paired = [t / b for t, b in zip(vr.values(_total), runs["none"].values(_total)) if b]
        spread = f" ({min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
        sec.row(name, label + extra, _f(tot, 3), "s", _ratio(tot, base) + spread)
        fig["seconds"][name] = tot
        fig["ratio"][name] = tot / base if base else None
        fig.setdefault("paired_ratios", {})[name] = paired
        if name == "off":  # PPROBE=0: nothing may be patched (the cost is zero by construction)
            facts = [(o.data.get("probe") or {}).get("untouched") for o in vr.runs]
            fig["off_untouched"] = untouched_all(facts)
    sec.engines(runs, prefix=f"{script}/" if script != sec.name else "")
    sec.unavailable({f"{script}/{k}": v for k, v in runs.items()})


def _data(key: str) -> Callable[[Outcome], Any]:
    return lambda o: o.data.get(key)


def _writer_figures(vr: VariantRuns) -> dict[str, Any]:
    """Medians of the child's writer report (bench/workloads/_child.py: writer_cost)."""

    def get(key: str) -> Callable[[Outcome], Any]:
        return lambda o: ((o.data.get("probe") or {}).get("writer") or {}).get(key)

    out = {
        k: vr.median(get(k))
        for k in (
            "us_per_row",
            "later_flushes_us_per_row",
            "import_cpu_s",
            "thread_cpu_s",
            "rows",
            "flushes",
            "rows_other_threads",
        )
    }
    return {k: v for k, v in out.items() if v is not None}


#: msprobe (mindstudio-probe) as a peer on the torch MLP: its task -> the variant's name.
MSPROBE = {"statistics": "msprobe statistics", "tensor": "msprobe tensor"}
#: the torch MLP's reference for the api level: an empty TorchFunctionMode (mlp_torch.py's
#: ``empty_mode``), what a probe built on the mode pays before it records anything
FLOOR = "TorchFunctionMode, pass-through"
MSPROBE_PIP = "pip install mindstudio-probe==26.2.0, optional: see docs/performance.md"


def msprobe_variants(dump_dir: str) -> list[Variant]:
    """msprobe's peer variants of the torch MLP: "unavailable" in a child without msprobe."""
    return [
        Variant(
            name,
            args={"msprobe": task, "msprobe_dir": dump_dir, "requires": {"msprobe": MSPROBE_PIP}},
        )
        for task, name in MSPROBE.items()
    ]


def mlp_torch(plan: Plan, log: Log) -> Section:
    sec = Section(
        "mlp_torch",
        f"3. torch MLP 128-256-256-10, batch 64, {plan.mlp_steps} SGD steps (CPU): seconds",
    )
    extra = [
        Variant(
            "module",
            probe=True,
            env={"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "module"},
            needs_torch=True,
            torch_level="module",
        ),
        Variant(
            "aten",
            probe=True,
            env={"PPROBE_MODE": "log", "PPROBE_TORCH_LEVEL": "aten"},
            needs_torch=True,
            torch_level="aten",
        ),
        Variant(
            "stats+on_nan",  # PPROBE_ON_NAN's check: its cost is this against "stats"
            probe=True,
            env={"PPROBE_MODE": "stats", "PPROBE_ON_NAN": "warn"},
            needs_torch=True,
        ),
        Variant("torch.profiler", args={"profiler": True}),
        # the floor of an api-level probe on TorchFunctionMode: the mode, a pass-through handler
        Variant(FLOOR, args={"empty_mode": True}),
        # docs/extending.md's cost: one @table and one @metric sampled at every step boundary
        Variant(
            "log + ext (native)",
            probe=True,
            env={"PPROBE_MODE": "log"},
            args={"ext": True},
            needs_torch=True,
            engine="native",
        ),
    ]
    dump_dir = tempfile.mkdtemp(prefix="pprobe-bench-msprobe-")  # msprobe's dumps, deleted after
    extra += msprobe_variants(dump_dir)
    vs = _variants(True, extra)
    if plan.quick:  # ~2-5 s per torch child: the smoke run keeps one probed mode per level
        keep = ("none", *LOG.values(), "module", "aten", "torch.profiler", FLOOR,
                "log + ext (native)", *MSPROBE.values())  # fmt: skip
        vs = [v for v in vs if v.name in keep]
    try:
        _program(sec, "mlp_torch", vs, plan, {"steps": plan.mlp_steps}, log, "step")
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)
    _writer_note(sec)
    sec.notes.append(
        f"{FLOOR} (a reference, not a peer): the warm-up and timed steps inside a "
        "TorchFunctionMode whose handler only calls each function; torch hands that mode "
        "every call, property reads such as the optimizer's p.grad included, so an api-level "
        "probe built on the mode (pprobe's api level) pays at least this before it records "
        "anything"
    )
    _peer_note(sec)
    return sec


def _peer_note(sec: Section) -> None:
    """How the peers ran: torch.profiler, and msprobe when it is installed."""
    sec.notes.append(
        "peers (context, not targets): torch.profiler(record_shapes=True) around the timed "
        "steps, finish = __exit__ + export_chrome_trace; msprobe (mindstudio-probe) "
        "PrecisionDebugger(config_path) with task statistics (max/min/mean/L2 norm per tensor) "
        "or tensor (.pt files), level L1, start(model)/stop()/step() around every step (the "
        "untimed warm-up steps too: its hooks are mounted before the timing), dumps written "
        "inside the loop (finish empty) to a temporary folder deleted after the run; its default "
        "INFO logging (several lines per step) goes to the child's stdout, a file"
    )
    fig = sec.figures.get("mlp_torch") or {}
    setup = fig.get("setup_s") or {}
    if setup:
        sec.notes.append(
            "not timed (like pprobe's start-up and the profiler's import): msprobe's import and "
            "PrecisionDebugger(...) took " + ", ".join(f"{k}: {v:.2f} s" for k, v in setup.items())
        )
    missing = [
        n for n in MSPROBE.values() if (sec.variants.get(n) or {}).get("status") == "unavailable"
    ]
    if missing:
        sec.notes.append(
            f"{', '.join(missing)}: unavailable here. msprobe is an optional peer, not a "
            "dependency: pip install mindstudio-probe==26.2.0 (it needs no torch of its own; CI "
            "installs it before the smoke run with torch pinned, and goes on without it)"
        )


def numpy_mlp(plan: Plan, log: Log) -> Section:
    sec = Section(
        "numpy_mlp",
        f"4a. NumPy MLP 128-256-256-10, batch 64, {plan.mlp_steps} steps, manual backward: seconds",
    )
    # dump mode once the budget is used up (in the warm-up steps): what the rest of a long
    # run costs, where every dump is refused with its note
    spent = Variant(SPENT, probe=True, env={"PPROBE_MODE": "dump", "PPROBE_BUDGET": "1MB"})
    vs = _variants(False, [spent])
    _program(sec, "numpy_mlp", vs, plan, {"steps": plan.mlp_steps}, log, "step")
    _writer_note(sec)
    sec.notes.append(
        f"{SPENT}: dump mode with PPROBE_BUDGET=1MB, used up in the warm-up steps: the cost of "
        "dump mode for the rest of a run longer than its budget (statistics, no dumps)"
    )
    return sec


def scipy_loop(plan: Plan, log: Log) -> Section:
    sec = Section(
        "scipy_loop",
        f"4b. SciPy loop: linalg.solve 64x64 + signal.lfilter, {plan.scipy_iters} iterations: "
        "seconds",
    )
    _program(sec, "scipy_loop", _variants(False), plan, {"iters": plan.scipy_iters}, log, "iter")
    _writer_note(sec)
    return sec


def _writer_note(sec: Section) -> None:
    lines = []
    for fig in sec.figures.values():
        if not isinstance(fig, dict):
            continue
        for name, w in (fig.get("writer") or {}).items():
            if w.get("us_per_row") is None:
                continue
            later = w.get("later_flushes_us_per_row")
            lines.append(
                f"{name}: {w['us_per_row']:.2f} us/row over {w.get('rows', 0):,.0f} rows in "
                f"{w.get('flushes', 0):.0f} flushes"
                + (f" ({later:.2f} after the first flush)" if later is not None else "")
                + f", writer imports {w.get('import_cpu_s', 0) * 1000:.0f} ms"
            )
    if lines:
        sec.notes.append(
            "writer CPU per op row = (CPU time of pprobe's writer thread at the end of the run, "
            "pthread CPU clock - its one-time imports: pyarrow where the tree's writer uses it) "
            "/ op rows it wrote; " + "; ".join(lines)
        )


# ------------------------------------------------------------------ 5: start-up
def _make_venv(root: str, name: str, pth: bool) -> str:
    d = os.path.join(root, name)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", d], check=True
    )
    py = os.path.join(d, "bin", "python")
    if pth:
        site = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        sys.path.insert(0, REPO)
        from pprobe import siteinstall

        with open(os.path.join(site, siteinstall.PTH_NAME), "w") as f:
            f.write(siteinstall.pth_line(REPO))
    return py


#: What an import leaves behind that a start-up hook could change: the modules loaded, the
#: import system's hooks, the trace and profile functions (printed as JSON by the child).
_FOOTPRINT = (
    "import json, sys\n{code}\n"
    "def name(o):\n"
    "    t = o if isinstance(o, type) else type(o)\n"
    "    return t.__module__ + '.' + t.__qualname__\n"
    "print(json.dumps({{'modules': sorted(sys.modules), "
    "'meta_path': [name(o) for o in sys.meta_path], "
    "'path_hooks': [getattr(h, '__qualname__', repr(h)) for h in sys.path_hooks], "
    "'trace': repr(sys.gettrace()), 'profile': repr(sys.getprofile())}}))\n"
)


def _footprint(py: str, code: str, env: dict[str, str], cwd: str) -> dict[str, Any] | str:
    """The state ``python -c code`` leaves (:data:`_FOOTPRINT`), or the child's error."""
    try:
        r = subprocess.run(
            [py, "-c", _FOOTPRINT.format(code=code)],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0:
            return (r.stderr.strip() or f"exit {r.returncode}")[-300:]
        return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return f"{type(e).__name__}: {e}"[-300:]


def _untouched(plain: dict[str, Any] | str, pth: dict[str, Any] | str) -> tuple[bool, str]:
    """Whether the .pth venv's import left exactly what the plain venv's did, and why not."""
    if isinstance(plain, str) or isinstance(pth, str):
        return False, f"footprint not read: {plain if isinstance(plain, str) else pth}"
    extra = sorted(set(pth["modules"]) - set(plain["modules"]))
    if extra:
        return False, "modules only with the .pth: " + ", ".join(extra[:8])
    diff = [
        k for k in ("modules", "meta_path", "path_hooks", "trace", "profile") if pth[k] != plain[k]
    ]
    if diff:
        return False, "differs: " + ", ".join(diff)
    return True, ""


def _pth_line_us(pth_line: str, root: str) -> float:
    """CPU microseconds of the .pth line itself, run in this process as site runs it, with
    PPROBE and PPROBE_CONFIG unset and no pprobe.toml in the working folder (best of 5 x 200)."""
    saved = {k: os.environ.pop(k) for k in ("PPROBE", "PPROBE_CONFIG") if k in os.environ}
    here = os.getcwd()
    code = compile(pth_line, "pprobe-auto.pth", "exec")
    try:
        os.chdir(root)
        best = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(200):
                exec(code, {})
            best = min(best, (time.process_time() - t0) / 200)
        return best * 1e6
    finally:
        os.chdir(here)
        os.environ.update(saved)


def startup(plan: Plan, log: Log) -> Section:
    what = "CPU (user+sys)" if plan.clock == "cpu" else "wall"
    sec = Section(
        "startup", f"5. Start-up: {what} ms of `python -c 'import X'`, deltas paired by round"
    )
    root = tempfile.mkdtemp(prefix="pprobe-bench-venv-")
    out_dir = tempfile.mkdtemp(prefix="pprobe-bench-startup-")
    try:
        venv_plain = _make_venv(root, "plain", pth=False)
        venv_pth = _make_venv(root, "pth", pth=True)
        env = base_env()
        # The .pth must really be live: with PPROBE=1 it starts the probe.
        chk = subprocess.run(
            [venv_pth, "-c", "import sys; print('pprobe._startup' in sys.modules)"],
            env={**env, "PPROBE": "1", "PPROBE_OUTPUT": out_dir},
            capture_output=True,
            text=True,
            cwd=root,
        )
        live = chk.stdout.strip() == "True"
        sec.notes.append(
            f".pth check (venv python with PPROBE=1 imports pprobe at start-up): {live}"
        )
        variants: list[tuple[str, str, dict[str, str]]] = [
            ("absent", sys.executable, env),
            (
                "bootstrap, PPROBE=0",
                sys.executable,
                {**env, "PYTHONPATH": BOOTSTRAP, "PPROBE": "0"},
            ),
            (
                "bootstrap, on",
                sys.executable,
                {**env, "PYTHONPATH": BOOTSTRAP, "PPROBE_OUTPUT": out_dir},
            ),
            ("venv, absent", venv_plain, env),
            ("venv, .pth installed, PPROBE unset", venv_pth, env),
        ]
        base_of = {
            "bootstrap, PPROBE=0": "absent",
            "bootstrap, on": "absent",
            "venv, .pth installed, PPROBE unset": "venv, absent",
        }
        programs = (
            ("nothing", "pass", plan.startup_reps_numpy),
            ("numpy", "import numpy", plan.startup_reps_numpy),
            ("torch", "import torch", plan.startup_reps_torch),
        )
        from pprobe import siteinstall

        line_us = _pth_line_us(siteinstall.pth_line(REPO), root)
        sec.figures["pth_line_us"] = line_us
        sec.notes.append(
            f".pth line with PPROBE unset, run in-process as site runs it: {line_us:.1f} us of "
            "CPU (it reads PPROBE and PPROBE_CONFIG and looks for ./pprobe.toml)"
        )
        for mod, code, reps in programs:
            if not reps:
                sec.notes.append(f"import {mod}: not measured in this plan (--quick)")
                continue
            # What the import leaves behind, without and with the .pth (PPROBE unset): the
            # same modules, import hooks and trace/profile functions mean the .pth changed
            # nothing the import does, whatever the timing's noise says.
            same, why = _untouched(
                _footprint(venv_plain, code, env, root), _footprint(venv_pth, code, env, root)
            )
            fp = sec.figures.setdefault(mod, {"ms": {}, "delta_ms": {}})
            fp["pth_untouched"] = same
            sec.notes.append(
                f"python -c '{code}', .pth installed and PPROBE unset: "
                + (
                    "the same modules, import hooks and trace/profile functions as without it"
                    if same
                    else why
                )
            )
            times: dict[str, list[float]] = {v[0]: [] for v in variants}
            walls: dict[str, list[float]] = {v[0]: [] for v in variants}
            errors: dict[str, str] = {}
            for r in range(reps + 1):  # round 0 warms the page cache and is dropped
                k = r % len(variants)
                for name, py, e in variants[k:] + variants[:k]:
                    rc, _so, se, wall, _rss, cpu = run_process([py, "-c", code], e, root, 300)
                    if rc != 0:
                        errors[name] = se.strip()[-300:]
                    elif r:
                        times[name].append((cpu if plan.clock == "cpu" else wall) * 1000)
                        walls[name].append(wall * 1000)
                    shutil.rmtree(out_dir, ignore_errors=True)
            fig = sec.figures.setdefault(mod, {"ms": {}, "delta_ms": {}})
            fig["samples_ms"] = times
            fig["wall_samples_ms"] = walls
            for name, _py, _e in variants:
                if name in errors:
                    sec.row(name, code, "failed", "", errors[name])
                    continue
                ms = median(times[name])
                fig["ms"][name] = ms
                b = base_of.get(name)
                d = paired_delta(times[name], times[b]) if b else None
                fig["delta_ms"][name] = d
                ci = ""
                if b:
                    lo, hi = paired_ci(times[name], times[b])
                    fig.setdefault("delta_ci95_ms", {})[name] = [lo, hi]
                    ci = f" [95% CI {lo:+.1f}, {hi:+.1f}]"
                sec.row(
                    name,
                    f"python -c '{code}' (n={reps})",
                    f"{ms:.1f}",
                    "ms",
                    f"{d:+.1f} ms vs {b}{ci}" if d is not None else "",
                )
        sec.figures["pth_live"] = live
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)
    return sec


# ------------------------------------------------------------------ 6: dumps
def _busy_iters(target_s: float = 250e-6) -> int:
    """Iterations of the children's pure-Python busy loop that take ``target_s`` here."""

    def busy(k: int) -> int:
        s = 0
        for i in range(k):
            s += i
        return s

    k = 20_000
    best = min(_timeit(lambda: busy(k)) for _ in range(5))
    return max(1, int(k * target_s / best))


def _timeit(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def dumps(plan: Plan, log: Log) -> Section:
    sec = Section(
        "dumps",
        "6. Dump throughput (np.negative per call: input + output saved = 2 files)",
    )
    busy = _busy_iters()
    sec.notes.append(
        f"duty cycle: each iteration runs {busy} pure-Python loop iterations (~250 us unprobed)"
        " then one op; 2 arrays per iteration (8,000 arrays/s at most), so both targets"
        " (>= 5,000 arrays/s and <= x1.5) hold when one dump costs the main thread <= 62 us"
    )
    sec.notes.append(
        "disk = the same bytes as one write() to one new file: 'page cache' without fsync "
        "(pprobe never fsyncs: the copy alone, what the memory allows), 'fsync' with "
        "os.fsync after it, 'O_DIRECT' from a page-aligned buffer with O_DIRECT (the device "
        "alone, whatever the page cache's state); the disk's bandwidth (the 1 MB target's "
        "reference) is the faster of the last two"
    )
    io_dir = tempfile.mkdtemp(prefix="pprobe-bench-io-")
    try:
        for nbytes, count in plan.dump_counts:
            label = _size(nbytes)
            dump = {"PPROBE_MODE": "dump"}
            vs = [
                Variant("op, no probe", args={"kind": "op"}),
                Variant("op, pprobe dump", probe=True, env=dump, args={"kind": "op"}),
                Variant("np.save loop", args={"kind": "np_save", "dir": io_dir}),
                Variant("disk, page cache", args={"kind": "disk", "dir": io_dir}),
                Variant("disk, fsync", args={"kind": "disk", "dir": io_dir, "fsync": True}),
                Variant("disk, O_DIRECT", args={"kind": "disk", "dir": io_dir, "direct": True}),
                Variant("duty, no probe", args={"kind": "duty", "busy": busy}),
                Variant(
                    "duty, pprobe dump", probe=True, env=dump, args={"kind": "duty", "busy": busy}
                ),
            ]
            runs: dict[str, VariantRuns] = {}
            args = {**plan.common(), "nbytes": nbytes, "count": count}
            for r in range(plan.dump_rounds):
                k = r % len(vs)
                for v in vs[k:] + vs[:k]:
                    got = interleave("dump_io", [v], 1, args, log=log)[v.name]
                    runs.setdefault(v.name, VariantRuns(v)).runs.extend(got.runs)
                    for f in os.listdir(io_dir):
                        os.unlink(os.path.join(io_dir, f))
            sec.keep(runs, prefix=f"{label}/")
            fig: dict[str, Any] = {}
            for name, vr in runs.items():
                if vr.status != "ok":
                    continue
                loop = vr.median(lambda o: o.data["loop_s"])
                # Throughput: until the last file was on disk (pprobe writes them from its
                # writer thread while the loop runs, and drains after it), wall clock.
                span = vr.median(
                    lambda o: o.data.get("loop_s_wall", o.data["loop_s"]) + o.data.get("drain_s", 0)
                )
                files = vr.median(lambda o: _files(o)[0])
                nb = vr.median(lambda o: _files(o)[1])
                thread = vr.median(lambda o: o.data.get("loop_thread_s"))
                if not loop or not files or not span:
                    fig[name] = {"loop_s": loop, "loop_thread_s": thread}
                    sec.row(name, f"{label}: {count} iterations", _f(loop, 3), "s")
                    continue
                fig[name] = {
                    "loop_s": loop,
                    "loop_thread_s": thread,
                    "files_s": files / span,
                    "mb_s": nb / span / 1e6,
                }
                direct = vr.median(lambda o: o.data.get("direct_files"))
                fig[name]["direct_files"] = direct
                sec.row(
                    name,
                    f"{label}: {files:.0f} files, {nb / 1e6:.1f} MB"
                    + (f" ({direct:.0f} with O_DIRECT)" if direct else ""),
                    f"{files / span:,.0f} files/s, {nb / span / 1e6:,.0f} MB/s",
                    "",
                    "",
                )
            dn, dd = fig.get("duty, no probe"), fig.get("duty, pprobe dump")
            # What the program pays: the main thread's own CPU time (time.thread_time), not
            # the process's, which also counts pprobe's writer threads on other cores.
            key = "loop_thread_s" if dn and dd and dn.get("loop_thread_s") else "loop_s"
            if dn and dd and dd.get(key):
                dd["slowdown"] = dd[key] / dn[key]
                sec.row(
                    "duty, pprobe dump", f"{label}: main thread slowdown", f"x{dd['slowdown']:.2f}"
                )
            on, od = fig.get("op, no probe"), fig.get("op, pprobe dump")
            if on and od and od.get("files_s") and od.get(key):
                n_files = (_files_med(runs.get("op, pprobe dump")) or 0) or 1
                per = (od[key] - on[key]) / n_files * 1e6
                od["us_per_file"] = per
                sec.row(
                    "op, pprobe dump", f"{label}: main-thread cost per file", f"{per:,.0f}", "us"
                )
            sec.figures[label] = fig
            sec.unavailable({f"{label}/{k}": v for k, v in runs.items()})
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
    return sec


def _files(o: Outcome) -> tuple[float | None, float | None]:
    return o.data.get("files"), o.data.get("bytes")


def _files_med(vr: VariantRuns | None) -> float | None:
    return vr.median(lambda o: _files(o)[0]) if vr is not None and vr.status == "ok" else None


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


# ------------------------------------------------------------------ 7: query
def _schema_version() -> str:
    with open(os.path.join(REPO, "pprobe", "schema.py")) as f:
        for line in f:
            if line.startswith("SCHEMA_VERSION"):
                return line.split("=", 1)[1].strip().strip("\"'")
    return "?"


def _log_format() -> str:
    """What a cached log must have been written with: the schema version, and the log's
    encoding (pprobe/logschema.py: its columns' types, e.g. dictionary-encoded names, can
    change without a new schema version)."""
    import hashlib

    with open(os.path.join(REPO, "pprobe", "logschema.py"), "rb") as f:
        encoding = hashlib.sha256(f.read()).hexdigest()[:12]
    return f"{_schema_version()}/{encoding}"


def _query_log(rows: int, log: Log) -> tuple[str | None, dict[str, Any]]:
    """A probe-made log of ``rows`` op rows, generated once and cached under bench/.cache/
    (made again when the log's schema or encoding changed: :func:`_log_format`)."""
    d = os.path.join(CACHE, f"query-{rows}")
    marker = os.path.join(d, "complete.json")
    version = _log_format()
    if os.path.isfile(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get("schema_version") == version and os.path.isdir(info.get("run_dir", "")):
            info["cached"] = True
            return info["run_dir"], info
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    log(f"    generating a {rows:,}-row log (cached in {os.path.relpath(d, REPO)})")
    v = Variant("log", probe=True, env={"PPROBE_MODE": "log"})
    o = run_child("query_gen", {"rows": rows, "clock": "wall"}, v, d, timeout=3600)
    if o.status != "ok":
        return None, {"error": o.error}
    facts = o.data["probe"]
    info = {
        "rows": facts["rows"],
        "run_dir": facts["run_dir"],
        "schema_version": version,
        "gen_loop_s": o.data["loop_s"],
        "gen_wall_s": o.wall_s,
        "gen_finish_s": o.data["finish_s"],
        "log_mb": sum(
            os.path.getsize(os.path.join(facts["run_dir"], "log", f))
            for f in os.listdir(os.path.join(facts["run_dir"], "log"))
        )
        / 1e6,
        "cached": False,
    }
    with open(marker, "w") as f:
        json.dump(info, f, indent=1)
    return info["run_dir"], info


def query(plan: Plan, log: Log) -> Section:
    sec = Section("query", "7. Query: DuckDB over a probe-made log (pprobe.query)")
    os.makedirs(CACHE, exist_ok=True)
    vs = []
    for n in plan.query_sizes:
        run_dir, info = _query_log(n, log)
        label = _rows(n)
        sec.figures.setdefault(label, {})["log"] = info
        if run_dir is None:
            sec.row(label, "generation failed", info.get("error", ""))
            continue
        rate = info["rows"] / info["gen_loop_s"]
        sec.row(
            label,
            f"log made by the probe{' (cached)' if info.get('cached') else ''}: "
            f"{info['rows']:,} rows, {info['log_mb']:.0f} MB on disk",
            f"{rate:,.0f}",
            "rows/s while logging",
        )
        vs.append(Variant(label, pythonpath=REPO, args={"run": run_dir}))
    if not vs:
        return sec
    # DuckDB runs on every core: its CPU time would count each core; wall time is what a
    # user waits (the CPU figures are in the JSON too).
    runs = interleave("query_run", vs, plan.query_rounds, {"clock": "wall"}, log=log)
    sec.keep(runs)
    for name, vr in runs.items():
        if vr.status != "ok":
            continue
        fig = sec.figures[name]
        first = vr.runs[0].data.get("load_s") if vr.runs[0].status == "ok" else None
        later = [o.data["load_s"] for o in vr.runs[1:] if o.status == "ok"]
        fig["first_load_s"] = first
        sec.row(name, "first connect after the run (builds any query cache)", _f(first, 3), "s")
        if later:
            fig["later_load_s"] = median(later)
            sec.row(name, "connect again (cache warm)", _f(median(later), 3), "s")
        for key, what in (
            ("load_s", "connect, median of rounds"),
            ("group_by_s", "GROUP BY op, engine only"),
            ("join_s", "ops JOIN tensors, engine only"),
            ("group_by_end_to_end_s", "GROUP BY end to end (run_sql)"),
            ("join_end_to_end_s", "JOIN end to end (run_sql)"),
        ):
            m = vr.median(lambda o, key=key: o.data.get(key))
            fig[key] = m
            sec.row(name, what, _f(m, 3), "s")
        fig["peak_rss_mb"] = vr.median(lambda o: o.maxrss_mb)
        sec.row(name, "peak RSS of the query process", _f(fig["peak_rss_mb"]), "MB")
    sec.unavailable(runs)
    return sec


def _rows(n: int) -> str:
    return f"{n // 1_000_000}M rows" if n >= 1_000_000 else f"{n // 1000}k rows"


# ------------------------------------------------------------------ 8: memory
def memory(plan: Plan, log: Log) -> Section:
    s1, s2 = plan.memory_steps
    sec = Section("memory", f"8. Memory: peak RSS in dump mode, {s1} vs {s2} steps")
    programs = (("mlp_torch", True), ("numpy_mlp", False))
    if plan.quick:  # torch's memory is in the MLP section's JSON (maxrss_mb) anyway
        programs = programs[1:]
    for script, torch in programs:
        vs = []
        for steps in (s1, s2):
            if not plan.quick:  # the smoke run checks the probed runs only
                vs.append(Variant(f"none, {steps} steps", args={"steps": steps}))
            vs.append(
                Variant(
                    f"dump, {steps} steps",
                    probe=True,
                    env={"PPROBE_MODE": "dump"},
                    needs_torch=torch,
                    args={"steps": steps},
                )
            )
        runs = interleave(script, vs, plan.memory_rounds, plan.common(), log=log)
        sec.keep(runs, prefix=script + "/")
        fig = sec.figures.setdefault(script, {})
        for name, vr in runs.items():
            if vr.status != "ok":
                continue
            rss = vr.median(lambda o: o.maxrss_mb)
            d = vr.median(
                lambda o: ((o.data.get("probe") or {}).get("dumps") or {}).get("bytes_written")
            )
            exh = any(
                ((o.data.get("probe") or {}).get("dumps") or {}).get("exhausted") for o in vr.runs
            )
            fig[name] = {"peak_rss_mb": rss, "dump_mb": d / 1e6 if d else None, "exhausted": exh}
            extra = f" ({d / 1e6:.0f} MB dumped{', budget used up' if exh else ''})" if d else ""
            sec.row(f"{script}: {name}", "peak RSS" + extra, _f(rss), "MB")
        sec.unavailable({f"{script}/{k}": v for k, v in runs.items()})
    return sec


# ------------------------------------------------------------------ 9: compare
COMPARE_GEN = """
import os
import numpy as np

n, k = int(os.environ["N"]), int(os.environ["K"])
rng = np.random.default_rng(0)
for i in range(k):
    a = rng.standard_normal(n, dtype=np.float32)
    if os.environ.get("PERTURB"):
        a *= np.float32(1 + 1e-6)
    b = np.tanh(a)
"""

COMPARE_RUN = """
import json, sys, time
from pprobe.compare import compare
t0 = time.perf_counter()
c = compare(sys.argv[1], sys.argv[2])
wall = time.perf_counter() - t0
n = c.counts()
print(json.dumps({"wall_s": wall, "dumps_s": c.dump_seconds, "bytes": n["dump_bytes"],
                  "aligned": n["aligned"],
                  "fail": n["fail"], "tensors": n["tensors"]}))
"""


def compare(plan: Plan, log: Log) -> Section:
    """Throughput of pprobe compare over two dump-mode runs of float32 arrays (the dumps are
    in the page cache: they were just written)."""
    n, k = plan.compare_arrays
    sec = Section("compare", f"9. Compare: two dump runs, {k} x tanh of {_size(4 * n)} arrays")
    root = tempfile.mkdtemp(prefix="pprobe-bench-compare-")
    try:
        runs = []
        for name, extra in (("a", {}), ("b", {"PERTURB": "1"})):
            out = os.path.join(root, name)
            env = base_env()
            env.update(
                PYTHONPATH=BOOTSTRAP, PPROBE_OUTPUT=out, PPROBE_MODE="dump",
                PPROBE_BUDGET="64GiB", N=str(n), K=str(k), **extra,
            )  # fmt: skip
            rc, _, err, wall, _, _ = run_process(
                [sys.executable, "-c", COMPARE_GEN], env, root, timeout=1800
            )
            if rc != 0:
                sec.row(name, "generation failed", err.strip().splitlines()[-1:] or "")
                return sec
            runs.append(os.path.join(out, "latest"))
            log(f"    run {name}: made in {wall:.1f} s")
        results = []
        for _ in range(plan.compare_rounds):
            env = base_env()
            env["PYTHONPATH"] = REPO
            rc, out_, err, wall, rss, cpu = run_process(
                [sys.executable, "-c", COMPARE_RUN, *runs], env, root, timeout=1800
            )
            if rc != 0:
                sec.row("compare", "failed", (err.strip().splitlines() or [""])[-1])
                return sec
            d = json.loads(out_.strip().splitlines()[-1])
            d.update(process_wall_s=wall, cpu_s=cpu, peak_rss_mb=rss)
            results.append(d)
        sec.variants["compare"] = {"status": "ok", "runs": results}
        gb = results[0]["bytes"] / 1e9
        wall_s = median([r["wall_s"] for r in results])
        cpu_s = median([r["cpu_s"] for r in results])
        dumps_s = median([r["dumps_s"] for r in results])
        rss = median([r["peak_rss_mb"] for r in results])
        fig = sec.figures
        fig.update(
            dump_gb=gb,
            wall_s=wall_s,
            gb_per_s=gb / dumps_s,
            dumps_s=dumps_s,
            end_to_end_gb_per_s=gb / wall_s,
            cpu_s=cpu_s,
            gb_per_cpu_s=gb / cpu_s,
            peak_rss_mb=rss,
            tensors=results[0]["tensors"],
            fail=results[0]["fail"],
        )
        sec.row("compare", "dumps compared (both runs)", _f(gb, 2), "GB")
        sec.row("compare", "whole compare (load, align, metrics), median", _f(wall_s, 2), "s")
        sec.row("compare", "of which comparing dumps, median", _f(dumps_s, 2), "s")
        sec.row("compare", "throughput over dumps", _f(gb / dumps_s, 2), "GB/s")
        sec.row("compare", "throughput end to end", _f(gb / wall_s, 2), "GB/s")
        sec.row("compare", "throughput per CPU second (all threads)", _f(gb / cpu_s, 2), "GB/cpu-s")
        sec.row("compare", "peak RSS of the compare process", _f(rss), "MB")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return sec


SUITES: dict[str, Callable[[Plan, Log], Section]] = {
    "micro_numpy": lambda p, log: micro(p, log, "numpy"),
    "micro_torch": lambda p, log: micro(p, log, "torch"),
    "mlp_torch": mlp_torch,
    "numpy_mlp": numpy_mlp,
    "scipy_loop": scipy_loop,
    "startup": startup,
    "dumps": dumps,
    "query": query,
    "memory": memory,
    "compare": compare,
}
#: Older names accepted by ``--only`` (workload 4 was one section of both programs).
ALIASES: dict[str, tuple[str, ...]] = {"numpy_programs": ("numpy_mlp", "scipy_loop")}
