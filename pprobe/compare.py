"""``pprobe compare``: align two runs op by op, compare their tensors, find where they diverge.

Data flows one way: :func:`load_run` (two queries over the run's views) -> :func:`align`
(per process role and step: key join, then a sequence alignment where the keys disagree) ->
:func:`measure` (dumps, else statistics, per tensor; verdicts) -> :func:`first_divergences`.
docs/compare.md explains the algorithm with an example and gives every formula. The command
line (tables, files, exit status) is in :mod:`pprobe.compare_cli`.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import linecache
import math
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import compare_metrics as cm
from .codecs import exists as dump_exists
from .codecs import stored_size

#: A step longer than this (in ops, either run) is aligned on the rows whose keys disagree
#: only, not on the whole step (difflib's matching is quadratic in the worst case).
LCS_FULL_MAX = 50_000


#: Ops whose outputs hold uninitialised memory: only their shapes and dtypes are compared.
UNDEFINED_OUTPUTS = (
    "*.empty",
    "*.empty_like",
    "*.empty_strided",
    "*.new_empty",
    "*.new_empty_strided",
    "aten.empty.*",
    "aten.empty_like.*",
    "aten.empty_strided.*",
    "aten.new_empty.*",
)


#: In-place fills: the tensor they overwrite (their first input) may be uninitialised memory.
OVERWRITTEN_INPUTS = (
    "torch.nn.init.*",
    "torch.Tensor.uniform_",
    "torch.Tensor.normal_",
    "torch.Tensor.zero_",
    "torch.Tensor.fill_",
    "torch.Tensor.random_",
    "torch.Tensor.copy_",
)


def undefined_value(op: str, role: str, idx: str) -> bool:
    """Whether this tensor's values mean nothing (uninitialised memory)."""
    if role == "output":
        return any(fnmatch.fnmatchcase(op, p) for p in UNDEFINED_OUTPUTS)
    return idx in ("0", "tensor", "self") and any(
        fnmatch.fnmatchcase(op, p) for p in OVERWRITTEN_INPUTS
    )


class CompareError(Exception):
    """A bad run, mapping file or argument: one line for the user."""


# ------------------------------------------------------------------ runs
@dataclass
class Tensor:
    role: str
    idx: str
    shape: tuple[int, ...] | None
    dtype: str | None
    stats: dict[str, Any]  # min, max, mean, std (None in log mode)
    nan: int | None
    inf: int | None
    dump: str | None  # absolute path (a file, or a name in the folder's packs)
    codec: str | None = None  # how the dump is stored (pprobe.codecs)
    codec_error: float = 0.0  # the max abs error its codec introduced (0: lossless)

    @property
    def numel(self) -> int | None:
        return None if self.shape is None else math.prod(self.shape)


@dataclass
class Op:
    pid: int
    seq: int
    rank: int | None
    op: str
    module: str | None
    step: int | None
    caller: str | None
    function: str | None
    ts: int | None
    tensors: dict[tuple[str, str], Tensor] = field(default_factory=dict)


@dataclass
class Run:
    dir: str
    id: str
    groups: dict[str, list[Op]]  # process role -> its ops in call order


def resolve_run(arg: str) -> str:
    """A run folder from a folder, ``latest`` or a run id (a folder name under PPROBE_OUTPUT,
    default ``np_op_dumps``)."""
    from .run import resolve_run_dir

    out = os.environ.get("PPROBE_OUTPUT") or "np_op_dumps"
    try:
        if os.path.isdir(arg):
            return resolve_run_dir(arg)
        if arg == "latest":
            return resolve_run_dir(out)
        cand = os.path.join(out, arg)
        if os.path.isdir(cand):
            return resolve_run_dir(cand)
    except FileNotFoundError as e:
        raise CompareError(str(e)) from None
    raise CompareError(
        f"no run {arg!r}: not a folder, not 'latest', and no run of that id in {out}/"
    )


def _roles(run_dir: str, pids: dict[int, int | None]) -> dict[int, str]:
    """Process role of each pid: ``rank{r}`` where it has a rank, else ``main`` (the process
    that made the run) or ``child{k}`` (k-th other process in pid order). A second process of
    one rank (a DataLoader worker) is ``rank{r}.child{k}``."""
    try:
        with open(os.path.join(run_dir, "meta.json")) as f:
            root = json.load(f).get("pid")
    except (OSError, ValueError):
        root = None
    roles: dict[int, str] = {}
    seen: Counter[str] = Counter()
    for pid in sorted(pids):
        rank = pids[pid]
        base = f"rank{rank}" if rank is not None else ("main" if pid == root else "child")
        k = seen[base]
        seen[base] += 1
        if base == "child":
            roles[pid] = f"child{k}"
        else:
            roles[pid] = base if k == 0 else f"{base}.child{k - 1}"
    if root is None and "main" not in roles.values():
        # no meta.json: the first child (lowest pid) stands for the main process
        firsts = [p for p, r in roles.items() if r == "child0"]
        if firsts:
            roles[firsts[0]] = "main"
            for p in sorted(pids):
                r = roles[p]
                if r.startswith("child") and p != firsts[0]:
                    roles[p] = f"child{int(r[5:]) - 1}"
    return roles


def load_run(run_dir: str) -> Run:
    """Every op of the run with its tensors, grouped by process role."""
    from .query import QueryError, run_sql

    try:
        _, ops = run_sql(
            "SELECT pid, seq, rank, op, module_path, step, caller, caller_function, ts_ns "
            "FROM ops ORDER BY pid, seq",
            run_dir,
        )
        _, tens = run_sql(
            "SELECT pid, seq, role, idx, shape, dtype, min, max, mean, std, nan_count, "
            "inf_count, dump_path, dump_codec, dump_max_abs_error FROM tensors",
            run_dir,
        )
    except QueryError as e:
        raise CompareError(f"cannot read the run in {run_dir}: {str(e).splitlines()[0]}")
    by_key: dict[tuple[int, int], Op] = {}
    ranks: dict[int, int | None] = {}
    for pid, seq, rank, op, module, step, caller, fn, ts in ops:
        by_key[(pid, seq)] = Op(pid, seq, rank, op, module, step, caller, fn, ts)
        if ranks.get(pid) is None:
            ranks[pid] = rank
    for pid, seq, role, idx, shape, dtype, mn, mx, mean, std, nan, inf, dump, codec, err in tens:
        o = by_key.get((pid, seq))
        if o is None:
            continue
        path = os.path.join(run_dir, dump) if dump else None
        o.tensors[(role, str(idx))] = Tensor(
            role,
            str(idx),
            tuple(shape) if shape is not None else None,
            dtype,
            {"min": mn, "max": mx, "mean": mean, "std": std},
            nan,
            inf,
            path,
            codec,
            float(err) if err is not None and math.isfinite(err) else 0.0,
        )
    roles = _roles(run_dir, ranks)
    groups: dict[str, list[Op]] = defaultdict(list)
    for o in by_key.values():  # already in (pid, seq) order
        groups[roles[o.pid]].append(o)
    return Run(run_dir, os.path.basename(run_dir.rstrip("/")), dict(groups))


# ------------------------------------------------------------------ mapping and thresholds
@dataclass
class Rule:
    """Thresholds for the ops whose name (and module path) match these glob patterns."""

    op: str = "*"
    module: str | None = None
    rtol: float | None = None
    atol: float | None = None
    warn_factor: float | None = None

    def matches(self, op: str, module: str | None) -> bool:
        if not _glob(op, self.op):
            return False
        return self.module is None or fnmatch.fnmatchcase(module or "", self.module)


def _glob(op: str, pattern: str) -> bool:
    """Like PPROBE_INCLUDE: the full name, or the last part for a pattern without a dot."""
    return fnmatch.fnmatchcase(op, pattern) or (
        "." not in pattern and fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], pattern)
    )


@dataclass
class Mapping:
    """Names in run B -> names in run A, and per-op thresholds (the ``--map`` file)."""

    modules: dict[str, str] = field(default_factory=dict)  # module path prefix in B -> in A
    ops: dict[str, str] = field(default_factory=dict)  # op name in B -> in A
    rules: list[Rule] = field(default_factory=list)

    def module(self, m: str | None) -> str | None:
        if not m or not self.modules:
            return m
        for src in sorted(self.modules, key=len, reverse=True):
            if m == src or m.startswith(src + "."):
                return self.modules[src] + m[len(src) :]
        return m

    def op(self, name: str) -> str:
        return self.ops.get(name, name)


def load_mapping(path: str) -> Mapping:
    """Read a mapping file: TOML (``.toml``) or JSON. Tables/keys: ``modules`` and ``ops``
    (name in B = name in A), ``thresholds`` (a list of {op, module, rtol, atol, warn_factor})."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CompareError(f"cannot read the mapping file {path}: {e.strerror}")
    try:
        if path.endswith(".json"):
            d = json.loads(raw)
        else:
            d = _toml(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise CompareError(f"mapping file {path}: {e}")
    if not isinstance(d, dict):
        raise CompareError(f"mapping file {path}: expected a table/object at the top")
    unknown = set(d) - {"modules", "ops", "thresholds"}
    if unknown:
        raise CompareError(
            f"mapping file {path}: unknown key {sorted(unknown)[0]!r} "
            "(known: modules, ops, thresholds)"
        )
    m = Mapping()
    for key in ("modules", "ops"):
        v = d.get(key, {})
        if not isinstance(v, dict) or not all(
            isinstance(a, str) and isinstance(b, str) for a, b in v.items()
        ):
            raise CompareError(f"mapping file {path}: {key} must map names to names")
        setattr(m, key, dict(v))
    rules = d.get("thresholds", [])
    if not isinstance(rules, list):
        raise CompareError(f"mapping file {path}: thresholds must be a list of tables")
    for i, r in enumerate(rules):
        if not isinstance(r, dict) or set(r) - {"op", "module", "rtol", "atol", "warn_factor"}:
            raise CompareError(
                f"mapping file {path}: thresholds[{i}] takes op, module, rtol, atol, warn_factor"
            )
        try:
            m.rules.append(
                Rule(
                    str(r.get("op", "*")),
                    None if r.get("module") is None else str(r["module"]),
                    *(
                        None if r.get(k) is None else float(r[k])
                        for k in ("rtol", "atol", "warn_factor")
                    ),
                )
            )
        except (TypeError, ValueError):
            raise CompareError(f"mapping file {path}: thresholds[{i}]: numbers expected")
    return m


def _toml(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    import tomli  # Python 3.10: a dependency there

    return tomli.loads(text)


@dataclass
class Settings:
    """Thresholds for the whole compare (command-line flags) and the mapping file."""

    rtol: float | None = None  # None: per dtype (compare_metrics.DTYPE_TOLERANCES)
    atol: float | None = None
    warn_factor: float = 10.0
    mapping: Mapping = field(default_factory=Mapping)

    def tolerance(self, op: Op, dtypes: Iterable[str | None]) -> tuple[float, float, float]:
        """(rtol, atol, warn_factor): an op pattern's rule, else the flags, else the loosest
        of ``dtypes`` (the pair's, and those of the op's inputs in A and B)."""
        rtol, atol = cm.dtype_tolerance(*dtypes)
        rtol = self.rtol if self.rtol is not None else rtol
        atol = self.atol if self.atol is not None else atol
        wf = self.warn_factor
        for r in self.mapping.rules:
            if r.matches(op.op, op.module):
                rtol = r.rtol if r.rtol is not None else rtol
                atol = r.atol if r.atol is not None else atol
                wf = r.warn_factor if r.warn_factor is not None else wf
                break
        return rtol, atol, wf


# ------------------------------------------------------------------ alignment
KEY, LCS, MAPPED, ONLY_A, ONLY_B = "key", "lcs", "mapping", "only_a", "only_b"


@dataclass
class Pair:
    group: str
    step: int | None
    a: Op | None
    b: Op | None
    how: str  # key, lcs, mapping (matched once B's names were mapped), only_a, only_b


def _token(o: Op, mapping: Mapping | None = None) -> tuple[str, str]:
    if mapping is None:
        return (o.module or "", o.op)
    return (mapping.module(o.module) or "", mapping.op(o.op))


def align_ops(a: list[Op], b: list[Op], mapping: Mapping) -> list[tuple[int, int, str]]:
    """Matched (index in a, index in b, "key" or "lcs") of one step of one process role.

    1. Key join: the k-th call of (module path, op) in A with the k-th in B, for every
       (module path, op) called as many times in both.
    2. Where the counts differ (an op inserted or removed), a sequence alignment of the
       whole step's (module path, op) names (difflib's longest matching blocks) pairs the
       remaining calls, so one extra op does not shift the later matches.
    B's names go through ``mapping`` (renamed modules and ops) first.
    """
    ta = [_token(o) for o in a]
    tb = [_token(o, mapping) for o in b]
    ca, cb = Counter(ta), Counter(tb)
    same = {t for t in ca if ca[t] == cb.get(t)}
    pos_b: dict[tuple[str, str], list[int]] = defaultdict(list)
    for j, t in enumerate(tb):
        if t in same:
            pos_b[t].append(j)
    seen: Counter[tuple[str, str]] = Counter()
    out: list[tuple[int, int, str]] = []
    for i, t in enumerate(ta):
        if t in same:
            out.append((i, pos_b[t][seen[t]], KEY))
            seen[t] += 1
    if len(same) == len(ca) and len(same) == len(cb):
        return out
    # Sequence alignment of the rest, in the context of the whole step where it is small
    # enough: a block of unchanged calls around an insertion anchors the match.
    if len(ta) <= LCS_FULL_MAX and len(tb) <= LCS_FULL_MAX:
        ia, ib = list(range(len(ta))), list(range(len(tb)))
    else:
        ia = [i for i, t in enumerate(ta) if t not in same]
        ib = [j for j, t in enumerate(tb) if t not in same]
    ids: dict[tuple[str, str], int] = {}
    sa = [ids.setdefault(ta[i], len(ids)) for i in ia]
    sb = [ids.setdefault(tb[j], len(ids)) for j in ib]
    sm = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
    for blk in sm.get_matching_blocks():
        for k in range(blk.size):
            i, j = ia[blk.a + k], ib[blk.b + k]
            if ta[i] not in same:
                out.append((i, j, LCS))
    out.sort()
    return out


def _by_step(ops: list[Op]) -> dict[int | None, list[Op]]:
    d: dict[int | None, list[Op]] = defaultdict(list)
    for o in ops:
        d[o.step].append(o)
    return d


def align(run_a: Run, run_b: Run, mapping: Mapping | None = None) -> list[Pair]:
    """Every op of both runs, aligned per process role and step; unmatched ones included
    (``only_a`` / ``only_b``). Ordered by role, step, then A's call order (a B-only op
    follows the A op matched to its predecessor in B)."""
    mapping = mapping or Mapping()
    pairs: list[Pair] = []
    for group in sorted(set(run_a.groups) | set(run_b.groups), key=_group_order):
        sa, sb = _by_step(run_a.groups.get(group, [])), _by_step(run_b.groups.get(group, []))
        for step in sorted(set(sa) | set(sb), key=lambda s: (s is None, s or 0)):
            a, b = sa.get(step, []), sb.get(step, [])
            matched = align_ops(a, b, mapping)
            of_b = {j: i for i, j, _ in matched}
            keyed: list[tuple[float, int, Pair]] = []
            for i, j, how in matched:
                if (b[j].module, b[j].op) != (a[i].module, a[i].op):
                    how = MAPPED
                keyed.append((i, 0, Pair(group, step, a[i], b[j], how)))
            done_a = {i for i, _, _ in matched}
            for i, o in enumerate(a):
                if i not in done_a:
                    keyed.append((i, 0, Pair(group, step, o, None, ONLY_A)))
            anchor = -0.5
            for j, o in enumerate(b):
                if j in of_b:
                    anchor = of_b[j] + 0.5
                else:
                    keyed.append((anchor, j + 1, Pair(group, step, None, o, ONLY_B)))
            keyed.sort(key=lambda x: (x[0], x[1]))
            pairs.extend(p for _, _, p in keyed)
    return pairs


def _group_order(g: str) -> tuple[int, int, str]:
    if g == "main":
        return (0, 0, g)
    head = g.split(".", 1)[0]
    for prefix, k in (("rank", 1), ("child", 2)):
        if head.startswith(prefix) and head[len(prefix) :].isdigit():
            return (k, int(head[len(prefix) :]), g)
    return (3, 0, g)


# ------------------------------------------------------------------ measuring
@dataclass
class TensorResult:
    role: str
    idx: str
    a: Tensor | None
    b: Tensor | None
    source: str = ""  # dump, stats, meta (shapes and dtypes only), missing
    el: cm.Elementwise | None = None
    st: cm.StatsDiff | None = None
    rtol: float | None = None
    atol: float | None = None
    warn_factor: float = 10.0
    ratio: float | None = None
    verdict: str = cm.PASS
    reason: str = ""
    diff: bool = False
    #: The sum of the two dumps' codec errors, added to atol (docs/codecs.md); 0: lossless.
    codec_bound: float = 0.0
    codecs: str = ""  # the lossy codecs behind codec_bound ("int8", "int8+bf16")


@dataclass
class PairResult:
    pair: Pair
    tensors: list[TensorResult]
    verdict: str = cm.PASS  # pass, warn, fail; "unmatched" for only_a / only_b
    diff: bool = False
    first: bool = False  # the first divergence of its process role
    origin_reason: str = ""


UNMATCHED = "unmatched"


def _tensor_results(p: Pair, settings: Settings) -> list[TensorResult]:
    assert p.a is not None and p.b is not None
    keys = list(p.a.tensors) + [k for k in p.b.tensors if k not in p.a.tensors]
    keys.sort(key=lambda k: (k[0] != "input", k[1]))
    # an output is no more precise than the op's inputs (bf16 in, fp32 out: bf16's tolerance)
    in_dtypes = [t.dtype for o in (p.a, p.b) for k, t in o.tensors.items() if k[0] == "input"]
    out = []
    for k in keys:
        ta, tb = p.a.tensors.get(k), p.b.tensors.get(k)
        tr = TensorResult(k[0], k[1], ta, tb)
        if ta is None or tb is None:
            tr.source, tr.verdict, tr.diff = "missing", cm.WARN, True
            tr.reason = f"only in {'B' if ta is None else 'A'}"
        elif undefined_value(p.a.op, k[0], k[1]):
            tr.source = "meta"
            tr.reason = "uninitialised memory: shape and dtype only"
            tr.rtol, tr.atol, tr.warn_factor = settings.tolerance(
                p.a, [ta.dtype, tb.dtype, *in_dtypes]
            )
        else:
            tr.rtol, tr.atol, tr.warn_factor = settings.tolerance(
                p.a, [ta.dtype, tb.dtype, *in_dtypes]
            )
        out.append(tr)
    return out


def _judge(tr: TensorResult) -> None:
    """Verdict of a tensor pair once its metrics are in (see docs/compare.md)."""
    ta, tb = tr.a, tr.b
    if ta is None or tb is None:
        return
    dtype_diff = ta.dtype != tb.dtype
    if ta.shape is not None and tb.shape is not None and ta.shape != tb.shape:
        tr.verdict, tr.reason, tr.diff = cm.FAIL, "shape differs", True
        return
    wf = tr.warn_factor
    if tr.source == "meta":
        tr.diff = dtype_diff
        return
    if tr.el is not None:
        tr.source, el = "dump", tr.el
        tr.diff = dtype_diff or not el.identical
        tr.ratio = el.ratio
        if el.nonfinite_mismatch:
            tr.verdict, tr.reason = cm.FAIL, f"NaN/inf differ at {el.nonfinite_mismatch} places"
            return
        tr.ratio = el.ratio
    elif tr.st is not None or ta.nan is not None:
        tr.source = "stats"
        st = tr.st
        counts_differ = (ta.nan or 0) != (tb.nan or 0) or (ta.inf or 0) != (tb.inf or 0)
        tr.diff = dtype_diff or counts_differ or (st is not None and bool(st.ratio))
        if counts_differ:
            tr.verdict, tr.reason = cm.FAIL, "NaN/inf counts differ"
            return
        tr.ratio = st.ratio if st is not None else None
    else:
        tr.source = "meta"
        tr.diff = dtype_diff
    tr.verdict = cm.verdict_of(tr.ratio, wf)
    bounded = tr.source == "dump" and tr.codec_bound > 0
    if tr.verdict != cm.PASS:
        tr.reason = f"error {_g(tr.ratio)}x the tolerance (rtol {_g(tr.rtol)}, atol {_g(tr.atol)}"
        tr.reason += f" + codec bound {_g(tr.codec_bound)} ({tr.codecs}))" if bounded else ")"
    elif dtype_diff:
        tr.reason = "dtype differs"
    elif bounded and tr.diff:
        tr.reason = f"within the {tr.codecs} codec bound {_g(tr.codec_bound)}"


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def measure(
    pairs: list[Pair],
    settings: Settings,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
    timing: dict[str, float] | None = None,
) -> list[PairResult]:
    """Metrics and verdicts of every aligned pair. Dumps present on both sides are compared
    element by element (in threads, memory-mapped, chunk by chunk); other tensors from their
    statistics. ``progress(done_bytes, total_bytes)`` is called as dumps are compared;
    ``timing["dumps_s"]`` receives the seconds spent comparing dumps."""
    timing = {} if timing is None else timing
    results: list[PairResult] = []
    jobs: list[TensorResult] = []
    for p in pairs:
        if p.a is None or p.b is None:
            results.append(PairResult(p, [], UNMATCHED, True))
            continue
        trs = _tensor_results(p, settings)
        for tr in trs:
            if tr.a is None or tr.b is None or tr.source == "meta":
                continue
            if (
                tr.a.dump
                and tr.b.dump
                and tr.a.shape == tr.b.shape
                and dump_exists(tr.a.dump)
                and dump_exists(tr.b.dump)
            ):
                jobs.append(tr)
            elif tr.a.stats.get("min") is not None and tr.b.stats.get("min") is not None:
                assert tr.rtol is not None and tr.atol is not None
                tr.st = cm.compare_stats(tr.a.stats, tr.b.stats, tr.rtol, tr.atol)
        results.append(PairResult(p, trs))

    def size(tr: TensorResult) -> int:
        return sum(stored_size(t.dump) for t in (tr.a, tr.b) if t and t.dump)

    sizes = [size(tr) for tr in jobs]
    total = sum(sizes)
    done = 0

    def run(tr: TensorResult) -> None:
        assert tr.a is not None and tr.b is not None and tr.a.dump and tr.b.dump
        assert tr.rtol is not None and tr.atol is not None
        # A lossy codec moved each stored value by at most its max_abs_error: two values
        # within the sum of those bounds (plus the tolerance) may have been equal.
        tr.codec_bound = tr.a.codec_error + tr.b.codec_error
        tr.codecs = "+".join(
            dict.fromkeys(t.codec for t in (tr.a, tr.b) if t.codec and t.codec_error > 0)
        )
        try:
            tr.el = cm.compare_files(
                tr.a.dump, tr.b.dump, tr.rtol, tr.atol + tr.codec_bound, tr.a.dtype, tr.b.dtype
            )
        except (OSError, ValueError):
            tr.el = None
        if tr.el is None and tr.a.stats.get("min") is not None:
            tr.st = cm.compare_stats(tr.a.stats, tr.b.stats, tr.rtol, tr.atol)

    n = threads or cm.workers()
    t0 = time.perf_counter()
    if n > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(n, thread_name_prefix="pprobe-compare") as pool:
            for sz, _ in zip(sizes, pool.map(run, jobs)):
                done += sz
                if progress:
                    progress(done, total)
    else:
        for sz, tr in zip(sizes, jobs):
            run(tr)
            done += sz
            if progress:
                progress(done, total)
    timing["dumps_s"] = time.perf_counter() - t0
    for r in results:
        if r.verdict == UNMATCHED:
            continue
        for tr in r.tensors:
            _judge(tr)
        outs = [t for t in r.tensors if t.role == "output"] or r.tensors
        r.verdict = max((t.verdict for t in outs), key=cm.SEVERITY.__getitem__, default=cm.PASS)
        r.diff = any(t.diff for t in r.tensors)
    return results


# ------------------------------------------------------------------ first divergence
def _sig(t: Tensor | None) -> tuple[Any, ...] | None:
    """What identifies a value across ops (a view or reshape keeps it): element count and
    statistics, rounded."""
    if t is None or t.stats.get("min") is None:
        return None
    return (
        t.numel,
        t.nan,
        t.inf,
        *(f"{float(t.stats[k]):.7g}" for k in cm.STATS),
    )


def _pair_sig(tr: TensorResult) -> tuple[Any, ...] | None:
    sa, sb = _sig(tr.a), _sig(tr.b)
    return None if sa is None or sb is None else (sa, sb)


def first_divergences(results: list[PairResult]) -> dict[str, PairResult]:
    """Per process role, the first failing op (in A's call order) where the difference was
    born: each of its failing inputs (if any) is a value no earlier op output with a
    difference (its statistics in A and B match no earlier non-passing output). Inputs that
    pass, or differ within the warn level, do not make it a carrier."""
    firsts: dict[str, PairResult] = {}
    carried: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    unmatched: dict[str, list[Op]] = defaultdict(list)  # ops of one run only, so far
    for r in results:  # align()'s order: role, step, A's call order
        g = r.pair.group
        if g in firsts:
            continue
        if r.pair.a is None or r.pair.b is None:
            o = r.pair.a or r.pair.b
            if o is not None:
                unmatched[g].append(o)
            continue
        bad = carried[g]
        if r.verdict == cm.FAIL:
            ins = [t for t in r.tensors if t.role == "input" and t.verdict == cm.FAIL]
            inherited = [t for t in ins if (s := _pair_sig(t)) is not None and s in bad]
            if not inherited:
                r.first = True
                if not ins:
                    warned = [t for t in r.tensors if t.role == "input" and t.verdict == cm.WARN]
                    r.origin_reason = (
                        "its inputs differ within the warn level only"
                        if warned
                        else "its inputs agree"
                    )
                else:
                    names = ", ".join(t.idx for t in ins)
                    r.origin_reason = f"input {names} differs and no earlier aligned op produced it"
                    near = unmatched[g][-3:]
                    if near:
                        r.origin_reason += "; ops found in one run only came before it: " + (
                            ", ".join(f"{o.op} at {o.caller}" for o in near)
                        )
                    else:
                        r.origin_reason += " (a parameter or input data differs)"
                firsts[g] = r
                continue
        for t in r.tensors:
            if t.role == "output" and t.verdict != cm.PASS and (s := _pair_sig(t)) is not None:
                bad.add(s)
    return firsts


def source_line(caller: str | None) -> str | None:
    """The text of ``file:line``, where the file exists."""
    if not caller or ":" not in caller:
        return None
    path, _, line = caller.rpartition(":")
    if not line.isdigit() or not os.path.isfile(path):
        return None
    return linecache.getline(path, int(line)).strip() or None


# ------------------------------------------------------------------ the whole compare
@dataclass
class Comparison:
    run_a: Run
    run_b: Run
    results: list[PairResult]
    firsts: dict[str, PairResult]
    seconds: float = 0.0  # the whole compare
    dump_seconds: float = 0.0  # comparing dumps element by element

    @property
    def first(self) -> PairResult | None:
        """The earliest first divergence of all process roles (A's clock)."""
        fs = list(self.firsts.values())
        if not fs:
            return None
        return min(fs, key=lambda r: r.pair.a.ts if r.pair.a and r.pair.a.ts else 0)

    def counts(self) -> dict[str, int]:
        c: Counter[str] = Counter()
        for r in self.results:
            c[r.pair.how] += 1
            if r.verdict != UNMATCHED:
                c[r.verdict] += 1
                c["aligned"] += 1
                c["diff"] += r.diff
            c["tensors"] += len(r.tensors)
            c["dump_bytes"] += sum(t.el.bytes_read for t in r.tensors if t.el is not None)
            c["codec_bounded"] += sum(t.el is not None and t.codec_bound > 0 for t in r.tensors)
        return {
            k: c[k]
            for k in (
                "aligned",
                KEY,
                LCS,
                MAPPED,
                ONLY_A,
                ONLY_B,
                cm.PASS,
                cm.WARN,
                cm.FAIL,
                "diff",
                "tensors",
                "dump_bytes",
                "codec_bounded",
            )
        }

    def worst(self, n: int = 10) -> list[PairResult]:
        """The n aligned ops with the worst verdicts, then the largest error ratios."""
        cands = [r for r in self.results if r.verdict in (cm.WARN, cm.FAIL)]

        def key(r: PairResult) -> tuple[int, int, float]:
            outs = [t for t in r.tensors if t.role == "output"] or r.tensors
            nonfinite = any(t.el is not None and t.el.nonfinite_mismatch for t in outs)
            rr = max((t.ratio for t in outs if t.ratio is not None), default=0.0)
            return (-cm.SEVERITY[r.verdict], -nonfinite, -(rr if not math.isnan(rr) else math.inf))

        return sorted(cands, key=key)[:n]

    def exit_status(self, fail_on: str) -> int:
        """1 when the compare is divergent at the ``fail_on`` level (fail, warn or diff)."""
        c = self.counts()
        if fail_on == "fail":
            return int(c[cm.FAIL] > 0)
        unmatched = c[ONLY_A] + c[ONLY_B]
        if fail_on == "warn":
            return int(c[cm.FAIL] + c[cm.WARN] + unmatched > 0)
        return int(c["diff"] + unmatched > 0)


def compare(
    a: str,
    b: str,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> Comparison:
    """Compare run ``b`` against the reference run ``a`` (folders, ``latest`` or run ids)."""
    t0 = time.perf_counter()
    settings = settings or Settings()
    run_a, run_b = load_run(resolve_run(a)), load_run(resolve_run(b))
    pairs = align(run_a, run_b, settings.mapping)
    timing: dict[str, float] = {}
    results = measure(pairs, settings, progress, threads, timing)
    firsts = first_divergences(results)
    return Comparison(
        run_a, run_b, results, firsts, time.perf_counter() - t0, timing.get("dumps_s", 0.0)
    )


# ------------------------------------------------------------------ rows (exported, saved)
COLUMNS: list[tuple[str, str]] = [
    ("process", "string"),
    ("step", "int64"),
    ("match", "string"),
    ("verdict", "string"),
    ("first_divergence", "bool"),
    ("op", "string"),
    ("module_path", "string"),
    ("caller", "string"),
    ("a_pid", "int64"),
    ("a_seq", "int64"),
    ("b_pid", "int64"),
    ("b_seq", "int64"),
    ("b_op", "string"),
    ("b_module_path", "string"),
    ("b_caller", "string"),
    ("role", "string"),
    ("idx", "string"),
    ("source", "string"),
    ("tensor_verdict", "string"),
    ("reason", "string"),
    ("shape_a", "string"),
    ("shape_b", "string"),
    ("dtype_a", "string"),
    ("dtype_b", "string"),
    ("cosine", "float64"),
    ("max_abs_err", "float64"),
    ("max_rel_err", "float64"),
    ("rmse", "float64"),
    ("within_1e-3", "float64"),
    ("within_5e-3", "float64"),
    ("nan_a", "int64"),
    ("nan_b", "int64"),
    ("inf_a", "int64"),
    ("inf_b", "int64"),
    ("nan_diff", "int64"),
    ("inf_diff", "int64"),
    ("min_rel_diff", "float64"),
    ("max_rel_diff", "float64"),
    ("mean_rel_diff", "float64"),
    ("std_rel_diff", "float64"),
    ("error_ratio", "float64"),
    ("rtol", "float64"),
    ("atol", "float64"),
    ("codec_bound", "float64"),
    ("codecs", "string"),
    ("identical", "bool"),
    ("dump_a", "string"),
    ("dump_b", "string"),
]


def _shape(t: Tensor | None) -> str | None:
    return None if t is None or t.shape is None else "[" + ", ".join(map(str, t.shape)) + "]"


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def rows(c: Comparison) -> Iterable[dict[str, Any]]:
    """One row per tensor pair of every aligned op, and one per unmatched op."""
    for r in c.results:
        a, b = r.pair.a, r.pair.b
        base: dict[str, Any] = {
            "process": r.pair.group,
            "step": r.pair.step,
            "match": r.pair.how,
            "verdict": r.verdict,
            "first_divergence": r.first,
            "op": a.op if a else (b.op if b else None),
            "module_path": a.module if a else None,
            "caller": a.caller if a else None,
            "a_pid": a.pid if a else None,
            "a_seq": a.seq if a else None,
            "b_pid": b.pid if b else None,
            "b_seq": b.seq if b else None,
            "b_op": b.op if b else None,
            "b_module_path": b.module if b else None,
            "b_caller": b.caller if b else None,
        }
        if not r.tensors:
            yield {k: base.get(k) for k, _ in COLUMNS}
            continue
        for t in r.tensors:
            row = dict(base)
            el, st = t.el, t.st
            nan_a = el.nan_a if el else (t.a.nan if t.a else None)
            nan_b = el.nan_b if el else (t.b.nan if t.b else None)
            inf_a = el.inf_a if el else (t.a.inf if t.a else None)
            inf_b = el.inf_b if el else (t.b.inf if t.b else None)
            row.update(
                role=t.role,
                idx=t.idx,
                source=t.source,
                tensor_verdict=t.verdict,
                reason=t.reason or None,
                shape_a=_shape(t.a),
                shape_b=_shape(t.b),
                dtype_a=t.a.dtype if t.a else None,
                dtype_b=t.b.dtype if t.b else None,
                cosine=el.cosine if el else None,
                max_abs_err=el.max_abs if el else None,
                max_rel_err=el.max_rel if el else None,
                rmse=el.rmse if el else None,
                nan_a=_int(nan_a),
                nan_b=_int(nan_b),
                inf_a=_int(inf_a),
                inf_b=_int(inf_b),
                nan_diff=None if nan_a is None or nan_b is None else int(nan_b) - int(nan_a),
                inf_diff=None if inf_a is None or inf_b is None else int(inf_b) - int(inf_a),
                error_ratio=t.ratio,
                rtol=t.rtol,
                atol=t.atol,
                codec_bound=t.codec_bound if t.el is not None and t.codec_bound > 0 else None,
                codecs=t.codecs or None,
                identical=None if t.source == "missing" else not t.diff,
                dump_a=t.a.dump if t.a else None,
                dump_b=t.b.dump if t.b else None,
            )
            row["within_1e-3"] = el.within_1e3 if el else None
            row["within_5e-3"] = el.within_5e3 if el else None
            for k in cm.STATS:
                row[f"{k}_rel_diff"] = st.rel.get(k) if st else None
            yield row
