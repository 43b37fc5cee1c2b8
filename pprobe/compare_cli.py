"""``pprobe compare RUN_A RUN_B``: the command line of :mod:`pprobe.compare`.

Prints the first divergence and the worst ops (rich on a terminal, plain text when piped),
writes every aligned pair (``--format csv|json|parquet``), saves a folder that ``pprobe query``
reads as the view ``compare`` (``--save``), and exits 0 (within tolerance), 1 (divergent at
the ``--fail-on`` level) or 2 (usage error).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line's start-up does without NumPy: imported in main()
    from .compare import Comparison, PairResult

PASS, WARN, FAIL = "pass", "warn", "fail"
SEVERITY = {PASS: 0, WARN: 1, FAIL: 2}

#: The file ``--save`` writes, which pprobe.query registers as the view ``compare``.
SAVED = "compare.parquet"


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "compare",
        help="align two runs op by op and find where they diverge",
        description="Compare run B against the reference run A (folders, 'latest' or run "
        "ids under PPROBE_OUTPUT). Exit status: 0 within tolerance, 1 divergent, 2 usage "
        "error. Docs: docs/compare.md",
    )
    c.add_argument("run_a", metavar="RUN_A", help="the reference run")
    c.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    c.add_argument(
        "--map",
        metavar="FILE",
        help="mapping file (TOML or JSON): renamed modules and ops, thresholds per op pattern",
    )
    c.add_argument("--rtol", type=float, help="relative tolerance for every dtype")
    c.add_argument("--atol", type=float, help="absolute tolerance for every dtype")
    c.add_argument(
        "--warn-factor",
        type=float,
        default=10.0,
        help="errors up to this many times the tolerance warn, beyond fail (10)",
    )
    c.add_argument(
        "--fail-on",
        choices=("fail", "warn", "diff"),
        default="fail",
        help="exit 1 on any failing op (default), any warning or unmatched op, "
        "or any difference at all",
    )
    c.add_argument(
        "--format",
        choices=("table", "csv", "json", "parquet"),
        default="table",
        help="table: summary; csv/json/parquet: every aligned tensor pair",
    )
    c.add_argument("-o", "--output", metavar="FILE", help="write --format csv|json|parquet here")
    c.add_argument(
        "--save",
        metavar="DIR",
        help="write a folder that `pprobe query --run DIR` reads as the view compare",
    )
    c.add_argument("--top", type=int, default=10, help="worst ops shown (10)")
    c.add_argument("--threads", type=int, help="threads comparing dumps (default: cores, <= 8)")


def main(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        print("pprobe compare: --format parquet needs -o FILE", file=sys.stderr)
        return 2
    if args.output and args.format == "table":
        print("pprobe compare: -o needs --format csv|json|parquet", file=sys.stderr)
        return 2
    from .compare import CompareError, Settings, compare, load_mapping

    try:
        settings = Settings(args.rtol, args.atol, args.warn_factor)
        if args.map:
            settings.mapping = load_mapping(args.map)
        with _progress() as progress:
            c = compare(args.run_a, args.run_b, settings, progress, args.threads)
        if args.save:
            save(c, args.save)
        if args.format == "table":
            _print_summary(c, args.top)
        else:
            write(c, args.format, args.output)
    except CompareError as e:
        print(f"pprobe compare: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return c.exit_status(args.fail_on) if "c" in locals() else 1
    except OSError as e:
        print(f"pprobe compare: {e}", file=sys.stderr)
        return 2
    return c.exit_status(args.fail_on)


class _progress:
    """A rich progress bar of dump bytes compared, on stderr, only when it is a terminal."""

    def __enter__(self) -> Any:
        self.bar: Any = None
        if not sys.stderr.isatty():
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        self.bar = Progress(
            "comparing dumps",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("compare", total=None)
        return self.update

    def update(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


# ------------------------------------------------------------------ files
def _arrow_table(c: Comparison) -> Any:
    import pyarrow as pa

    from .compare import COLUMNS, rows

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
    }
    schema = pa.schema([(n, types[t]) for n, t in COLUMNS])
    data = list(rows(c))
    cols = [pa.array([r.get(n) for r in data], type=f.type) for n, f in zip(schema.names, schema)]
    return pa.Table.from_arrays(cols, schema=schema)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def write(c: Comparison, fmt: str, path: str | None) -> None:
    """Every aligned tensor pair (and unmatched op) as csv, json or parquet."""
    from .compare import COLUMNS, rows

    if fmt == "parquet":
        import pyarrow.parquet as pq

        assert path is not None
        pq.write_table(_arrow_table(c), path)
        return
    out = open(path, "w", newline="") if path else sys.stdout
    try:
        if fmt == "csv":
            w = csv.writer(out)
            w.writerow([n for n, _ in COLUMNS])
            for r in rows(c):
                w.writerow(["" if r.get(n) is None else r.get(n) for n, _ in COLUMNS])
        else:
            doc = {
                "run_a": c.run_a.dir,
                "run_b": c.run_b.dir,
                "summary": c.counts(),
                "first_divergence": _first_json(c),
                "pairs": [{k: _clean(v) for k, v in r.items()} for r in rows(c)],
            }
            json.dump(doc, out, indent=1)
            out.write("\n")
    finally:
        if path:
            out.close()


def _first_json(c: Comparison) -> dict[str, Any] | None:
    from .compare import source_line

    f = c.first
    if f is None or f.pair.a is None:
        return None
    a = f.pair.a
    return {
        "process": f.pair.group,
        "step": a.step,
        "op": a.op,
        "module_path": a.module,
        "caller": a.caller,
        "source_line": source_line(a.caller),
        "a_seq": a.seq,
        "b_seq": f.pair.b.seq if f.pair.b else None,
        "why": f.origin_reason,
    }


def save(c: Comparison, folder: str) -> None:
    """``folder``/compare.parquet (every row) and meta.json (what was compared): ``pprobe
    query --run folder "SELECT ... FROM compare"`` reads it."""
    import pyarrow.parquet as pq

    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = os.path.join(folder, f".{SAVED}.tmp")
    pq.write_table(_arrow_table(c), tmp)
    os.replace(tmp, os.path.join(folder, SAVED))
    meta = {
        "kind": "compare",
        "run_a": c.run_a.dir,
        "run_b": c.run_b.dir,
        "summary": c.counts(),
        "first_divergence": _first_json(c),
    }
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


# ------------------------------------------------------------------ terminal
_STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", "unmatched": "magenta"}


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _worst_rows(rs: list[PairResult]) -> list[list[str]]:
    out = []
    for r in rs:
        a = r.pair.a
        assert a is not None
        outs = [t for t in r.tensors if t.role == "output"] or r.tensors
        t = max(outs, key=lambda t: (SEVERITY[t.verdict], t.ratio or 0.0))
        el = t.el
        out.append(
            [
                r.verdict,
                r.pair.group,
                "-" if a.step is None else str(a.step),
                a.op,
                a.module or "",
                _short(a.caller),
                _f(el.cosine) if el else "-",
                _f(el.max_abs) if el else "-",
                _f(el.max_rel) if el else "-",
                _f(t.ratio),
                _nonfinite(t),
                t.source,
            ]
        )
    return out


_WORST_COLS = [
    "verdict",
    "process",
    "step",
    "op",
    "module",
    "caller",
    "cosine",
    "max abs",
    "max rel",
    "err/tol",
    "NaN/inf",
    "from",
]


def _nonfinite(t: Any) -> str:
    """Places where NaN/inf differ (dumps), or B's NaN+inf count less A's (statistics)."""
    if t.el is not None:
        return str(t.el.nonfinite_mismatch) if t.el.nonfinite_mismatch else ""
    if t.a is None or t.b is None or t.a.nan is None or t.b.nan is None:
        return ""
    d = (t.b.nan + (t.b.inf or 0)) - (t.a.nan + (t.a.inf or 0))
    return f"{d:+d}" if d else ""


def _short(caller: str | None) -> str:
    """file:line relative to the current folder when the file lies under it."""
    if not caller:
        return ""
    rel = os.path.relpath(caller)
    return caller if rel.startswith("..") else rel


def _summary_lines(c: Comparison) -> tuple[list[str], list[str]]:
    from .compare import source_line

    n = c.counts()
    head = [
        f"A: {c.run_a.dir}",
        f"B: {c.run_b.dir}",
        f"{n['aligned']} ops aligned ({n['key']} by key, {n['lcs']} by sequence alignment, "
        f"{n['mapping']} by the mapping); unmatched: {n['only_a']} only in A, "
        f"{n['only_b']} only in B",
        f"{n['pass']} pass, {n['warn']} warn, {n['fail']} fail; {n['tensors']} tensors, "
        f"{n['dump_bytes'] / 1e6:.1f} MB of dumps compared in {c.seconds:.2f} s",
    ]
    if n["codec_bounded"]:
        head.append(
            f"{n['codec_bounded']} tensor pairs compared within a lossy codec's error bound "
            "(dumps stored with PPROBE_DUMP_CODEC; see the codec_bound column)"
        )
    first: list[str] = []
    f = c.first
    if f is not None and f.pair.a is not None:
        a = f.pair.a
        first = [
            f"First divergence ({f.pair.group}, step {a.step}): {a.op}"
            + (f" in {a.module}" if a.module else ""),
            f"  at {_short(a.caller)}" + (f" ({a.function})" if a.function else ""),
        ]
        line = source_line(a.caller)
        if line:
            first.append(f"    {line}")
        bad = [t for t in f.tensors if t.verdict == FAIL]
        for t in bad[:4]:
            first.append(f"  {t.role} {t.idx}: {t.reason}")
        first.append(f"  where it was born: {f.origin_reason}")
        if len(c.firsts) > 1:
            others = ", ".join(
                f"{g}: {r.pair.a.op} (seq {r.pair.a.seq})"
                for g, r in c.firsts.items()
                if r is not f and r.pair.a is not None
            )
            first.append(f"  other processes: {others}")
    elif n["fail"] == 0:
        first = ["No op fails: B is within tolerance of A."]
    return head, first


def _unmatched(c: Comparison, limit: int = 10) -> list[list[str]]:
    out = []
    for r in c.results:
        if r.verdict != "unmatched":
            continue
        o = r.pair.a or r.pair.b
        assert o is not None
        side = "A" if r.pair.a is not None else "B"
        out.append(
            [side, r.pair.group, str(o.step), str(o.seq), o.op, o.module or "", _short(o.caller)]
        )
    return out[:limit] + (
        [["...", f"{len(out) - limit} more"] + [""] * 5] if len(out) > limit else []
    )


_UNMATCHED_COLS = ["only in", "process", "step", "seq", "op", "module", "caller"]


def _print_summary(c: Comparison, top: int) -> None:
    head, first = _summary_lines(c)
    worst = c.worst(top)
    unmatched = _unmatched(c)
    if not sys.stdout.isatty():
        from .cli import format_table

        print("\n".join(head))
        if first:
            print()
            print("\n".join(first))
        if worst:
            print(f"\nWorst ops ({len(worst)} shown)")
            print(format_table(_WORST_COLS, [tuple(r) for r in _worst_rows(worst)], 0))
        if unmatched:
            print("\nUnmatched ops")
            print(format_table(_UNMATCHED_COLS, [tuple(r) for r in unmatched], 0))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = Console()
    for line in head:
        con.print(line, highlight=False, markup=False)
    if first:
        con.print()
        style = "bold red" if c.first is not None else "green"
        for i, line in enumerate(first):
            con.print(Text(line, style=style if i == 0 else ""))
    if worst:
        t = Table(title=f"Worst ops ({len(worst)} shown)", title_justify="left")
        for col in _WORST_COLS:
            t.add_column(
                col,
                justify="right"
                if col in ("cosine", "max abs", "max rel", "err/tol", "step")
                else "left",
            )
        for r, cells in zip(worst, _worst_rows(worst)):
            t.add_row(*cells, style=_STYLE.get(r.verdict))
        con.print(t)
    if unmatched:
        t = Table(title="Unmatched ops", title_justify="left")
        for col in _UNMATCHED_COLS:
            t.add_column(col)
        for cells in unmatched:
            t.add_row(*cells, style=_STYLE["unmatched"])
        con.print(t)
