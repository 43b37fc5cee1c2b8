"""What the "see a run" commands print: a :class:`Doc` of titled blocks, rendered as rich text
on a terminal and as plain, stable text when piped (tests compare that text).

Only the command line imports this module (and rich, lazily, on a terminal).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import IO, Any


def fmt_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, as PPROBE_BUDGET takes them)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1023.95 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(s: float | None) -> str:
    """0.0123 -> '12.3 ms', 75 -> '1m15s'."""
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 60:
        return f"{s:.2f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def fmt_num(v: Any) -> str:
    """A cell: floats with 6 significant digits, None as '-'."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    #: columns aligned right (numbers)
    right: set[int] = field(default_factory=set)
    empty: str = "(none)"


@dataclass
class Doc:
    """Blocks, in order: ("title", str), ("kv", [(key, value)]), ("text", str), Table."""

    blocks: list[Any] = field(default_factory=list)

    def title(self, text: str) -> None:
        self.blocks.append(("title", text))

    def kv(self, pairs: list[tuple[str, str]]) -> None:
        self.blocks.append(("kv", pairs))

    def text(self, text: str) -> None:
        self.blocks.append(("text", text))

    def bullets(self, title: str, items: list[str], empty: str = "(none)") -> None:
        self.blocks.append(("title", f"{title}:"))
        self.blocks += [("text", f"  - {x}") for x in items] or [("text", f"  {empty}")]

    def table(
        self,
        title: str,
        columns: list[str],
        rows: list[list[Any]],
        right: set[int] | None = None,
        empty: str = "(none)",
    ) -> None:
        cells = [[fmt_num(v) for v in r] for r in rows]
        self.blocks.append(Table(title, columns, cells, right or set(), empty))

    # ------------------------------------------------------------------ rendering
    def plain(self) -> str:
        out: list[str] = []
        for b in self.blocks:
            if isinstance(b, Table):
                out.append(f"{b.title}:" if b.title else "")
                if not b.rows:
                    out.append(f"  {b.empty}")
                    continue
                widths = [
                    max([len(c)] + [len(r[i]) for r in b.rows]) for i, c in enumerate(b.columns)
                ]

                def line(vals: list[str], b: Table = b, widths: list[int] = widths) -> str:
                    return (
                        "  "
                        + "  ".join(
                            v.rjust(w) if i in b.right else v.ljust(w)
                            for i, (v, w) in enumerate(zip(vals, widths))
                        ).rstrip()
                    )

                out.append(line(b.columns))
                out += [line(r) for r in b.rows]
            elif b[0] == "title":
                out.append(b[1])
            elif b[0] == "kv":
                w = max((len(k) for k, _ in b[1]), default=0)
                out += [f"  {k.ljust(w)}  {v}" for k, v in b[1]]
            else:
                out.append(b[1])
        return "\n".join(x for x in out if x is not None) + "\n"

    def render_rich(self, file: IO[str]) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table as RTable

        con = Console(file=file, highlight=False)
        for b in self.blocks:
            if isinstance(b, Table):
                t = RTable(title=b.title or None, title_justify="left", title_style="bold")
                for i, c in enumerate(b.columns):
                    t.add_column(c, justify="right" if i in b.right else "left")
                for r in b.rows:
                    t.add_row(*[escape(c) for c in r])
                if b.rows:
                    con.print(t)
                else:
                    con.print(f"[bold]{escape(b.title)}[/bold]: {escape(b.empty)}")
            elif b[0] == "title":
                con.print(f"[bold cyan]{escape(b[1])}[/bold cyan]")
            elif b[0] == "kv":
                t = RTable.grid(padding=(0, 2))
                t.add_column(style="bold")
                t.add_column()
                for k, v in b[1]:
                    t.add_row(escape(k), escape(v))
                con.print(t)
            else:
                con.print(escape(b[1]))

    def html(self) -> str:
        """The blocks as HTML tables (what Jupyter shows for :class:`Shown`)."""
        import html

        e = html.escape
        left = "style='text-align:left'"
        out: list[str] = ["<div class='pprobe'>"]
        for b in self.blocks:
            if isinstance(b, Table):
                out.append(f"<h4>{e(b.title)}</h4>" if b.title else "")
                if not b.rows:
                    out.append(f"<p>{e(b.empty)}</p>")
                    continue
                align = ["right" if i in b.right else "left" for i in range(len(b.columns))]
                head = "".join(
                    f"<th style='text-align:{a}'>{e(c)}</th>" for c, a in zip(b.columns, align)
                )
                body = "".join(
                    "<tr>"
                    + "".join(f"<td style='text-align:{a}'>{e(v)}</td>" for v, a in zip(r, align))
                    + "</tr>"
                    for r in b.rows
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif b[0] == "title":
                out.append(f"<h3>{e(b[1])}</h3>")
            elif b[0] == "kv":
                rows = "".join(
                    f"<tr><th {left}>{e(k)}</th><td {left}>{e(v)}</td></tr>" for k, v in b[1]
                )
                out.append(f"<table>{rows}</table>")
            else:
                out.append(f"<pre>{e(b[1])}</pre>")
        out.append("</div>")
        return "".join(out)

    def print(self, file: IO[str] | None = None) -> None:
        """Rich text on a terminal, plain text otherwise."""
        f = file if file is not None else sys.stdout
        if _isatty(f):
            try:
                self.render_rich(f)
                return
            except ImportError:
                pass
        f.write(self.plain())


def _isatty(f: IO[str]) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False


class Shown:
    """A :class:`Doc` for the Python API: prints as plain text, Jupyter shows HTML tables;
    ``.data`` holds what it shows, as plain data."""

    def __init__(self, doc: Doc, data: Any = None) -> None:
        self.doc = doc
        self.data = data

    def __str__(self) -> str:
        return self.doc.plain()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.doc.html()
