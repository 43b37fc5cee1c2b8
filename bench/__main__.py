"""``python -m bench``: run the workloads, print medians and ratios, write bench/results/*.json.

python -m bench                 # everything (several minutes)
python -m bench --quick         # the CI smoke run (< 3 minutes, no thresholds asserted)
python -m bench --only mlp_torch,startup
python -m bench --list
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from . import harness, suites, targets
from .harness import REPO

RESULTS = os.path.join(REPO, "bench", "results")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, one round (CI smoke test)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="workloads to run (comma-separated or repeated); see --list",
    )
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="time children by process CPU time (default: robust when other processes share "
        "the machine; counts pprobe's writer thread) or by wall time",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch and BLAS/OpenMP threads in the children (default 1: spinning worker threads "
        "make CPU and wall timings swing on a shared 2-core machine; 0 keeps the libraries' "
        "defaults)",
    )
    p.add_argument(
        "--out", default=RESULTS, help="folder for the JSON result (default: %(default)s)"
    )
    return p.parse_args(argv)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("numpy", "torch", "scipy", "pyarrow", "duckdb", "wrapt", "mindstudio-probe"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _git() -> dict[str, Any]:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip()

    import hashlib

    h = hashlib.sha256()  # pprobe changes under the benchmark: name the exact sources
    native = {}
    for d, _, files in sorted(os.walk(os.path.join(REPO, "pprobe"))):
        for f in sorted(files):
            path = os.path.join(d, f)
            if f.endswith((".py", ".c")):
                with open(path, "rb") as fh:
                    h.update(f.encode() + fh.read())
            elif f.startswith("_native") and f.endswith((".so", ".pyd")):  # the built core
                with open(path, "rb") as fh:
                    native[f] = {
                        "sha256": hashlib.sha256(fh.read()).hexdigest()[:16],
                        "mtime": time.strftime(
                            "%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(path))
                        ),
                    }
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "pprobe")),
        "pprobe_sources_sha256": h.hexdigest()[:16],
        "native_core": native,
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def format_section(sec: suites.Section) -> str:
    lines = [f"\n{sec.title}   [{sec.seconds:.0f} s, load avg {sec.figures.get('_load', '')}]"]
    rows = [(r["variant"], r["metric"], str(r["value"]), r["unit"], r["vs"]) for r in sec.rows]
    if rows:
        w = [max(len(r[i]) for r in rows) for i in range(5)]
        w = [min(x, 80) for x in w]
        for r in rows:
            lines.append(
                f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}} {r[3]:<{w[3]}}  {r[4]}".rstrip()
            )
    for n in sec.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def format_targets(ts: list[targets.Target]) -> str:
    lines = ["\nTargets"]
    w0 = max(len(t["target"]) for t in ts)
    w1 = max(len(t["figure"]) for t in ts)
    w2 = max(len(t["limit"]) for t in ts)
    for t in ts:
        lines.append(
            f"  {t['target']:<{w0}}  {t['figure']:<{w1}}  {t['limit']:<{w2}}  {t['status']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name in suites.SUITES:
            print(name)
        for alias, names in suites.ALIASES.items():
            print(f"{alias} (= {', '.join(names)})")
        return 0
    only = [n.strip() for o in args.only for n in o.split(",") if n.strip()]
    only = [m for n in only for m in suites.ALIASES.get(n, (n,))]
    only = list(dict.fromkeys(only))
    bad = [n for n in only if n not in suites.SUITES]
    if bad:
        print(f"unknown workload {bad[0]!r}; known: {', '.join(suites.SUITES)}", file=sys.stderr)
        return 2
    if "pprobe.session" in sys.modules:
        print(
            "bench: this process is probed (bootstrap on PYTHONPATH?); run it without",
            file=sys.stderr,
        )
        return 2
    plan = suites.Plan.make(args.quick, args.clock, args.threads)
    if args.threads > 0:
        n = str(args.threads)
        harness.THREAD_ENV.update(
            {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        )
    else:
        harness.THREAD_ENV.clear()
    names = only or list(suites.SUITES)
    t_start = time.time()
    git0 = _git()
    print(
        f"pprobe bench ({'quick' if args.quick else 'full'}): {', '.join(names)}; "
        f"{os.cpu_count()} CPUs, load avg {_load()}",
        flush=True,
    )
    sections: dict[str, suites.Section] = {}
    for name in names:
        print(f"  running {name} ...", flush=True)
        t0 = time.perf_counter()
        load0 = _load()
        try:
            sec = suites.SUITES[name](plan, lambda m: print(m, flush=True))
        except Exception as e:  # one broken workload must not lose the others' figures
            import traceback

            sec = suites.Section(name, f"{name}: FAILED")
            sec.notes.append(f"{type(e).__name__}: {e}")
            sec.figures["traceback"] = traceback.format_exc()
        sec.seconds = time.perf_counter() - t0
        sec.figures["_load"] = [load0, _load()]
        sections[name] = sec
        print(format_section(sec), flush=True)
    ts = targets.judge(sections)
    print(format_targets(ts))
    duration = time.time() - t_start
    git = _git()
    if (git["pprobe_sources_sha256"], git["native_core"]) != (
        git0["pprobe_sources_sha256"],
        git0["native_core"],
    ):
        git["at_start"] = git0  # pprobe (sources or built core) changed during the run
        print("\nwarning: pprobe's sources or its built native core changed during this run")
    result = {
        "meta": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_start)),
            "duration_s": duration,
            "quick": args.quick,
            "workloads": names,
            "plan": plan.__dict__,
            "thread_env": harness.THREAD_ENV,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "versions": _versions(),
            "git": git,
        },
        "targets": ts,
        "workloads": {
            n: {
                "title": s.title,
                "seconds": s.seconds,
                "table": s.rows,
                "figures": s.figures,
                "notes": s.notes,
                "variants": s.variants,
            }
            for n, s in sections.items()
        },
    }
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t_start))
    path = os.path.join(args.out, f"bench-{'quick-' if args.quick else ''}{stamp}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\n{len(sections)} workloads in {duration:.0f} s; results: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
