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
import json
import linecache
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Ops whose inf outputs are expected. A fill or a selection whose inputs are finite can only
#: produce an inf from the value the program asked for (``masked_fill(mask, -inf)``,
#: ``np.full(n, -inf)``, ``np.where(m, x, -np.inf)``); ``log`` is expected only on a 0/1 mask
#: (``:mask``): ``log`` of probabilities that underflowed to 0 is a real origin.
DEFAULT_ALLOW: tuple[str, ...] = (
    "numpy.full",
    "numpy.full_like",
    "numpy.where",
    "numpy.ndarray.fill",
    "numpy.copyto",
    "numpy.putmask",
    "numpy.place",
    "numpy.log:mask",
    "numpy.ma.*",
    "torch.full",
    "torch.full_like",
    "torch.fill",
    "torch.fill_",
    "torch.where",
    "torch.masked_fill",
    "torch.Tensor.new_full",
    "torch.Tensor.fill_",
    "torch.Tensor.masked_fill",
    "torch.Tensor.masked_fill_",
    "torch.Tensor.where",
    "torch.log:mask",
    "torch.Tensor.log:mask",
    "aten.full.*",
    "aten.full_like.*",
    "aten.new_full.*",
    "aten.fill.*",
    "aten.fill_.*",
    "aten.masked_fill.*",
    "aten.masked_fill_.*",
    "aten.where.*",
    "aten.log.*:mask",
)
#: Ops whose outputs are uninitialised memory: a NaN or inf in them is noise, not an origin
#: (whatever fills them, such as ``uniform_``, takes that noise as its input and drops it).
UNINITIALISED: tuple[str, ...] = (
    "numpy.empty",
    "numpy.empty_like",
    "torch.empty",
    "torch.empty_like",
    "torch.empty_strided",
    "torch.Tensor.new_empty",
    "torch.Tensor.new_empty_strided",
    "aten.empty.*",
    "aten.empty_like.*",
    "aten.empty_strided.*",
    "aten.new_empty.*",
    "aten.new_empty_strided.*",
)
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


@dataclass
class Call:
    host: str
    pid: int
    rank: int | None
    seq: int
    ts_ns: int
    op: str
    kind: str
    status: str
    caller: str | None
    caller_function: str | None
    module_path: str | None
    phase: str | None
    step: int | None
    depth: int | None
    parent: int | None
    args: str | None
    tensors: list[Tensor] = field(default_factory=list)

    def counts(self, roles: Sequence[str]) -> tuple[int, int]:
        """(NaN, inf) summed over the tensors of these roles that have statistics."""
        n = i = 0
        for t in self.tensors:
            if t.role in roles:
                n += t.nan or 0
                i += t.inf or 0
        return n, i


_OPS_COLS = (
    "host pid rank seq ts_ns op kind status caller caller_function module_path phase step "
    "depth parent args"
).split()
_T_COLS = "role idx shape dtype device min max mean std nan_count inf_count dump_path note".split()


def _num(v: Any) -> int | None:
    return None if v is None else int(v)


def load_calls(run_dir: str, nan_only: bool = False) -> list[Call]:
    """Every recorded call of the run that has a tensor holding a NaN (or an inf unless
    ``nan_only``), with all its tensors, ordered by process and seq."""
    from .query import run_sql

    bad = "t.nan_count > 0" if nan_only else "(t.nan_count > 0 OR t.inf_count > 0)"
    sql = f"""
        WITH bad AS (SELECT DISTINCT t.pid, t.seq FROM tensors t WHERE {bad})
        SELECT {", ".join("o." + c for c in _OPS_COLS)}, {", ".join("t." + c for c in _T_COLS)}
        FROM bad JOIN ops o USING (pid, seq) JOIN tensors t USING (pid, seq)
        ORDER BY o.host, o.pid, o.seq, t.role, t.idx
    """
    _cols, rows = run_sql(sql, run_dir)
    calls: list[Call] = []
    n = len(_OPS_COLS)
    for r in rows:
        key = (r[0], r[1], r[3])
        if not calls or (calls[-1].host, calls[-1].pid, calls[-1].seq) != key:
            d = dict(zip(_OPS_COLS, r[:n]))
            calls.append(Call(**d))
        t = dict(zip(_T_COLS, r[n:]))
        calls[-1].tensors.append(
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
                _num(t["nan_count"]),
                _num(t["inf_count"]),
                t["dump_path"],
                t["note"],
            )
        )
    return calls


def load_collectives(run_dir: str) -> list[Call]:
    """Every collective row of the run (without tensors): in-place collectives have no
    output row, and what they received is seen only in later calls' inputs."""
    from .query import run_sql

    cols = ", ".join(_OPS_COLS)
    _cols, rows = run_sql(
        f"SELECT {cols} FROM ops WHERE kind = 'collective' ORDER BY host, pid, seq", run_dir
    )
    return [Call(**dict(zip(_OPS_COLS, r))) for r in rows]


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
    ins = [t for t in call.tensors if t.role in _IN_ROLES]
    if not ins:
        return False
    for t in ins:
        if t.min is None or t.max is None or t.min < 0 or t.max > 1:
            return False
        if t.dtype and _INT_DTYPES.fullmatch(t.dtype):
            continue
        if not (t.dump_path and run_dir):
            return False
        try:
            import numpy as np

            a = np.load(os.path.join(run_dir, t.dump_path), mmap_mode="r", allow_pickle=False)
            if not bool(np.all((a == 0) | (a == 1))):
                return False
        except (OSError, ValueError, TypeError):
            return False
    return True


def _allowed(call: Call, allow: Sequence[Allow], run_dir: str | None) -> Allow | None:
    for a in allow:
        if a.matches(call.op) and (not a.mask or is_mask(call, run_dir)):
            return a
    return None


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

    def first_seen(c: Call) -> str:
        """A bad value in an input that no recorded call of this process made."""
        before = [k for k in colls if k.seq < c.seq]
        if not before:
            return ENTERED
        out.append((before[-1], RECEIVED))
        return PROPAGATION

    for c in calls:
        if c.seq in parents or any(fnmatch.fnmatchcase(c.op, u) for u in UNINITIALISED):
            continue
        in_nan, in_inf = c.counts(_IN_ROLES)
        out_nan, out_inf = c.counts(_OUT_ROLES)
        if not count_inf:
            in_inf = out_inf = 0
        fills = out_inf or _INF_ARG.search(c.args or "")
        allowed = _allowed(c, allow, run_dir) if fills else None
        # An inf in an input is a bad value once a real inf is about; an expected one while only
        # allowlisted ops made infs; and an unexplained one (from outside the log) otherwise.
        inf_bad = in_inf > 0 and (st.bad_inf or not st.expected_inf)
        in_bad = in_nan > 0 or inf_bad
        carried_expected = in_inf > 0 and not inf_bad
        out_bad_inf = out_inf > 0 and allowed is None and not carried_expected
        out_bad = out_nan > 0 or out_bad_inf
        if allowed is not None and not out_nan and not in_bad:
            what = ALLOWED
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


def _call_json(c: Call, cwd: str | None, with_tensors: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        k: getattr(c, k)
        for k in (
            "host pid rank seq ts_ns step op kind phase module_path caller caller_function args"
        ).split()
    }
    d["source"] = source_line(c.caller, cwd)
    if with_tensors:
        d["inputs"] = [t.to_json() for t in c.tensors if t.role in _IN_ROLES]
        d["outputs"] = [t.to_json() for t in c.tensors if t.role in _OUT_ROLES]
    return d


def _brief(c: Call) -> dict[str, Any]:
    return {"seq": c.seq, "step": c.step, "op": c.op, "caller": c.caller}


def _chain(later: list[tuple[Call, str]], count_inf: bool) -> dict[str, Any]:
    """What the calls after an origin (until the next one) did with its value."""
    carried = [c for c, w in later if w in (PROPAGATION, RECEIVED)]
    absorbed = sum(1 for _c, w in later if w == ABSORBED)
    steps = [c.step for c in carried if c.step is not None]
    first_nan = next((c for c in carried if c.counts(_OUT_ROLES)[0] > 0), None)
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


def _meta(run_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(run_dir, "meta.json"), "rb") as f:
            m = json.loads(f.read())
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


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
    meta = _meta(run_dir)
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
    origins: list[dict[str, Any]] = []
    allowed_ops: dict[str, int] = {}
    for p in procs:
        key = (p["host"], p["pid"])
        walked = classify(by_proc.get(key, []), inf, allows, run_dir, colls.get(key, ()))
        starts = [i for i, (_c, w) in enumerate(walked) if w in (ORIGIN, ENTERED)]
        mine = []
        for n, i in enumerate(starts):
            c, w = walked[i]
            end = starts[n + 1] if n + 1 < len(starts) else len(walked)
            o = _call_json(c, cwd)
            o["how"] = w
            o["nan"], o["inf"] = c.counts(_OUT_ROLES)
            o["chain"] = _chain(walked[i + 1 : end], inf)
            mine.append(o)
        received = next((c for c, w in walked if w == RECEIVED), None)
        for c, w in walked:
            if w == ALLOWED:
                allowed_ops[c.op] = allowed_ops.get(c.op, 0) + 1
        before = [c for c, w in walked[: starts[0] if starts else len(walked)] if w == RECEIVED]
        p["origins"] = len(mine)
        p["received"] = _call_json(received, cwd, with_tensors=False) if received else None
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
        origins += mine
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
