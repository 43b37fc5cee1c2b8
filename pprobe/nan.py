"""Where a NaN or inf was born: the analysis behind ``pprobe nan`` and :func:`pprobe.nan_origins`.

Within each process, recorded calls are walked in ``seq`` order, using only the NaN and inf
counts of their tensors (stats and dump modes). A call whose outputs hold a non-finite value
is an *origin* when its inputs held none, and *propagation* when they did (it passed the value
on). Collectives that output a non-finite value are propagation (received from another rank);
a call whose input already held one while nothing recorded before it produced one is an origin
*from outside the log* (data, indexing, Python scalars and other calls pprobe does not record).
Ops of the allowlist (:data:`DEFAULT_ALLOW` and the user's patterns) produce expected infs
(attention masks, ``-inf`` fills): those, and the infs calls carry on from them, are not
origins; a NaN made from them is. docs/nan.md has the whole algorithm and its limits.

Only the rows of calls that touched a non-finite value are read from the log (one query), so
the cost follows the number of such calls, not the size of the run. Imported on demand only.
"""

from __future__ import annotations

import fnmatch
import linecache
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import runs
from .opsets import DEFAULT_ALLOW, UNINITIALISED_RE

#: An inf literal among a call's non-array arguments (``1=-inf``, ``value=inf``).
_INF_ARG = re.compile(r"(?<![\w.])[-+]?inf\b")
_INT_DTYPES = re.compile(r"bool|u?int\d+")
#: Tensor roles that are a call's inputs / outputs (torch module and gradient rows).
_IN_ROLES = ("input", "param")
_OUT_ROLES = ("output", "grad")


class NanError(Exception):
    """The run cannot be checked (no statistics in its log, nothing recorded): one line."""


# ------------------------------------------------------------------ the allowlist
@dataclass(frozen=True)
class Allow:
    """One allowlist entry: a glob over op names, matched like PPROBE_INCLUDE (the full name,
    or the last part for a pattern without a dot); ``mask``: only when the inputs are 0/1."""

    pattern: str
    mask: bool = False

    @classmethod
    def parse(cls, item: str) -> Allow:
        pattern, _, cond = item.partition(":")
        return cls(pattern, cond == "mask")

    def matches(self, op: str) -> bool:
        if fnmatch.fnmatchcase(op, self.pattern):
            return True
        return "." not in self.pattern and fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], self.pattern)

    def __str__(self) -> str:
        return self.pattern + (":mask" if self.mask else "")


def allowlist(extra: Iterable[str] = (), defaults: bool = True) -> tuple[Allow, ...]:
    """The built-in allowlist (unless ``defaults`` is false) and ``extra`` patterns, each
    checked like the PPROBE_NAN_ALLOW setting (raises :class:`pprobe.config.ConfigError`)."""
    from .config import nan_allow_patterns

    items = list(DEFAULT_ALLOW if defaults else ())
    for e in extra:
        items += nan_allow_patterns("--allow", e)
    return tuple(Allow.parse(i) for i in dict.fromkeys(items))


def configured_allow(cwd: str | None = None, env: dict[str, str] | None = None) -> tuple[str, ...]:
    """PPROBE_NAN_ALLOW, else ``nan_allow`` of ./pprobe.toml / pyproject's [tool.pprobe]
    (read alone: another setting's bad value does not stop ``pprobe nan``)."""
    from . import config

    env = dict(os.environ) if env is None else env
    s = config.BY_FIELD["nan_allow"]
    if s.env in env:
        return tuple(s.parse(s.env, env[s.env]))
    raw = config.file_values(cwd, env).get("nan_allow")
    if raw is None:
        return ()
    value, path = raw
    return tuple(s.parse(f"nan_allow (from {path})", value))


# ------------------------------------------------------------------ the calls
@dataclass
class Tensor:
    """One tensor row, as the report shows an origin's inputs and outputs."""

    role: str
    idx: str
    shape: list[int] | None
    dtype: str | None
    device: str | None
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int | None
    inf: int | None
    dump_path: str | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(slots=True)
class Call:
    """One recorded call, reduced to what the walk needs: its tensors' NaN and inf counts
    summed per side (inputs: roles ``input``/``param``; outputs: ``output``/``grad``; tensors
    without statistics do not count) and what :func:`is_mask` asks of its inputs."""

    host: str
    pid: int
    rank: int | None
    seq: int
    ts_ns: int
    op: str
    kind: str
    step: int | None
    caller: str | None
    parent: int | None
    args: str | None
    in_nan: int = 0
    in_inf: int = 0
    out_nan: int = 0
    out_inf: int = 0
    n_in: int = 0  # array inputs with statistics
    in_unit: bool = False  # every one of them lies in [0, 1]
    in_int: bool = False  # ... and has a bool or integer dtype
    in_dumps: tuple[str, ...] = ()  # their dumps (dump mode)

    @classmethod
    def of(cls, tensors: Sequence[Tensor], **fields: Any) -> Call:
        """A call with the counts of ``tensors`` (the in-memory twin of :func:`load_calls`)."""
        c = cls(**fields)
        ins = [t for t in tensors if t.role in _IN_ROLES and t.nan is not None]
        outs = [t for t in tensors if t.role in _OUT_ROLES and t.nan is not None]
        c.in_nan, c.in_inf = sum(t.nan or 0 for t in ins), sum(t.inf or 0 for t in ins)
        c.out_nan, c.out_inf = sum(t.nan or 0 for t in outs), sum(t.inf or 0 for t in outs)
        c.n_in = len(ins)
        c.in_unit = all(
            t.min is not None and t.max is not None and t.min >= 0 and t.max <= 1 for t in ins
        )
        c.in_int = all(bool(t.dtype and _INT_DTYPES.fullmatch(t.dtype)) for t in ins)
        c.in_dumps = tuple(t.dump_path for t in ins if t.dump_path)
        return c


_CALL_COLS = "host pid rank seq ts_ns op kind step caller parent args".split()
_DETAIL_COLS = "status caller_function module_path phase depth".split()
_T_COLS = "role idx shape dtype device min max mean std nan_count inf_count dump_path note".split()
_INS = "t.role IN ('input', 'param') AND t.nan_count IS NOT NULL"
_OUTS = "t.role IN ('output', 'grad') AND t.nan_count IS NOT NULL"


def load_calls(run_dir: str, nan_only: bool = False) -> list[Call]:
    """The recorded calls of the run that have a tensor holding a NaN (or an inf unless
    ``nan_only``), or an inf among their arguments (in-place fills), ordered by process and
    seq: one row per call, its tensors summed up by DuckDB."""
    from .query import run_sql

    bad = "t.nan_count > 0" if nan_only else "(t.nan_count > 0 OR t.inf_count > 0)"
    sql = f"""
        WITH bad AS (
            SELECT t.pid, t.seq FROM tensors t WHERE {bad}
            UNION
            SELECT o.pid, o.seq FROM ops o
            WHERE o.args IS NOT NULL AND regexp_matches(o.args, '(^|[^\\w.])[-+]?inf\\b')
        ),
        agg AS (
            SELECT b.pid, b.seq,
                coalesce(sum(t.nan_count) FILTER (WHERE {_INS}), 0) AS in_nan,
                coalesce(sum(t.inf_count) FILTER (WHERE {_INS}), 0) AS in_inf,
                coalesce(sum(t.nan_count) FILTER (WHERE {_OUTS}), 0) AS out_nan,
                coalesce(sum(t.inf_count) FILTER (WHERE {_OUTS}), 0) AS out_inf,
                count(*) FILTER (WHERE {_INS}) AS n_in,
                coalesce(bool_and(coalesce(t.min >= 0 AND t.max <= 1, false))
                         FILTER (WHERE {_INS}), true) AS in_unit,
                coalesce(bool_and(coalesce(regexp_full_match(t.dtype, 'bool|u?int[0-9]+'),
                                           false)) FILTER (WHERE {_INS}), true) AS in_int,
                list(t.dump_path) FILTER (WHERE {_INS} AND t.dump_path IS NOT NULL) AS dumps
            FROM bad b LEFT JOIN tensors t ON t.pid = b.pid AND t.seq = b.seq
            GROUP BY b.pid, b.seq
        )
        SELECT {", ".join("o." + c for c in _CALL_COLS)}, a.in_nan, a.in_inf, a.out_nan,
               a.out_inf, a.n_in, a.in_unit, a.in_int, a.dumps
        FROM agg a JOIN ops o ON o.pid = a.pid AND o.seq = a.seq
        ORDER BY o.host, o.pid, o.seq
    """
    _cols, rows = run_sql(sql, run_dir)
    return [
        Call(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            r[9],
            r[10],
            int(r[11]),
            int(r[12]),
            int(r[13]),
            int(r[14]),
            r[15],
            r[16],
            r[17],
            tuple(r[18]) if r[18] else (),
        )
        for r in rows
    ]


def load_collectives(run_dir: str) -> list[Call]:
    """Every collective row of the run: in-place collectives have no output row, and what
    they received is seen only in later calls' inputs."""
    from .query import run_sql

    cols = ", ".join(_CALL_COLS)
    _cols, rows = run_sql(
        f"SELECT {cols} FROM ops WHERE kind = 'collective' ORDER BY host, pid, seq", run_dir
    )
    return [Call(**dict(zip(_CALL_COLS, r))) for r in rows]


def load_details(run_dir: str, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """(pid, seq) -> (the call's other columns, its tensors) for the calls a report shows."""
    from .query import run_sql

    keys = sorted(set(keys))
    out: dict[tuple[int, int], Any] = {}
    for i in range(0, len(keys), 5000):
        values = ", ".join(f"({int(p)}, {int(s)})" for p, s in keys[i : i + 5000])
        _cols, rows = run_sql(
            f"""
            WITH k(pid, seq) AS (VALUES {values})
            SELECT o.pid, o.seq, {", ".join("o." + c for c in _DETAIL_COLS)},
                   {", ".join("t." + c for c in _T_COLS)}
            FROM k JOIN ops o ON o.pid = k.pid AND o.seq = k.seq
            LEFT JOIN tensors t ON t.pid = o.pid AND t.seq = o.seq
            ORDER BY o.pid, o.seq, t.role, t.idx
            """,
            run_dir,
        )
        n = 2 + len(_DETAIL_COLS)
        for r in rows:
            key = (r[0], r[1])
            if key not in out:
                out[key] = (dict(zip(_DETAIL_COLS, r[2:n])), [])
            t = dict(zip(_T_COLS, r[n:]))
            if t["role"] is None:  # a call without tensors
                continue
            out[key][1].append(
                Tensor(
                    t["role"],
                    t["idx"],
                    list(t["shape"]) if t["shape"] is not None else None,
                    t["dtype"],
                    t["device"],
                    t["min"],
                    t["max"],
                    t["mean"],
                    t["std"],
                    None if t["nan_count"] is None else int(t["nan_count"]),
                    None if t["inf_count"] is None else int(t["inf_count"]),
                    t["dump_path"],
                    t["note"],
                )
            )
    return out


# ------------------------------------------------------------------ classification
ORIGIN = "origin"  # produced a non-finite value from finite inputs
ENTERED = "entered"  # first to see one, in an input that no recorded call produced
PROPAGATION = "propagation"  # passed one on (its inputs held one)
RECEIVED = "received"  # a collective that output one its inputs did not hold
ALLOWED = "allowed"  # an allowlisted op that produced an expected inf
EXPECTED = "expected"  # carried an expected inf on
ABSORBED = "absorbed"  # inputs held one, outputs hold none (isnan, nan_to_num, a mask)


def is_mask(call: Call, run_dir: str | None) -> bool:
    """Whether every array input of the call holds only 0 and 1 (a mask): bool and integer
    dtypes by their statistics; float inputs only from their dumps (their statistics cannot
    tell a 0/1 mask from probabilities that underflowed to 0, which is a real origin)."""
    if not call.n_in or not call.in_unit:
        return False
    if call.in_int:
        return True
    if len(call.in_dumps) < call.n_in or not run_dir:
        return False
    try:
        import numpy as np

        from .codecs import load as load_dump

        for path in call.in_dumps:
            a = load_dump(os.path.join(run_dir, path), mmap=True)
            if not bool(np.all((a == 0) | (a == 1))):
                return False
    except (OSError, ValueError, TypeError):
        return False
    return True


def _allowed(
    call: Call, allow: Sequence[Allow], run_dir: str | None, cache: dict[str, list[Allow]]
) -> Allow | None:
    hits = cache.get(call.op)
    if hits is None:
        hits = cache[call.op] = [a for a in allow if a.matches(call.op)]
    for a in hits:
        if not a.mask or is_mask(call, run_dir):
            return a
    return None


_UNINIT = UNINITIALISED_RE


@dataclass
class _State:
    """What one process's walk knows so far."""

    seen_bad: bool = False  # a recorded call produced (or received) a non-finite value
    bad_inf: bool = False  # an inf that is no allowlisted one is around
    expected_inf: bool = False  # an allowlisted op made an inf


def classify(
    calls: Sequence[Call],
    count_inf: bool = True,
    allow: Sequence[Allow] = (),
    run_dir: str | None = None,
    collectives: Sequence[Call] = (),
) -> list[tuple[Call, str]]:
    """Each call of one process (seq order) with what it did (:data:`ORIGIN`, ...).

    Calls that contain other listed calls (module rows, api rows over aten rows) are left out:
    their children say more precisely what happened. ``collectives``: every collective row of
    the process; an in-place collective (``all_reduce(t)``) has no output row, so a value it
    received first shows in the input of a later call: that call is then propagation, and the
    latest collective before it is listed as :data:`RECEIVED`."""
    parents = {c.parent for c in calls if c.parent is not None and c.parent >= 0}
    listed = {c.seq for c in calls}
    colls = sorted((c for c in collectives if c.seq not in listed), key=lambda c: c.seq)
    st = _State()
    out: list[tuple[Call, str]] = []
    hits: dict[str, list[Allow]] = {}
    uninit: dict[str, bool] = {}

    def first_seen(c: Call) -> str:
        """A bad value in an input that no recorded call of this process made."""
        before = [k for k in colls if k.seq < c.seq]
        if not before:
            return ENTERED
        out.append((before[-1], RECEIVED))
        return PROPAGATION

    for c in calls:
        if c.seq in parents:
            continue
        skip = uninit.get(c.op)
        if skip is None:
            skip = uninit[c.op] = _UNINIT.match(c.op) is not None
        if skip:
            continue
        in_nan, in_inf, out_nan, out_inf = c.in_nan, c.in_inf, c.out_nan, c.out_inf
        if not count_inf:
            in_inf = out_inf = 0
        fills = out_inf or (c.args and _INF_ARG.search(c.args))
        allowed = _allowed(c, allow, run_dir, hits) if fills else None
        # An inf in an input is a bad value once a real inf is about; an expected one while only
        # allowlisted ops made infs; and an unexplained one (from outside the log) otherwise.
        inf_bad = in_inf > 0 and (st.bad_inf or not st.expected_inf)
        in_bad = in_nan > 0 or inf_bad
        carried_expected = in_inf > 0 and not inf_bad
        out_bad_inf = out_inf > 0 and allowed is None and not carried_expected
        out_bad = out_nan > 0 or out_bad_inf
        if allowed is not None and not out_nan and not (in_bad and st.seen_bad):
            what = ALLOWED  # a fill over uninitialised memory (NaN noise) too
        elif c.kind == "collective" and (out_bad or in_bad):
            what = PROPAGATION if in_bad else RECEIVED  # sent, or received
        elif c.kind == "grad" and out_bad:  # a gradient row has no inputs of its own
            what = PROPAGATION if st.seen_bad else ORIGIN
        elif out_bad:
            what = (PROPAGATION if st.seen_bad else first_seen(c)) if in_bad else ORIGIN
        elif in_bad:  # nothing made: not an origin, even of a value from outside the log
            what = ABSORBED
        elif in_inf or out_inf or allowed is not None:
            what = EXPECTED  # carried an expected inf on
        else:
            continue  # its NaN/inf did not count (--no-inf)
        if what in (ALLOWED, EXPECTED):
            st.expected_inf = True
        elif what == ABSORBED:
            pass  # e.g. uniform_() over an uninitialised tensor, np.isnan(data)
        else:
            st.seen_bad = True
            if out_bad_inf or (what == ENTERED and inf_bad):
                st.bad_inf = True
        out.append((c, what))
    return out


# ------------------------------------------------------------------ the report
def source_line(caller: str | None, cwd: str | None = None) -> str | None:
    """The line of source ``caller`` (``file:line``) names, where the file can be read."""
    if not caller or ":" not in caller:
        return None
    path, _, line = caller.rpartition(":")
    if not line.isdigit():
        return None
    if not os.path.isabs(path) and cwd:
        path = os.path.join(cwd, path)
    text = linecache.getline(path, int(line)).strip()
    return text or None


def _call_json(c: Call, details: dict[tuple[int, int], Any], cwd: str | None) -> dict[str, Any]:
    more, tensors = details.get((c.pid, c.seq), ({k: None for k in _DETAIL_COLS}, []))
    d: dict[str, Any] = {k: getattr(c, k) for k in "host pid rank seq ts_ns step op kind".split()}
    d.update(
        phase=more["phase"],
        module_path=more["module_path"],
        caller=c.caller,
        caller_function=more["caller_function"],
        args=c.args,
        source=source_line(c.caller, cwd),
    )
    d["inputs"] = [t.to_json() for t in tensors if t.role in _IN_ROLES]
    d["outputs"] = [t.to_json() for t in tensors if t.role in _OUT_ROLES]
    return d


def _within(c: Call, by_seq: dict[int, Call]) -> list[str]:
    """The recorded calls that contain ``c``, innermost first (an api row over an aten row,
    module rows), as far as the log's rows of bad values reach."""
    out: list[str] = []
    seen = {c.seq}
    p = c.parent
    while p is not None and p >= 0 and p in by_seq and p not in seen:
        seen.add(p)
        out.append(by_seq[p].op)
        p = by_seq[p].parent
    return out


def _brief(c: Call) -> dict[str, Any]:
    return {"seq": c.seq, "step": c.step, "op": c.op, "caller": c.caller}


def _chain(later: list[tuple[Call, str]], count_inf: bool) -> dict[str, Any]:
    """What the calls after an origin (until the next one) did with its value."""
    carried = [c for c, w in later if w in (PROPAGATION, RECEIVED)]
    absorbed = sum(1 for _c, w in later if w == ABSORBED)
    steps = [c.step for c in carried if c.step is not None]
    first_nan = next((c for c in carried if c.out_nan > 0), None)
    sent = [c for c in carried if c.kind == "collective"]
    return {
        "ops": len(carried),
        "absorbed": absorbed,
        "steps": [min(steps), max(steps)] if steps else None,
        "last": _brief(carried[-1]) if carried else None,
        "first_nan": _brief(first_nan) if (first_nan is not None and count_inf) else None,
        "collectives": len(sent),
    }


def _first(origins: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest origin (by wall clock), briefly: which rank went bad first."""
    if not origins:
        return None
    return {k: origins[0][k] for k in ("host", "pid", "rank", "seq", "ts_ns", "step", "op")}


def _processes(run_dir: str) -> list[dict[str, Any]]:
    from .query import run_sql

    _cols, rows = run_sql(
        """
        SELECT o.host, o.pid, any_value(o.rank) AS rank, any_value(o.world_size) AS ws,
               count(*) AS ops, min(o.ts_ns) AS t0, max(o.ts_ns) AS t1,
               count(*) FILTER (WHERE o.op = 'pprobe.rows_dropped') AS dropped
        FROM ops o GROUP BY o.host, o.pid ORDER BY rank NULLS FIRST, o.host, o.pid
        """,
        run_dir,
    )
    _cols, trows = run_sql(
        "SELECT pid, count(*), count(nan_count) FROM tensors GROUP BY pid", run_dir
    )
    stats = {p: (n, s) for p, n, s in trows}
    out = []
    for host, pid, rank, ws, ops, _t0, _t1, dropped in rows:
        n, s = stats.get(pid, (0, 0))
        out.append(
            {
                "host": host,
                "pid": pid,
                "rank": rank,
                "world_size": ws,
                "ops": ops,
                "tensors": n,
                "tensors_with_stats": s,
                "rows_dropped_marks": dropped,
            }
        )
    return out


def _coverage_notes(meta: dict[str, Any], procs: list[dict[str, Any]]) -> list[str]:
    """What the log may have missed: an origin among unrecorded calls is not found."""
    cfg: dict[str, Any] = meta["config"] if isinstance(meta.get("config"), dict) else {}
    notes = []
    partial = [
        f"{k}={v}"
        for k, v in sorted(cfg.items())
        if k in ("include", "exclude", "steps", "dtypes") and v
    ] + [f"{k}={cfg[k]}" for k in ("every", "first") if cfg.get(k) not in (None, 0, 1)]
    if partial:
        notes.append(
            "the log holds only some calls (" + ", ".join(partial) + "): an origin among the "
            "calls left out shows as a later call whose input already held the value"
        )
    if any(p["tensors"] and p["tensors_with_stats"] < p["tensors"] for p in procs):
        missing = sum(p["tensors"] - p["tensors_with_stats"] for p in procs)
        notes.append(
            f"{missing} tensor rows have no NaN/inf counts (out= buffers, object or string "
            "arrays, ...): they are not checked"
        )
    if any(p["rows_dropped_marks"] for p in procs) or meta.get("rows_dropped"):
        notes.append("rows were dropped while recording (PPROBE_BUFFER_FULL=drop)")
    return notes


def resolve(run: str | None) -> str:
    """A run folder from ``run``: a run folder, an output folder (its latest run), a run's
    name under $PPROBE_OUTPUT (or ./np_op_dumps), or None (the latest run)."""
    from .run import resolve_run_dir

    if run and not os.path.exists(run) and os.sep not in run:
        base = os.environ.get("PPROBE_OUTPUT") or "np_op_dumps"
        cand = os.path.join(base, run)
        if os.path.isdir(cand):
            run = cand
    return resolve_run_dir(run)


def nan_origins(
    run: str | None = None,
    *,
    inf: bool = True,
    allow: Iterable[str] = (),
    default_allow: bool = True,
    configured: bool = True,
) -> dict[str, Any]:
    """Where the run's NaNs (and infs, unless ``inf=False``) were born, as plain data.

    ``allow``: more allowlist patterns (``glob`` or ``glob:mask``); ``default_allow=False``
    drops the built-in ones; ``configured``: add PPROBE_NAN_ALLOW / ``nan_allow``. Keys:
    ``run``, ``mode``, ``count_inf``, ``allow``, ``processes`` (per process: rank, ops
    checked, ``state`` clean/origin/received/allowed, its ``origins``), ``origins`` (every
    origin of every process, by time, with its inputs' and outputs' statistics, source line
    and ``chain``), ``first`` (the earliest origin, or None), ``allowed_ops``, ``notes``.
    Raises :class:`NanError` when the run has nothing to check (log mode), FileNotFoundError
    when there is no run, :class:`pprobe.config.ConfigError` for a bad pattern."""
    run_dir = resolve(run)
    patterns = list(configured_allow() if configured else ()) + list(allow)
    allows = allowlist(patterns, default_allow)
    meta = runs.read_meta(run_dir)
    mode = (meta.get("config") or {}).get("mode") if isinstance(meta.get("config"), dict) else None
    procs = _processes(run_dir)
    if not procs or not any(p["tensors"] for p in procs):
        raise NanError(f"{run_dir}: the run recorded no arrays: there is nothing to check")
    if not any(p["tensors_with_stats"] for p in procs):
        raise NanError(
            f"{run_dir} was recorded in {mode or 'log'} mode: its log has no NaN/inf counts. "
            "Record it again with PPROBE_MODE=stats (or dump) to find where a NaN was born"
        )
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    calls = load_calls(run_dir, nan_only=not inf)
    by_proc: dict[tuple[str, int], list[Call]] = {}
    for c in calls:
        by_proc.setdefault((c.host, c.pid), []).append(c)
    colls: dict[tuple[str, int], list[Call]] = {}
    for c in load_collectives(run_dir):
        colls.setdefault((c.host, c.pid), []).append(c)
    found: list[tuple[dict[str, Any], list[tuple[Call, str, dict[str, Any]]], Call | None]] = []
    allowed_ops: dict[str, int] = {}
    for p in procs:
        key = (p["host"], p["pid"])
        walked = classify(by_proc.get(key, []), inf, allows, run_dir, colls.get(key, ()))
        starts = [i for i, (_c, w) in enumerate(walked) if w in (ORIGIN, ENTERED)]
        mine = []
        for n, i in enumerate(starts):
            c, w = walked[i]
            end = starts[n + 1] if n + 1 < len(starts) else len(walked)
            mine.append((c, w, _chain(walked[i + 1 : end], inf)))
        received = next((c for c, w in walked if w == RECEIVED), None)
        for c, w in walked:
            if w == ALLOWED:
                allowed_ops[c.op] = allowed_ops.get(c.op, 0) + 1
        before = [c for c, w in walked[: starts[0] if starts else len(walked)] if w == RECEIVED]
        p["origins"] = len(mine)
        if mine and before:  # a value from another rank came first: the rest is its doing
            p["state"] = "received"
        elif mine:
            p["state"] = "origin"
        elif received is not None:
            p["state"] = "received"
        elif any(w in (ALLOWED, EXPECTED) for _c, w in walked):
            p["state"] = "allowed"
        else:
            p["state"] = "clean"
        found.append((p, mine, received))
    keys = [(c.pid, c.seq) for _p, mine, _r in found for c, _w, _ch in mine]
    keys += [(r.pid, r.seq) for _p, _m, r in found if r is not None]
    details = load_details(run_dir, keys) if keys else {}
    origins: list[dict[str, Any]] = []
    for p, mine, received in found:
        by_seq = {c.seq: c for c in by_proc.get((p["host"], p["pid"]), [])}
        for c, w, chain in mine:
            o = _call_json(c, details, cwd)
            o.update(how=w, nan=c.out_nan, inf=c.out_inf, chain=chain)
            o["within"] = _within(c, by_seq)
            origins.append(o)
        if received is not None:
            r = _call_json(received, details, cwd)
            del r["inputs"], r["outputs"]
            p["received"] = r
        else:
            p["received"] = None
    origins.sort(key=lambda o: (o["ts_ns"], o["seq"]))
    return {
        "run": run_dir,
        "mode": mode,
        "count_inf": inf,
        "allow": [str(a) for a in allows],
        "processes": procs,
        "origins": origins,
        "first": _first(origins),
        "allowed_ops": allowed_ops,
        "notes": _coverage_notes(meta, procs),
    }
