"""The HTML of ``pprobe report``: :func:`render` turns :func:`pprobe.report.collect`'s data
into one self-contained page.

Charts are hand-written SVG made here, not a charting library: the data is already
aggregated to a few thousand marks at most, so the page needs no script to draw, nothing is
vendored or fetched, and the file opens in any browser (docs/report.md says why). The only
script, inlined, switches the heatmap's metric and marks the page as loaded.
"""

from __future__ import annotations

import datetime
import html
import json
import math
from collections.abc import Iterable
from typing import Any

#: Colour ramp of the heatmap (viridis stops), low to high.
_RAMP = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")
_BAD = "#d62728"
#: pprobe compare's verdicts, coloured like the severities.
_VERDICT = {"fail": "#f8c9c9", "warn": "#fbe7b5", "pass": ""}
_SEVERITY = {
    "high": "#f8c9c9",
    "medium": "#fbe7b5",
    "only A": "#dde3f3",
    "only B": "#dde3f3",
    "low": "#eef6ee",
}

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232b;
background:#fafbfc}
header{background:#1d2b3a;color:#fff;padding:12px 24px}
header h1{font-size:19px;margin:0 0 4px}
header .sub{color:#b9c6d3;font-size:12px;word-break:break-all}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #dde;padding:6px 24px;z-index:2}
nav a{margin-right:14px;color:#2a5db0;text-decoration:none;font-size:13px}
main{padding:8px 24px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:12px 16px;
margin:14px 0}
section h2{font-size:16px;margin:0 0 8px}
section h3{font-size:14px;margin:12px 0 6px}
table{border-collapse:collapse;font-size:12.5px}
th,td{padding:3px 8px;border-bottom:1px solid #eef0f2;text-align:left;vertical-align:top}
th{background:#f4f6f8;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.bar{width:160px}
td.bar span{display:block;height:10px;background:#5b8def;border-radius:2px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.kv{display:grid;grid-template-columns:170px 1fr;gap:2px 12px;font-size:13px}
.kv div:nth-child(odd){color:#5a6570}
.alert{background:#fdecea;border:1px solid #f5b5ae;color:#7a1c12;border-radius:6px;
padding:10px 14px;margin:14px 0}
.alert a{color:#7a1c12;font-weight:600}
.ok{background:#eaf6ec;border:1px solid #b7dfbf;color:#1f5d2c;border-radius:6px;
padding:8px 14px;margin:14px 0}
.muted{color:#6a737d;font-size:12px}
.src{background:#f6f8fa;border-radius:4px;padding:6px 8px;margin:6px 0;white-space:pre;
overflow-x:auto}
.src .hit{background:#ffe3a3;display:inline-block;min-width:100%}
:target{outline:3px solid #f0a020;outline-offset:3px}
.btn{border:1px solid #c8ced6;background:#fff;border-radius:4px;padding:2px 10px;cursor:pointer;
font-size:12px}
.btn.on{background:#1d2b3a;color:#fff}
.meter{height:14px;background:#eef0f2;border-radius:7px;overflow:hidden;max-width:500px}
.meter span{display:block;height:100%;background:#5b8def}
svg text{font:10px system-ui,sans-serif;fill:#444}
"""

_JS = """
(function(){
  var errs=[];
  window.addEventListener('error',function(e){errs.push(String(e.message));
    document.body.setAttribute('data-errors',errs.join(' | '));});
  function metric(m){
    document.querySelectorAll('#heatmap rect[data-a]').forEach(function(r){
      r.setAttribute('fill',r.getAttribute(m==='std'?'data-s':'data-a'));});
    document.querySelectorAll('#heatmap .btn').forEach(function(b){
      b.classList.toggle('on',b.getAttribute('data-m')===m);});
    var l=document.getElementById('hm-legend');
    if(l){l.textContent=l.getAttribute(m==='std'?'data-s':'data-a');}
  }
  document.querySelectorAll('#heatmap .btn').forEach(function(b){
    b.addEventListener('click',function(){metric(b.getAttribute('data-m'));});});
  if(location.hash==='#std'){metric('std');}  // a link can open the std view
  document.body.setAttribute('data-ready',performance.now().toFixed(1));
})();
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    for unit, div in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= div:
            return f"{ns / div:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def fmt_num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def _td(v: Any, num: bool = False, raw: bool = False) -> str:
    text = v if raw else _e(v)
    return f'<td class="n">{text}</td>' if num else f"<td>{text}</td>"


def _bar(frac: float) -> str:
    return f'<td class="bar"><span style="width:{max(0.0, min(1.0, frac)) * 100:.1f}%"></span></td>'


def _colour(frac: float) -> str:
    """A colour of the ramp at ``frac`` in [0, 1] (linear between its stops)."""
    f = max(0.0, min(1.0, frac)) * (len(_RAMP) - 1)
    i = min(int(f), len(_RAMP) - 2)
    t = f - i
    a, b = _RAMP[i], _RAMP[i + 1]
    rgb = [round(int(a[k : k + 2], 16) * (1 - t) + int(b[k : k + 2], 16) * t) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


# ------------------------------------------------------------------ sections
def _overview(d: dict[str, Any]) -> str:
    o = d["overview"]
    ex = o.get("exit") or {}
    state = o["state"] if o["state"] != "ended" else f"ended: {ex.get('status')}"
    if ex.get("code") not in (None, 0):
        state += f" (code {ex.get('code')})"
    if o.get("state_reason"):
        state += f" - {o['state_reason']}"
    start = (
        datetime.datetime.fromtimestamp(o["start"], datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
        if isinstance(o.get("start"), (int, float))
        else "-"
    )
    versions = ", ".join(f"{k} {v}" for k, v in (o.get("versions") or {}).items() if v)
    span = (o["last_ns"] - o["first_ns"]) if o.get("first_ns") is not None else None
    items = [
        ("run", o["run_id"]),
        ("command", " ".join(map(str, o["argv"]))),
        ("status", state),
        ("started", start),
        ("duration", f"{o['duration_s']:.3f} s" if o.get("duration_s") is not None else "-"),
        ("host", o.get("host")),
        ("mode / engine", f"{o.get('mode')} / {o.get('core')} (coverage {o.get('coverage')})"),
        ("versions", versions),
        (
            "op rows",
            f"{o['op_rows']:,} ({o['distinct_ops']:,} distinct ops, {o['raised']:,} raised)",
        ),
        ("tensor rows", f"{o['tensor_rows']:,}"),
        ("time in ops", f"{fmt_ns(o['op_ns'])} of {fmt_ns(span)} between the first and last op"),
        ("processes / ranks", f"{o['processes']} / {o['ranks'] or '-'}"),
        ("steps", f"{o['steps']:,} ({o['step_min']} to {o['step_max']})"),
        ("frameworks", o.get("frameworks") or "-"),
        ("filters", ", ".join(f"{k}={v}" for k, v in o["filters"].items()) or "none"),
        ("rows dropped", f"{o['rows_dropped']:,}"),
        ("unprobed children", o["skipped_children"]),
    ]
    kv = "".join(f"<div>{_e(k)}</div><div>{_e(v)}</div>" for k, v in items)
    errs = ""
    if o["errors"]:
        errs = "<h3>pprobe's own errors</h3>" + _table(
            ("message", "count"),
            ([_td(e["message"]), _td(e["count"], True)] for e in o["errors"]),
        )
    empty = (
        '<p class="alert">This run recorded no op rows: nothing below has data.</p>'
        if not o["op_rows"]
        else ""
    )
    return (
        f'<section id="overview"><h2>Run overview</h2>{empty}'
        f'<div class="kv">{kv}</div>{errs}</section>'
    )


def _by(d: dict[str, Any], which: str, title: str, label: str) -> str:
    by = d[which]
    rows = by["rows"]
    total = max((r["total_ns"] or 0 for r in rows), default=0) or 1
    body = (
        [
            _td(r["name"] if r["name"] != "" else "(outside any module)", raw=False),
            _td(f"{r['calls']:,}", True),
            _td(fmt_ns(r["total_ns"]), True),
            _td(fmt_ns((r["total_ns"] or 0) / max(1, r["calls"])), True),
            _bar((r["total_ns"] or 0) / total),
        ]
        for r in rows
    )
    more = (
        f'<p class="muted">The {len(rows)} {label}s with the most time of {by["keys"]:,}.</p>'
        if by["keys"] > len(rows)
        else ""
    )
    content = (
        _table((label, "calls", "total time", "mean", "time"), body) if rows else "<p>No rows.</p>"
    )
    return f'<section id="{which}"><h2>{title}</h2>{more}{content}</section>'


def _steps_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _bars_svg(
    bins: list[dict[str, Any]], nbins: int, key: str, title: str, fmt: Any, bad: bool
) -> str:
    w, h, left, top = 900, 110, 70, 16
    bw = (w - left) / max(1, nbins)
    vmax = max((b[key] or 0 for b in bins), default=0) or 1
    parts = [
        f'<text x="0" y="11">{_e(title)}</text>',
        f'<text x="0" y="{top + 10}">{_e(fmt(vmax))}</text>',
    ]
    for b in bins:
        v = b[key] or 0
        bh = (h - top) * v / vmax
        x = left + b["bin"] * bw
        tip = (
            f"step {_steps_label(b['step_lo'], b['step_hi'])}: {b['calls']:,} calls, "
            f"op time {fmt_ns(b['op_ns'])}, wall {fmt_ns(b['wall_ns'])}, "
            f"{b['bad_calls']:,} calls with NaN/inf outputs"
        )
        colour = _BAD if bad and b["bad_calls"] else "#5b8def"
        parts.append(
            f'<rect x="{x:.1f}" y="{top + (h - top) - bh:.1f}" width="{max(bw - 0.6, 0.8):.1f}" '
            f'height="{max(bh, 0.5):.1f}" fill="{colour}"><title>{_e(tip)}</title></rect>'
        )
    parts.append(f'<line x1="{left}" y1="{h}" x2="{w}" y2="{h}" stroke="#999"/>')
    return (
        f'<svg width="{w}" height="{h + 4}" viewBox="0 0 {w} {h + 4}" role="img">'
        f"{''.join(parts)}</svg>"
    )


def _timeline(d: dict[str, Any]) -> str:
    t = d["timeline"]
    bins = t["bins"]
    if not bins:
        return '<section id="timeline"><h2>Step timeline</h2><p>No rows.</p></section>'
    nbins = (t["step_max"] - t["step_min"]) // t["width"] + 1
    per = f"bins of {t['width']} steps" if t["width"] > 1 else "one bar per step"
    axis_w, left = 900, 70
    bw = (axis_w - left) / nbins
    labels = "".join(
        f'<text x="{left + i * bw:.1f}" y="10">{t["step_min"] + i * t["width"]}</text>'
        for i in sorted({0, nbins // 2, nbins - 1})
    )
    axis = (
        f'<svg width="{axis_w}" height="14" role="img"><text x="0" y="10">step</text>{labels}</svg>'
    )
    return (
        f'<section id="timeline"><h2>Step timeline</h2><p class="muted">{per}; red: the step '
        "had ops whose outputs hold NaN or inf. Hover a bar for its figures.</p>"
        + _bars_svg(bins, nbins, "calls", "calls", lambda v: f"{v:,.0f}", True)
        + _bars_svg(bins, nbins, "op_ns", "time in ops", fmt_ns, True)
        + _bars_svg(bins, nbins, "wall_ns", "wall span", fmt_ns, False)
        + axis
        + "</section>"
    )


def _heatmap(d: dict[str, Any]) -> str:
    hm = d["heatmap"]
    if not hm["cells"]:
        return (
            '<section id="heatmap"><h2>Value ranges</h2><p>No output statistics in this run '
            "(log mode records none: PPROBE_MODE=stats or dump).</p></section>"
        )
    names, nb = hm["names"], hm["bins"]
    label_w, rh = 300, 14
    cw = max(3.0, min(40.0, 760 / nb))
    w = label_w + cw * nb + 60
    h = rh * len(names) + 20

    def scale(vals: list[float]) -> tuple[float, float]:
        logs = [math.log10(v) for v in vals if v is not None and v > 0 and math.isfinite(v)]
        return (min(logs), max(logs)) if logs else (0.0, 1.0)

    a_lo, a_hi = scale([c[2] for c in hm["cells"]])
    s_lo, s_hi = scale([c[3] for c in hm["cells"]])

    def colour(v: float | None, lo: float, hi: float) -> str:
        if v is None or not math.isfinite(v):
            return "#dcdcdc"
        if v <= 0:
            return _RAMP[0]
        return _colour((math.log10(v) - lo) / (hi - lo) if hi > lo else 0.5)

    parts = []
    for i, n in enumerate(names):
        shown = n if len(n) <= 46 else "..." + n[-43:]
        parts.append(
            f'<text x="{label_w - 4}" y="{i * rh + 11}" text-anchor="end">{_e(shown)}'
            f"<title>{_e(n)}</title></text>"
        )
    parts.append(
        f'<rect x="{label_w}" y="0" width="{cw * nb:.1f}" height="{rh * len(names)}" '
        'fill="#f3f4f6"/>'
    )
    bad_cells = 0
    for row, b, amax, std, nan, inf in hm["cells"]:
        x, y = label_w + b * cw, row * rh
        lo = hm["step_min"] + b * hm["width"]
        steps = _steps_label(lo, lo + hm["width"] - 1)
        tip = (
            f"{names[row]} | step {steps}\nmax |x| {fmt_num(amax)}, std {fmt_num(std)}"
            f"\nNaN {nan:,}, inf {inf:,}"
        )
        fa, fs = colour(amax, a_lo, a_hi), colour(std, s_lo, s_hi)
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{max(cw - 0.5, 1):.1f}" height="{rh - 1}" '
            f'fill="{fa}" data-a="{fa}" data-s="{fs}"><title>{_e(tip)}</title></rect>'
        )
        if nan or inf:
            bad_cells += 1
            parts.append(
                f'<rect class="bad" x="{x + 0.5:.1f}" y="{y + 0.5}" width="{max(cw - 1.5, 1):.1f}" '
                f'height="{rh - 2}" fill="none" stroke="{_BAD}" stroke-width="2"/>'
                f'<text x="{x + cw / 2:.1f}" y="{y + 10}" text-anchor="middle" '
                f'style="fill:{_BAD};font-weight:700">{"N" if nan else "I"}</text>'
            )
    last = -1e9
    for i in sorted({0, nb // 2, nb - 1}):
        x = label_w + i * cw
        if x - last < 60:  # labels never overlap
            continue
        last = x
        parts.append(
            f'<text x="{x:.1f}" y="{h - 6}">step {hm["step_min"] + i * hm["width"]}</text>'
        )
    svg = (
        f'<svg width="{w:.0f}" height="{h}" viewBox="0 0 {w:.0f} {h}" role="img">'
        f"{''.join(parts)}</svg>"
    )
    legend_a = f"colour: max |x| of outputs, log scale from {10**a_lo:.2g} to {10**a_hi:.2g}"
    legend_s = f"colour: max std of outputs, log scale from {10**s_lo:.2g} to {10**s_hi:.2g}"
    ramp = "".join(
        '<span style="display:inline-block;width:18px;height:10px;'
        f'background:{_colour(i / 9)}"></span>'
        for i in range(10)
    )
    by = "module (torch nn.Module path)" if hm["by"] == "module" else "op"
    more = (
        f" The {len(names)} {hm['by']}s shown of {hm['keys']:,}: those with NaN/inf first, then "
        "the most outputs."
        if hm["keys"] > len(names)
        else ""
    )
    per = f"bins of {hm['width']} steps" if hm["width"] > 1 else "one column per step"
    return (
        '<section id="heatmap"><h2>Value ranges: ' + _e(by) + " x step</h2>"
        f'<p class="muted">Rows in order of first call; {per}. Red frame with N: some output '
        f"held NaN, I: inf ({bad_cells} cells).{more} Statistics are over finite values.</p>"
        '<p><button class="btn on" data-m="absmax">max |x|</button> '
        '<button class="btn" data-m="std">std</button> '
        f'<span class="muted" id="hm-legend" data-a="{_e(legend_a)}" data-s="{_e(legend_s)}">'
        f"{_e(legend_a)}</span> {ramp}</p>"
        f'<div style="overflow-x:auto">{svg}</div></section>'
    )


def _shape(s: Any) -> str:
    return "(" + ", ".join(map(str, s)) + ")" if isinstance(s, (list, tuple)) else str(s)


def _alerts(d: dict[str, Any]) -> str:
    a = d["alerts"]
    f = a["first"]
    if f is None:
        return (
            '<section id="alerts"><h2>NaN / inf</h2><p class="ok">No output holds NaN or inf '
            + (
                "(statistics were recorded)."
                if d["heatmap"]["cells"]
                else "(but this run has no statistics: log mode)."
            )
            + "</p></section>"
        )
    src = ""
    if f.get("source"):
        lines = "\n".join(
            f'<span class="{"hit" if i == f["source"]["line"] else ""}">{i:5d}  {_e(t)}</span>'
            for i, t in f["source"]["lines"]
        )
        src = f'<div class="src mono">{lines}</div>'
    items = [
        ("op", f["op"]),
        ("step", f["step"]),
        ("process / seq", f"{f['pid']} / {f['seq']}"),
        ("rank", f["rank"] if f["rank"] is not None else "-"),
        ("caller", f"{f['caller']} in {f['caller_function']}"),
        ("module", f["module_path"] or "-"),
        ("phase", f["phase"] or "-"),
        ("arguments", f["args"] or "-"),
        (
            "output",
            f"#{f['idx']} {f['dtype']} {_shape(f['shape'])}: "
            f"{f['nan_count']:,} NaN, {f['inf_count']:,} inf",
        ),
        ("dump", f["dump_path"] or "-"),
    ]
    kv = "".join(f"<div>{_e(k)}</div><div>{_e(v)}</div>" for k, v in items)
    clean = all(not (i["nan_count"] or i["inf_count"]) for i in f["inputs"])
    verdict = (
        "Its inputs are finite: this op produced the first NaN/inf."
        if clean and f["inputs"]
        else "Some inputs already hold NaN/inf: they came from outside what was recorded."
        if f["inputs"]
        else "It has no array inputs."
    )
    inputs = _table(
        ("input", "dtype", "shape", "min", "max", "mean", "std", "NaN", "inf", "dump"),
        (
            [
                _td(i["idx"]),
                _td(i["dtype"]),
                _td(_shape(i["shape"])),
                *(
                    _td(fmt_num(i[k]), True)
                    for k in ("min", "max", "mean", "std", "nan_count", "inf_count")
                ),
                _td(i["dump_path"] or "-"),
            ]
            for i in f["inputs"]
        ),
    )
    by_op = _table(
        ("op", "outputs with NaN/inf", "NaN", "inf", "first step", "first pid / seq"),
        (
            [
                _td(r["op"]),
                _td(f"{r['outputs']:,}", True),
                _td(f"{r['nan']:,}", True),
                _td(f"{r['inf']:,}", True),
                _td(r["first_step"], True),
                _td(f"{r['first_pid']} / {r['first_seq']}", True),
            ]
            for r in a["by_op"]
        ),
    )
    return (
        '<section id="alerts"><h2>NaN / inf</h2>'
        '<div id="first-bad"><h3>First output with NaN or inf</h3>'
        f'<div class="kv">{kv}</div>{src}<p>{_e(verdict)}</p>{inputs}</div>'
        '<p class="muted">pprobe records the first frame outside the frameworks (the caller), '
        "not a full stack.</p>"
        f"<h3>Ops whose outputs held NaN/inf, in order of first appearance</h3>{by_op}</section>"
    )


def _dumps(d: dict[str, Any]) -> str:
    m = d["dumps"]
    if d["overview"].get("mode") != "dump" and not m.get("dumped"):
        return (
            '<section id="dumps"><h2>Dumps and budget</h2><p>No dumps: this run was recorded '
            f"in {_e(d['overview'].get('mode'))} mode.</p></section>"
        )
    budget, used = m.get("budget") or 0, m.get("bytes_written") or 0
    frac = used / budget if budget else 0.0
    items = [
        ("budget", f"{fmt_bytes(used)} written of {fmt_bytes(budget)} ({frac:.1%})"),
        (
            "files / hard links",
            f"{m.get('files')} / {m.get('links')} (a repeated content is a link, free)",
        ),
        ("tensor rows dumped", f"{m['dumped']:,} of {m['dumped'] + m['not_dumped']:,}"),
        ("skipped / failed files", f"{m.get('skipped')} / {m.get('failed_files')}"),
        (
            "budget exhausted",
            "yes: dumping stopped, logging went on" if m.get("exhausted") else "no",
        ),
        ("writer", m.get("writer")),
    ]
    kv = "".join(f"<div>{_e(k)}</div><div>{_e(v)}</div>" for k, v in items)
    notes = _table(
        ("why an array has no dump (numbers as N)", "rows"),
        ([_td(r["note"]), _td(f"{r['n']:,}", True)] for r in m["notes"]),
    )
    top = max((r["files"] for r in m["by_op"]), default=1)
    by_op = _table(
        ("op", "dumped arrays", ""),
        ([_td(r["op"]), _td(f"{r['files']:,}", True), _bar(r["files"] / top)] for r in m["by_op"]),
    )
    return (
        '<section id="dumps"><h2>Dumps and budget</h2>'
        f'<div class="meter" title="{frac:.1%} of the budget">'
        f'<span style="width:{min(frac, 1) * 100:.1f}%"></span></div>'
        f'<div class="kv" style="margin-top:8px">{kv}</div>'
        '<div style="display:flex;gap:24px;flex-wrap:wrap;margin-top:8px">'
        f"<div>{by_op}</div><div>{notes}</div></div>"
        "</section>"
    )


def _compare(d: dict[str, Any]) -> str:
    c = d.get("compare")
    if c is None:
        return ""
    if c["kind"] == "saved":
        cols = c["columns"]
        sev = cols.index("severity") if "severity" in cols else None
        ver = cols.index("verdict") if "verdict" in cols else None
        first_i = cols.index("first_divergence") if "first_divergence" in cols else None
        rows = []
        first_html = ""
        for r in c["rows"]:
            if sev is not None:
                bg = _SEVERITY.get(str(r[sev]), "")
            else:
                bg = _VERDICT.get(str(r[ver]), "") if ver is not None else ""
            cells = "".join(_td(fmt_num(v), isinstance(v, (int, float))) for v in r)
            rows.append(f'<tr style="background:{bg}">{cells}</tr>')
            if first_i is not None and r[first_i] and not first_html:
                f = dict(zip(cols, r))
                first_html = (
                    f'<p class="alert">First divergence: {_e(f.get("op"))} at step '
                    f"{_e(f.get('step'))} (process {_e(f.get('process'))}, module "
                    f"{_e(f.get('module_path') or '-')}, {_e(f.get('caller') or '-')}): "
                    f"{_e(f.get('reason') or f.get('tensor_verdict') or '')}.</p>"
                )
        head = "".join(f"<th>{_e(x)}</th>" for x in cols)
        counts = ", ".join(f"{n:,} {k}" for k, n in sorted(c.get("verdicts", {}).items()))
        return (
            f'<section id="compare"><h2>Compare</h2><p class="muted">From {_e(c["source"])}: '
            f"{len(c['rows'])} of {c['total']:,} rows"
            + (f" ({_e(counts)}; first divergence and worst pairs first)" if counts else "")
            + f".</p>{first_html}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
        )
    counts = c["counts"]
    summary = ", ".join(
        f"{counts[k]:,} {k}"
        for k in ("high", "medium", "low", "equal", "only A", "only B")
        if counts.get(k)
    )
    first = c["first"]
    first_html = (
        f'<p class="alert">First divergence: {_e(first["op"])} at step {first["step"]} '
        f"(process #{first['proc']}, seq {first['seq_a']}, "
        f"module {_e(first['module_path'] or '-')}, "
        f"output {_e(first['idx'])}): relative difference {fmt_num(first['score'])}.</p>"
        if first
        else '<p class="ok">No output differs by more than the medium threshold.</p>'
    )
    cols_ = (
        "severity",
        "step",
        "module",
        "op",
        "occ",
        "out",
        "mean A",
        "mean B",
        "std A",
        "std B",
        "max A",
        "max B",
        "rel. diff",
    )
    trs: list[str] = []
    for r in c["rows"]:
        tds = [
            _td(r["severity"]),
            _td(r["step"], True),
            _td(r["module_path"] or "-"),
            _td(r["op"]),
            _td(r["occ"], True),
            _td(r["idx"]),
            *(
                _td(fmt_num(r[k]), True)
                for k in ("mean_a", "mean_b", "std_a", "std_b", "max_a", "max_b", "score")
            ),
        ]
        trs.append(f'<tr style="background:{_SEVERITY.get(r["severity"], "")}">{"".join(tds)}</tr>')
    th = c["thresholds"]
    return (
        '<section id="compare"><h2>Compare with ' + _e(c["other"]) + "</h2>"
        f'<p class="muted">Outputs aligned on (process order, step, module, op, occurrence, output '
        f"index). Relative difference: the largest of |a-b|/max(|a|,|b|) over std and max, "
        f"and of |a-b|/max(|a|,|b|,std) for the mean. "
        f"high: above {th['high']} or NaN/inf counts differ; medium: above {th['medium']}. "
        f"{_e(summary)}.</p>{first_html}"
        + "<table><thead><tr>"
        + "".join(f"<th>{_e(x)}</th>" for x in cols_)
        + f"</tr></thead><tbody>{''.join(trs)}</tbody></table></section>"
    )


def render(data: dict[str, Any]) -> str:
    """The page: every section, the inlined style and script, and the data's size bound."""
    o = data["overview"]
    alert = ""
    f = data["alerts"]["first"]
    if f is not None:
        alert = (
            f'<div class="alert">NaN/inf: first in <b>{_e(f["op"])}</b> at step {f["step"]} '
            f'({_e(f["caller"])}). <a href="#first-bad">Jump to the origin</a></div>'
        )
    sections = [
        _overview(data),
        _by(data, "by_op", "Ops: calls and time", "op"),
        _by(data, "by_module", "Modules: calls and time", "module"),
        _timeline(data),
        _heatmap(data),
        _alerts(data),
        _dumps(data),
        _compare(data),
    ]
    nav = "".join(
        f'<a href="#{i}">{t}</a>'
        for i, t in (
            ("overview", "Overview"),
            ("by_op", "Ops"),
            ("by_module", "Modules"),
            ("timeline", "Timeline"),
            ("heatmap", "Value ranges"),
            ("alerts", "NaN/inf"),
            ("dumps", "Dumps"),
        )
        + ((("compare", "Compare"),) if data.get("compare") else ())
    )
    title = f"pprobe report: {o['run_id']}"
    gen = json.dumps({"collect_s": data.get("collect_s")})
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Nothing is ever fetched: the browser refuses any request (and says so on its console).
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<style>{_CSS}</style></head><body>"
        f'<header><h1>{_e(title)}</h1><div class="sub">{_e(data["run_dir"])}</div></header>'
        f"<nav>{nav}</nav><main>{alert}{''.join(sections)}</main>"
        f'<script type="application/json" id="pprobe-meta">{_e(gen)}</script>'
        f"<script>{_JS}</script></body></html>\n"
    )
