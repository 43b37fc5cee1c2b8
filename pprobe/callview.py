"""One recorded call: ``pprobe show SEQ|PREFIX``, ``pprobe.show(...)`` and the look-ups of
``pprobe.load(...)``.

A call is named by its ``seq`` (unique within a process), by its dump prefix ``{pid}-{seq}``
(docs/output.md), or by the name of one of its dump files. :func:`find_call` reads its
``ops`` row and its ``tensors`` rows; :class:`Call` renders them as text, JSON or, in Jupyter,
an HTML table (``_repr_html_``), with a one-line summary of each array and a few of its
dumped values.
"""

from __future__ import annotations

import argparse
import html
import linecache
import os
import re
from dataclasses import dataclass, field
from typing import Any

_PREFIX = re.compile(r"^(\d+)-(\d+)$")
_DUMP_NAME = re.compile(r"_(\d+)-(\d+)(?:\.[A-Za-z0-9_]+)?\.npy(?:\.[a-z0-9_]+)?$")
#: Values shown in an array's one-line summary.
FEW = 6


class NotFound(LookupError):
    """No such call (or array) in the run; the message says what the run has."""


def parse_key(key: Any) -> tuple[int | None, int]:
    """(pid or None, seq) from 17, "17", "4242-17" or a dump file name. Raises ValueError."""
    if isinstance(key, bool):
        raise ValueError(f"{key!r} is not a seq or a dump prefix")
    if isinstance(key, int):
        return None, key
    s = str(key).strip()
    if s.isdigit():
        return None, int(s)
    m = _PREFIX.match(s) or _DUMP_NAME.search(os.path.basename(s))
    if m:
        return int(m.group(1)), int(m.group(2))
    raise ValueError(f"{key!r} is not a seq (17), a dump prefix (4242-17) or a dump file name")


@dataclass
class Call:
    """One call: its ``ops`` row, its ``tensors`` rows, the run folder and the caller's line."""

    run_dir: str
    row: dict[str, Any]
    arrays: list[dict[str, Any]]
    source: str | None = None
    values: bool = False
    _loaded: dict[int, Any] = field(default_factory=dict, repr=False)

    @property
    def prefix(self) -> str:
        return f"{self.row['pid']}-{self.row['seq']}"

    def array(self, i: int) -> Any:
        """The i-th array's dump as a NumPy array (torch dtypes as float32), or None."""
        if i not in self._loaded:
            a = self.arrays[i]
            self._loaded[i] = None
            if a.get("dump_path"):
                try:
                    self._loaded[i] = _as_numpy(
                        load_path(os.path.join(self.run_dir, a["dump_path"]))
                    )
                except (OSError, ValueError, ImportError):
                    pass
        return self._loaded[i]

    def dump_path(self, role: str = "output", idx: str | int | None = None) -> str:
        """The dump file of ``role`` (input/output) at ``idx`` (default: the first one)."""
        for a in self.arrays:
            if a["role"] == role and (idx is None or str(a["idx"]) == str(idx)):
                if not a.get("dump_path"):
                    why = a.get("note") or "the run did not dump it (mode log or stats?)"
                    raise NotFound(f"{role} {a['idx']} of call {self.prefix} has no dump: {why}")
                return os.path.join(self.run_dir, a["dump_path"])
        have = ", ".join(f"{a['role']} {a['idx']}" for a in self.arrays) or "no arrays"
        want = f"{role} {idx}" if idx is not None else role
        raise NotFound(f"call {self.prefix} has no {want} (it has {have})")

    def load(self, role: str = "output", idx: str | int | None = None) -> Any:
        """The dumped array of ``role`` (input/output) at ``idx`` (default: the first)."""
        return load_path(self.dump_path(role, idx))

    # ------------------------------------------------------------------ summaries
    def summary_line(self, i: int) -> str:
        """shape, dtype, device, min/max/mean/std, NaN/inf and a few values: one line."""
        a = self.arrays[i]
        shape = "[" + ", ".join(str(x) for x in (a.get("shape") or [])) + "]"
        parts = [f"{a.get('dtype')}{shape}", str(a.get("device") or "-")]
        if a.get("min") is not None:
            parts.append(
                f"min {_g(a['min'])} max {_g(a['max'])} mean {_g(a['mean'])} std {_g(a['std'])}"
            )
        if a.get("nan_count") is not None:
            bad = []
            if a["nan_count"]:
                bad.append(f"{a['nan_count']} NaN")
            if a.get("inf_count"):
                bad.append(f"{a['inf_count']} inf")
            parts.append(", ".join(bad) + "!" if bad else "finite")
        arr = self.array(i)
        if arr is not None:
            parts.append(few_values(arr))
        return "  ".join(parts)

    def to_json(self) -> dict[str, Any]:
        arrays: list[dict[str, Any]] = []
        out: dict[str, Any] = {
            "run_dir": self.run_dir,
            "prefix": self.prefix,
            "row": self.row,
            "source": self.source,
            "arrays": arrays,
        }
        for i, a in enumerate(self.arrays):
            d = dict(a)
            arr = self.array(i)
            if arr is not None:
                flat = arr.reshape(-1)
                n = flat.size if self.values else min(flat.size, FEW)
                d["values"] = flat[:n].tolist()
                d["values_shown"] = int(n)
            arrays.append(d)
        return out

    def doc(self) -> Any:
        from .textout import Doc

        r = self.row
        doc = Doc()
        doc.title(f"{r['op']}  seq {r['seq']}  pid {r['pid']}  (prefix {self.prefix})")
        kv = [
            ("kind", str(r.get("kind")) + (f" (ufunc {r['ufunc']})" if r.get("ufunc") else "")),
            ("status", str(r.get("status"))),
            ("caller", f"{r.get('caller')} in {r.get('caller_function')}"),
        ]
        if self.source is not None:
            kv.append(("source", self.source))
        kv += [
            ("args", str(r.get("args") or "-")),
            ("step", str(r.get("step"))),
            ("duration", _dur(r.get("dur_ns"))),
            ("thread", str(r.get("thread"))),
        ]
        for k in ("rank", "module_path", "phase", "parent"):
            if r.get(k) is not None:
                kv.append((k, str(r[k])))
        doc.kv(kv)
        for i, a in enumerate(self.arrays):
            doc.text(f"{a['role']} {a['idx']}: {self.summary_line(i)}")
            sub = []
            if a.get("dump_path"):
                sub.append(("dump", os.path.join(self.run_dir, a["dump_path"])))
                codec = a.get("dump_codec")
                if codec and codec != "npy":  # stored with a codec (docs/codecs.md)
                    err = a.get("dump_max_abs_error")
                    sub.append(("codec", codec + (f", max abs error {err:.3g}" if err else "")))
            if a.get("note"):
                sub.append(("note", str(a["note"])))
            if sub:
                doc.kv(sub)
            if self.values:
                arr = self.array(i)
                if arr is not None:
                    doc.text(_indent(full_values(arr)))
        if not self.arrays:
            doc.text("(no array inputs or outputs)")
        return doc

    def __str__(self) -> str:
        return self.doc().plain()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = html.escape
        r = self.row
        head = "".join(
            f"<tr><th style='text-align:left'>{e(str(k))}</th>"
            f"<td style='text-align:left'>{e(str(v))}</td></tr>"
            for k, v in r.items()
            if v is not None
        )
        if self.source is not None:
            head += (
                "<tr><th style='text-align:left'>source</th>"
                f"<td><code>{e(self.source)}</code></td></tr>"
            )
        cols = ["role", "idx", "shape", "dtype", "device", "min", "max", "mean", "std"]
        cols += ["nan_count", "inf_count", "values", "dump_path", "note"]
        body = ""
        for i, a in enumerate(self.arrays):
            arr = self.array(i)
            vals = few_values(arr) if arr is not None else ""
            cells = [a.get(c) if c != "values" else vals for c in cols]
            body += (
                "<tr>"
                + "".join(f"<td style='text-align:left'>{e(_cell(v))}</td>" for v in cells)
                + "</tr>"
            )
        return (
            f"<div><b>{e(str(r['op']))}</b> seq {r['seq']} pid {r['pid']} "
            f"(prefix {e(self.prefix)})<table>{head}</table>"
            "<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in cols) + f"</tr>{body}</table></div>"
        )


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return _g(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.6g}"


def _dur(ns: Any) -> str:
    from .textout import fmt_seconds

    return fmt_seconds(ns / 1e9) if isinstance(ns, int) else "-"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _as_numpy(a: Any) -> Any:
    """A torch tensor (a dump of a dtype NumPy lacks) as a float32 NumPy array."""
    if hasattr(a, "detach"):
        return a.detach().float().numpy()
    return a


def few_values(arr: Any) -> str:
    """``[1, 2.5, ...]``: the first :data:`FEW` values in C order."""
    import numpy as np

    flat = np.asarray(arr).reshape(-1)
    vals = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:FEW].tolist()]
    return "[" + ", ".join(vals + (["..."] if flat.size > FEW else [])) + "]"


def full_values(arr: Any, threshold: int = 1000) -> str:
    """The array as NumPy prints it, summarised past ``threshold`` values."""
    import numpy as np

    return np.array2string(np.asarray(arr), threshold=threshold, edgeitems=5, separator=", ")


def load_path(path: str, torch: bool | None = None) -> Any:
    """A dump file as the array it was (``pprobe.load`` on a path)."""
    import pprobe

    return pprobe._load_file(path, torch)


# ------------------------------------------------------------------------------- look-up
def find_call(
    key: Any, run: str | None = None, pid: int | None = None, values: bool = False
) -> Call:
    """The call ``key`` (seq, prefix or dump file name) of the run. Raises :class:`NotFound`
    (no such call, or a seq that several processes have: pass ``pid``) or ValueError."""
    from .query import connect
    from .run import resolve_run_dir

    kpid, seq = parse_key(key)
    if kpid is not None and pid is not None and kpid != pid:
        raise ValueError(f"prefix {key} names pid {kpid}, not --pid {pid}")
    pid = kpid if kpid is not None else pid
    run_dir = resolve_run_dir(run)
    con = connect(run_dir)
    try:
        where = "seq = ?" + (" AND pid = ?" if pid is not None else "")
        params = [seq] + ([pid] if pid is not None else [])
        cur = con.execute(f"SELECT * FROM ops WHERE {where} ORDER BY pid", params)
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        if not rows:
            span = con.execute(
                "SELECT count(*), min(seq), max(seq) FROM ops"
                + (" WHERE pid = ?" if pid is not None else ""),
                [pid] if pid is not None else [],
            ).fetchall()[0]
            who = f"process {pid}" if pid is not None else "the run"
            have = (
                f"{who} has {span[0]} calls, seq {span[1]}..{span[2]}"
                + (", with gaps" if span[0] != span[2] - span[1] + 1 else "")
                if span and span[0]
                else f"{who} recorded no calls"
            )
            raise NotFound(f"no call with seq {seq} in {run_dir} ({have})")
        if len(rows) > 1:
            pids = ", ".join(str(r["pid"]) for r in rows)
            raise NotFound(
                f"seq {seq} is a call of several processes ({pids}): give --pid, or the "
                f"prefix PID-{seq}"
            )
        row = rows[0]
        cur = con.execute(
            "SELECT * FROM tensors WHERE pid = ? AND seq = ? "
            "ORDER BY role <> 'input', length(idx), idx",
            [row["pid"], seq],
        )
        tcols = [d[0] for d in cur.description]
        arrays = [dict(zip(tcols, r)) for r in cur.fetchall()]
    finally:
        con.close()
    return Call(run_dir, row, arrays, source_line(row.get("caller")), values)


def source_line(caller: str | None) -> str | None:
    """The source line at ``file:line``, stripped, where the file can be read."""
    if not caller or ":" not in caller:
        return None
    path, _, line = caller.rpartition(":")
    if not line.isdigit():
        return None
    text = linecache.getline(path, int(line)).strip()
    return text or None


def show(key: Any, run: str | None = None, pid: int | None = None, values: bool = False) -> Call:
    """``pprobe.show(17)``: the call as :class:`Call` (text when printed, a table in Jupyter)."""
    return find_call(key, run, pid, values)


def load(
    what: Any,
    run: str | None = None,
    *,
    role: str = "output",
    idx: str | int | None = None,
    pid: int | None = None,
    torch: bool | None = None,
) -> Any:
    """``pprobe.load``: a dump from a path, a ``tensors`` row (a mapping with ``dump_path``),
    or a call's seq/prefix (its first output, or ``role``/``idx``)."""
    if isinstance(what, os.PathLike) or (
        isinstance(what, str) and (what.endswith(".npy") or os.path.isfile(what))
    ):
        path = os.fspath(what)
        if not os.path.isabs(path) and not os.path.exists(path) and run is not None:
            from .run import resolve_run_dir

            path = os.path.join(resolve_run_dir(run), path)
        return load_path(path, torch)
    row = _as_row(what)
    if row is not None:
        if not row.get("dump_path"):
            why = row.get("note") or "the run did not dump it (mode log or stats?)"
            raise NotFound(f"this tensors row has no dump: {why}")
        return load_path(os.path.join(_row_run_dir(row, run), row["dump_path"]), torch)
    return load_path(find_call(what, run, pid).dump_path(role, idx), torch)


def _as_row(what: Any) -> dict[str, Any] | None:
    """A tensors row given as a dict, a pandas Series or a named tuple; else None."""
    if isinstance(what, dict):
        return what if "dump_path" in what else None
    if hasattr(what, "_asdict"):
        d = what._asdict()
        return d if "dump_path" in d else None
    if hasattr(what, "to_dict") and hasattr(what, "index"):
        d = what.to_dict()
        return d if isinstance(d, dict) and "dump_path" in d else None
    return None


def _row_run_dir(row: dict[str, Any], run: str | None) -> str:
    """The run folder of a tensors row: ``run``, else the latest run, or the folder named by
    the row's run_id beside it."""
    from .run import resolve_run_dir

    d = resolve_run_dir(run)
    rid = row.get("run_id")
    if rid and os.path.basename(d) != rid:
        sib = os.path.join(os.path.dirname(d), str(rid))
        if os.path.isdir(sib):
            return sib
    return d


def main(args: argparse.Namespace) -> int:
    from .see_cli import UsageError, _json_out

    try:
        call = find_call(args.key, args.run, args.pid, args.values)
    except (ValueError, NotFound) as e:
        raise UsageError(str(e)) from None
    if args.format == "json":
        _json_out(call.to_json())
    else:
        call.doc().print()
    return 0
