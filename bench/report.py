"""``python -m bench.report [RESULT.json ...]``: results as Markdown tables.

Without an argument, the newest file in bench/results/. With several, later files replace the
workloads they ran (refresh part of a full run with ``python -m bench --only X``) and the
targets are judged again on the merged figures. Used for docs/performance.md.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any

from .harness import REPO


def latest(full_only: bool = False) -> str:
    files = sorted(glob.glob(os.path.join(REPO, "bench", "results", "bench-*.json")))
    if full_only:
        files = [f for f in files if "quick" not in os.path.basename(f)]
    if not files:
        raise FileNotFoundError("no results in bench/results/: run python -m bench first")
    return files[-1]


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|")


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    merged = m.get("merged_from")
    out = [
        f"Run {m['started']} ({'quick' if m['quick'] else 'full'}, {m['duration_s']:.0f} s), "
        f"{m['cpus']} CPUs, clock: {m['plan'].get('clock', 'cpu')}, torch threads: "
        f"{m['plan'].get('torch_threads')}, commit {m['git'].get('commit', '')[:8]}"
        + (" + uncommitted pprobe changes" if m["git"].get("dirty") else "")
        + (
            f" (sources {m['git']['pprobe_sources_sha256']})"
            if m["git"].get("pprobe_sources_sha256")
            else ""
        ),
        *([f"Merged: {'; '.join(merged)}"] if merged else []),
        "",
        "| target | figure | limit | status |",
        "| --- | --- | --- | --- |",
    ]
    for t in res["targets"]:
        out.append(
            f"| {_cell(t['target'])} | {_cell(t['figure'])} | {_cell(t['limit'])} | "
            f"{_cell(t['status'])} |"
        )
    for w in res["workloads"].values():
        load = w["figures"].get("_load")
        out += ["", f"### {w['title']}", ""]
        if load:
            out.append(f"({w['seconds']:.0f} s; load average {load[0][0]} -> {load[1][0]})")
            out.append("")
        out += [
            "| variant | what | value | unit | vs baseline |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in w["table"]:
            out.append(
                "| "
                + " | ".join(_cell(r[k]) for k in ("variant", "metric", "value", "unit", "vs"))
                + " |"
            )
        for n in w.get("notes", []):
            out.append(f"\n- {n}")
    return "\n".join(out)


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Later results replace earlier ones workload by workload; targets judged again."""
    from . import targets
    from .suites import Section

    out = json.loads(json.dumps(results[0]))
    sources = [results[0]["meta"]["started"]]
    for r in results[1:]:
        out["workloads"].update(r["workloads"])
        sources.append(r["meta"]["started"] + " (" + ", ".join(r["workloads"]) + ")")
    sections = {}
    for name, w in out["workloads"].items():
        sec = Section(name, w["title"], w["table"], w["figures"], w["variants"], w["notes"])
        sec.seconds = w["seconds"]
        sections[name] = sec
    out["targets"] = targets.judge(sections)
    out["meta"]["merged_from"] = sources
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results = []
    for path in argv or [latest()]:
        with open(path) as f:
            results.append(json.load(f))
    res = merge(results) if len(results) > 1 else results[0]
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
