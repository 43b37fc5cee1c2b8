"""User tables and metrics: the registry, sampling, and the streamed shards of schema ``python``.

A row reaches a table four ways: ``pprobe.record(table, row)`` / ``record_custom_data``, a
``@table`` function sampled, a ``@metric`` function sampled (table ``metrics``), and
``register_table(name, data)`` (a snapshot, replaced by the next call). Rows wait in memory
and a daemon thread (``pprobe-ext``) appends them every ``flush_seconds`` to
``<run>/log/python/{table}-{host}-{pid}-{k}.arrows``: Arrow IPC streams, readable up to the
last complete batch after a crash, like the ``ops`` shards. When a table's columns change
(a new column, a new type), the shard is closed and shard ``k + 1`` starts with the merged
schema; readers unify the shards by column name (:func:`unify_types`).

Sampling (docs/extending.md says when): at step boundaries every ``sample_steps`` steps, on a
``sample_seconds`` interval, at exit, and before a live query. Nothing here touches the
per-op path: the only link to the recorder is a step listener, installed on the first
registration.
"""

from __future__ import annotations

import numbers
import operator
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

from .. import _report, core, state

#: Columns pprobe adds to every row (a user column of the same name keeps the user's value).
STD_COLUMNS = ("run_id", "pid", "rank", "step", "ts_ns")
#: A function that raised this many times is switched off (the circuit breaker).
MAX_FAILURES = 5
#: Rows kept per table when no run records them (no session): the oldest are dropped past it.
MEMORY_ROWS = 100_000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Table names pprobe itself fills.
RESERVED = ("metrics", "errors", "settings")


class ExtensionError(ValueError):
    """A bad argument to the extension API (a table name, a row)."""


def check_name(name: Any, what: str = "table") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ExtensionError(
            f"{what} name {name!r} is not valid; allowed: letters, digits and _, not starting "
            "with a digit (it is a SQL name: python.<name>)"
        )
    return name


@dataclass
class Source:
    """A sampled function: a ``@table`` (rows) or a ``@metric`` (one number)."""

    kind: str  # "table" or "metric"
    name: str
    fn: Callable[[], Any]
    owner: str | None = None  # the plugin that registered it
    failures: int = 0
    off: bool = False
    what: str = ""  # how errors name it: "metric 'loss'"

    def __post_init__(self) -> None:
        self.what = f"{self.kind} {self.name!r}"


_lock = threading.RLock()
sources: dict[tuple[str, str], Source] = {}
#: name -> (the data as given, as an Arrow table; owner)
static: dict[str, tuple[Any, str | None]] = {}
#: table -> rows not yet written (dicts, their standard columns filled)
pending: dict[str, list[dict[str, Any]]] = {}
#: table -> rows not yet written given column by column (the built-in hooks' own, when no
#: tap wants rows): [(standard columns, {name: values})]
pending_cols: dict[str, list[tuple[dict[str, Any], dict[str, list[Any]]]]] = {}
#: table -> rows already written by this process, kept only when no run records them
memory: dict[str, list[dict[str, Any]]] = {}
#: Functions called with (table, rows) for every batch of rows added (the exporters' tap:
#: pprobe.hooks.exporters); they must not block.
taps: list[Callable[[str, list[dict[str, Any]]], None]] = []
#: The sources to sample, in registration order (a new tuple when ``sources`` changes).
_todo: tuple[Source, ...] = ()
#: A sampled source that gave no value (switched off, or it raised).
_SKIP = object()
#: Sampled values not yet made rows: (step, rank, ts_ns, sources, values), ``values`` one
#: per source of ``sources`` (the ``_todo`` tuple the sample ran over), ``_SKIP`` where none.
#: Shaped for the garbage collector: the entries wait ~1 s for the flush, and every tracked
#: object among them is scanned by each older-generation collection meanwhile. ``sources``
#: is a tuple that already lived; a metric's number and a table's dict copy of plain values
#: are untracked, and so is ``values`` once a young collection has met it, unless it holds
#: a dict (CPython keeps such tuples tracked). A step with a table leaves two tracked objects,
#: one with metrics only; a list of (source, value) pairs left four. With the native core the
#: entry and its values are untracked at once (``_native.untrack_sample``: nothing they
#: reach refers to them, so they are in no cycle): none is left.
_raw: list[tuple[int, Any, int, tuple[Source, ...], tuple[Any, ...]]] = []
#: Rows recorded on the program's thread (``pprobe.record``, the built-in hooks), not yet
#: given their standard columns: (table, rows, step, rank, ts_ns); ``rows`` may also be a
#: ``(make, args)`` pair whose rows ``make(*args)`` makes at the take (:func:`defer`).
#: :func:`_take_recorded` makes them rows of ``pending`` (and hands them to the taps) off
#: that thread.
_recorded: list[tuple[str, Any, int, Any, int]] = []
#: Held while :func:`_take_recorded` takes and makes rows: the entries are made and handed
#: on in the order they were recorded, whichever thread takes them (the flusher, a flush on
#: the program's thread), so a maker that carries state from row to row sees them in order.
_take_lock = threading.RLock()
#: The same for rows given column by column (:func:`_add_columns`): (table, columns, step,
#: rank, ts_ns).
_recorded_cols: list[tuple[str, dict[str, list[Any]], int, Any, int]] = []
_steps_seen = 0
_every: int | None = None
_active = False
_flusher: _Flusher | None = None


# ---------------------------------------------------------------------- public API
def table(name: Any = None) -> Any:
    """``@table("name")`` (or bare ``@table``): sample this function's rows into python.name.

    The function returns a dict (one row), a list of dicts, a pandas DataFrame, an Arrow table,
    or None (no rows this time)."""
    if callable(name):
        return table(None)(name)

    def deco(fn: Callable[[], Any]) -> Callable[[], Any]:
        register_table(name or fn.__name__, fn)
        return fn

    return deco


def metric(name: Any = None) -> Any:
    """``@metric("name")``: sample this function's number into python.metrics."""
    if callable(name):
        return metric(None)(name)

    def deco(fn: Callable[[], Any]) -> Callable[[], Any]:
        register_metric(name or fn.__name__, fn)
        return fn

    return deco


def register_metric(name: str, fn: Callable[[], Any], owner: str | None = None) -> None:
    check_name(name, "metric")
    if not callable(fn):
        raise ExtensionError(f"metric {name!r}: {fn!r} is not callable")
    with _lock:
        sources[("metric", name)] = Source("metric", name, fn, owner)
        _sources_changed()
    _activate()


def register_table(name: str, data: Any, owner: str | None = None) -> None:
    """A table in schema python: ``data`` a function (sampled like ``@table``), or the data
    itself (a pandas DataFrame, an Arrow table, a dict, a list of dicts), registered as given;
    registering the same name again replaces it."""
    check_name(name)
    if name in RESERVED:
        raise ExtensionError(f"table name {name!r} is pprobe's own; allowed: any other name")
    with _lock:
        if callable(data) and not _is_frame(data):
            static.pop(name, None)
            sources[("table", name)] = Source("table", name, data, owner)
        else:
            sources.pop(("table", name), None)
            static[name] = (_as_arrow(name, data), owner)
        _sources_changed()
    _activate()
    if name in static:
        _write_static(name)


def unregister(kind: str, name: str) -> None:
    """Forget a table or metric (rows already recorded stay)."""
    with _lock:
        sources.pop((kind, name), None)
        if kind == "table":
            static.pop(name, None)
        _sources_changed()


def _sources_changed() -> None:
    """``sources`` changed (called holding ``_lock``): a new tuple for :func:`sample`."""
    global _todo
    _todo = tuple(sources.values())


def record(table: str, row: Any) -> None:
    """Append a row (a dict) or rows (a list of dicts, a DataFrame, an Arrow table) to
    python.table now, with the current step and time.

    The rows are checked and copied here (the program may change its dicts later); their
    standard columns are added off the program's thread (:func:`_take_recorded`)."""
    check_name(table)
    rows = _rows_of(table, row)
    if rows:
        defer(table, [dict(r) for r in rows] if isinstance(row, (dict, list, tuple)) else rows)
    _activate()


def _cut(items: list[Any]) -> list[Any]:
    """What ``items`` holds now, taken out of it: one taker at a time (under ``_lock``);
    the program's threads append without the lock (a list append is atomic), and what they
    append meanwhile stays for the next taker."""
    with _lock:
        batch = items[:]
        del items[: len(batch)]
    return batch


def defer(table: str, rows: Any) -> None:
    """Rows (dicts with str keys, under a valid name, not changed after this call) into
    python.table with the current step, rank and time: one append on the caller's thread.
    They become rows of ``pending`` at the next :func:`_drain` or flush.

    ``rows`` may be a ``(make, args)`` pair instead (pprobe's own code: the built-in
    hooks): ``make(*args)`` returns the rows at that take, off the caller's thread, in the
    order the entries were deferred. What it raises is reported, and it makes no rows."""
    _recorded.append((table, rows, state.step, state.rank, time.time_ns()))


def _stamped(items: list[Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """A deferred list's entries (:func:`defer`, :func:`_add_columns`), taken out of it, as
    (table, rows or columns, their standard columns), in the order they were recorded."""
    if not items:
        return []
    std0 = _std()
    run_id, pid = std0["run_id"], std0["pid"]
    return [(table, got, {"run_id": run_id, "pid": pid, "rank": rank, "step": step,
                          "ts_ns": ts_ns})
            for table, got, step, rank, ts_ns in _cut(items)]  # fmt: skip


def _take_recorded() -> None:
    """The deferred rows (:func:`defer`) with their standard columns, into ``pending`` and
    the taps, in the order they were recorded."""
    with _take_lock:
        for table, rows, std in _stamped(_recorded):
            if type(rows) is tuple:  # (make, args): made now
                try:
                    rows = rows[0](*rows[1])
                except Exception as e:  # noqa: BLE001 - the program goes on
                    _report.internal_error(f"making the rows of python.{table}", e)
                    continue
            if rows:  # the user's column wins over pprobe's
                _add_rows(table, [{**std, **r} for r in rows])


def record_custom_data(data: Any, table: str = "custom_data") -> None:
    """``record`` into python.custom_data (or ``table``)."""
    record(table, data)


# ---------------------------------------------------------------------- rows
_pid: int | None = None  # os.getpid(), cached (reset in a forked child)


def _std() -> dict[str, Any]:
    global _pid
    s = _session()
    if _pid is None:
        _pid = os.getpid()
    return {
        "run_id": s.run.id if s is not None else None,
        "pid": _pid,
        "rank": state.rank,
        "step": state.step,
        "ts_ns": time.time_ns(),
    }


def _add(table: str, rows: list[dict[str, Any]], std: dict[str, Any] | None = None) -> None:
    if not rows:
        return
    if std is None:
        std = _std()
    _add_rows(table, [{**std, **r} for r in rows])  # the user's column wins over pprobe's


def _add_rows(table: str, out: list[dict[str, Any]]) -> None:
    """Rows with their standard columns: to ``pending`` and the taps."""
    with _lock:
        pending.setdefault(table, []).extend(out)
    for tap in taps:
        tap(table, out)


def _add_columns(table: str, cols: dict[str, list[Any]]) -> None:
    """Rows given column by column (lists of one length): the built-in hooks' own (str names,
    plain values, under a valid table name: no check is made; a standard column given wins,
    as in a row). One append on the caller's thread; written column by column at the flush,
    with no dict per row; rows when a tap wants them (:func:`_take_recorded_cols`)."""
    _recorded_cols.append((table, cols, state.step, state.rank, time.time_ns()))


def _take_recorded_cols() -> None:
    """The column chunks given by :func:`_add_columns`, with their standard columns, into
    ``pending_cols`` (or, when a tap wants rows, as rows into ``pending`` and the taps)."""
    for table, cols, std in _stamped(_recorded_cols):
        chunk = (std, cols)
        if taps:
            _add_rows(table, _chunk_rows(chunk))
        else:
            with _lock:
                pending_cols.setdefault(table, []).append(chunk)


def _chunk_rows(chunk: tuple[dict[str, Any], dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """A column chunk's rows, with their standard columns (the chunk's own win)."""
    std, cols = chunk
    names = list(cols)
    return [{**std, **dict(zip(names, vals))} for vals in zip(*cols.values())]


def _take_cols() -> dict[str, list[tuple[dict[str, Any], dict[str, list[Any]]]]]:
    _take_recorded_cols()
    with _lock:
        chunks = dict(pending_cols)
        pending_cols.clear()
    return chunks


def _cols_to_rows() -> None:
    """The column chunks of ``pending_cols`` as rows of ``pending`` (memory, live queries)."""
    chunks = _take_cols()
    with _lock:
        for table, parts in chunks.items():
            dest = pending.setdefault(table, [])
            for chunk in parts:
                dest.extend(_chunk_rows(chunk))


def _table_of_cols(parts: list[tuple[dict[str, Any], dict[str, list[Any]]]]) -> Any:
    """One Arrow table from a table's column chunks (the standard columns first, as
    :func:`build_table` orders a row's); chunks whose names differ go through rows. A
    standard column is one value per chunk: repeated from those values, not from a list of
    a value per row."""
    import numpy as np
    import pyarrow as pa

    names = list(parts[0][1])
    if any(list(c) != names for _s, c in parts):
        return build_table([r for chunk in parts for r in _chunk_rows(chunk)], list(STD_COLUMNS))
    sizes = [len(c[names[0]]) if names else 0 for _s, c in parts]
    n = sum(sizes)
    cols = []
    for k in STD_COLUMNS:  # a column given by name wins over the standard one
        if k in parts[0][1]:
            cols.append(_column(pa, np, list(chain.from_iterable(c[k] for _s, c in parts)), k))
        else:
            cols.append(_repeated(pa, np, k, [std[k] for std, _c in parts], sizes, n))
    own = [k for k in names if k not in _STD_TYPES]
    for k in own:
        cols.append(_column(pa, np, list(chain.from_iterable(c[k] for _s, c in parts)), k))
    return pa.Table.from_arrays(cols, names=[*STD_COLUMNS, *own])


def _repeated(pa: Any, np: Any, name: str, per: list[Any], sizes: list[int], n: int) -> Any:
    """The column whose chunk ``i`` holds ``sizes[i]`` rows of the value ``per[i]``."""
    types = set(map(type, per))
    if types == {int}:
        try:
            data = np.repeat(np.array(per, dtype=np.int64), sizes)
        except OverflowError:
            pass
        else:
            return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(data)])
    if types == {type(None)} and name in _STD_TYPES:
        return pa.nulls(n, getattr(pa, _STD_TYPES[name])())
    if types == {str} and per.count(per[0]) == len(per):
        from ..writer import _texts

        return _texts(pa, np, [per[0]] * n)
    return _column(pa, np, [v for v, m in zip(per, sizes) for _ in range(m)], name)


def _column(pa: Any, np: Any, vals: list[Any], name: str) -> Any:
    """One column of plain values (or values :func:`_norm` makes plain), its type inferred;
    a standard column with no value takes its own type."""
    types = set(map(type, vals))
    if not types <= _PLAIN:
        vals = [_norm(v) for v in vals]
        types = set(map(type, vals))
    a = _array(pa, np, vals, types)
    if name in _STD_TYPES and pa.types.is_null(a.type):
        return pa.nulls(len(vals), getattr(pa, _STD_TYPES[name])())
    return a


def _is_pandas(x: Any) -> bool:
    mod = type(x).__module__  # "pandas.core.frame", or "pandas" (pandas 3)
    return mod == "pandas" or mod.startswith("pandas.")


def _is_frame(x: Any) -> bool:
    return _is_pandas(x) or type(x).__module__.startswith("pyarrow")


def _rows_of(table: str, data: Any) -> list[dict[str, Any]]:
    if data is None:
        return []
    if isinstance(data, dict):
        return [_checked_row(table, data)]
    if isinstance(data, (list, tuple)):
        return [_checked_row(table, r) for r in data]
    if _is_frame(data):
        return list(_as_arrow(table, data).to_pylist())
    raise ExtensionError(
        f"table {table!r}: a row is a dict (or a list of dicts, a DataFrame, an Arrow table); "
        f"got {type(data).__name__}"
    )


def _checked_row(table: str, r: Any) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise ExtensionError(f"table {table!r}: a row is a dict; got {type(r).__name__}")
    if all(type(k) is str for k in r):
        return r  # _add copies it
    return {str(k): v for k, v in r.items()}


def _as_arrow(name: str, data: Any) -> Any:
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False)
    rows = _rows_of(name, data)
    return build_table(rows, [])


# ---------------------------------------------------------------------- type inference
def _norm(v: Any) -> Any:
    """A plain Python value: NumPy scalars and arrays, torch tensors -> numbers and lists."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    tolist = getattr(v, "tolist", None)
    if tolist is not None:
        try:
            return _norm(tolist())
        except Exception:
            pass
    return str(v)


_PLAIN = {type(None), bool, int, float, str, bytes}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int" if -(1 << 63) <= v < (1 << 63) else "big"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, bytes):
        return "bytes"
    return "list"


def _array(pa: Any, np: Any, vals: list[Any], types: set[type] | None = None) -> Any:
    """An Arrow array of plain values, its type inferred: bool, int64, float64 (ints and
    floats mixed), string, binary, list<...> (recursively), null (all None); any other mix
    becomes string. Built from buffers: ``pa.array`` imports pandas into the program."""
    from ..writer import _bools, _ints, _nulls, _texts

    n = len(vals)
    if types is None:
        types = set(map(type, vals))
    if types == {float} or types == {int}:  # the common case, without a Python loop
        try:
            data = np.array(vals, dtype=np.float64 if float in types else np.int64)
            return pa.Array.from_buffers(pa.float64() if float in types else pa.int64(), n,
                                         [None, pa.py_buffer(data)])  # fmt: skip
        except OverflowError:
            pass
    if types == {str}:
        return _texts(pa, np, vals)
    valid_l = [v is not None for v in vals]
    kinds = {_kind(v) for v in vals if v is not None}
    valid = np.array(valid_l, dtype=bool) if n else np.zeros(0, dtype=bool)
    if not kinds:
        return _nulls(pa, n, pa.null()) if n else pa.nulls(0, pa.null())
    if kinds == {"bool"}:
        return _bools(pa, np, [bool(v) for v in vals], valid)
    if kinds <= {"bool", "int"}:
        data = np.array([int(v) if v is not None else 0 for v in vals], dtype=np.int64)
        return _ints(pa, np, data, pa.int64(), valid)
    if kinds <= {"bool", "int", "float", "big"} and "float" in kinds:
        data = np.array([float(v) if v is not None else 0.0 for v in vals], dtype=np.float64)
        ok = valid
        return pa.Array.from_buffers(
            pa.float64(),
            n,
            [
                None if ok.all() else pa.py_buffer(np.packbits(ok, bitorder="little")),
                pa.py_buffer(data),
            ],
        )
    if kinds == {"bytes"}:
        return _texts(pa, np, [v.decode("latin-1") if v is not None else None for v in vals]).cast(
            pa.binary()
        )
    if kinds == {"list"}:
        flat = [x for v in vals if v is not None for x in v]
        child = _array(pa, np, flat)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(v) if v is not None else 0 for v in vals], out=offsets[1:])
        bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(
            pa.list_(child.type), n, [bitmap, pa.py_buffer(offsets)], children=[child]
        )
    return _texts(pa, np, [None if v is None else _text(v) for v in vals])


def _text(v: Any) -> str:
    return v if isinstance(v, str) else str(v)


def build_table(rows: list[dict[str, Any]], first: list[str]) -> Any:
    """Rows (dicts) -> an Arrow table; columns in order of first appearance after ``first``."""
    import numpy as np
    import pyarrow as pa

    with state.internal():
        keys0 = rows[0].keys() if rows else {}.keys()
        names: dict[str, None] = dict.fromkeys(c for c in first if c in keys0)
        names.update(dict.fromkeys(keys0))
        columns: Any = None
        # the common case, every row with the same columns: as many keys in each row, and
        # each row has every name (itemgetter raises KeyError otherwise); transposed in C
        if len(names) > 1 and set(map(len, rows)) == {len(names)}:
            try:
                columns = zip(*map(operator.itemgetter(*names), rows))
            except KeyError:
                columns = None
        if columns is None:
            names = dict.fromkeys(c for c in first if any(c in r for r in rows))
            for r in rows:
                for k in r:
                    names.setdefault(k, None)
            columns = ([r.get(c) for r in rows] for c in names)
        return _from_columns(pa, np, list(names), columns)


def _from_columns(pa: Any, np: Any, names: list[str], columns: Any) -> Any:
    """Columns of plain values (one iterable per name) -> an Arrow table, types inferred."""
    return pa.Table.from_arrays(
        [_column(pa, np, list(col), c) for c, col in zip(names, columns)], names=names
    )


#: The standard columns' types, when a column has no value (all null) to infer one from.
_STD_TYPES = {"run_id": "string", "pid": "int64", "rank": "int64", "step": "int64",
              "ts_ns": "int64"}  # fmt: skip


def unify_types(a: Any, b: Any) -> Any:
    """The type two shards' columns of one name are read as: the same type; the other type
    when one is null; int64 and float64 -> float64; bool and int64 -> int64; lists of
    unifiable items -> list of their unified type; anything else -> string."""
    import pyarrow as pa

    if a == b:
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    nums = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    if any(t(a) for t in nums) and any(t(b) for t in nums):
        if pa.types.is_floating(a) or pa.types.is_floating(b):
            return pa.float64()
        return pa.int64()
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(unify_types(a.value_type, b.value_type))
    return pa.string()


def unify_schemas(schemas: list[Any]) -> Any:
    import pyarrow as pa

    fields: dict[str, Any] = {}
    for s in schemas:
        for f in s:
            fields[f.name] = unify_types(fields[f.name], f.type) if f.name in fields else f.type
    return pa.schema([pa.field(k, v) for k, v in fields.items()])


def conform(tbl: Any, sch: Any) -> Any:
    """``tbl`` (Table or RecordBatch) with the columns of ``sch``: missing ones null, others
    cast (to string through Python where Arrow has no cast)."""
    import pyarrow as pa

    n = tbl.num_rows
    cols = []
    for f in sch:
        i = tbl.schema.get_field_index(f.name)
        if i < 0:
            cols.append(pa.nulls(n, f.type))
            continue
        c = tbl.column(i)
        if c.type == f.type:
            cols.append(c)
            continue
        try:
            cols.append(c.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            vals = c.to_pylist()
            cols.append(pa.array([None if v is None else str(v) for v in vals], pa.string()))
    if isinstance(tbl, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(
            [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols],
            schema=sch,
        )
    return pa.Table.from_arrays(cols, schema=sch)


# ---------------------------------------------------------------------- sampling
def call_guarded(what: str, fn: Callable[..., Any], src: Any, *args: Any, **kw: Any) -> Any:
    """Call a user function; a raise is reported (once on stderr, a python.errors row) and
    counted on ``src`` (``failures`` / ``off``: after :data:`MAX_FAILURES` it is switched off).
    Returns ``_FAILED`` when it raised."""
    local = state.local
    saved = local.depth
    local.depth = state.INTERNAL
    try:
        return fn(*args, **kw)
    except Exception as e:
        note_failure(what, src, e)
        return _FAILED
    finally:
        local.depth = saved


_FAILED = object()


def note_failure(what: str, src: Any, e: BaseException) -> None:
    src.failures += 1
    first = src.failures == 1
    off = src.failures >= MAX_FAILURES
    if off:
        src.off = True
    if first or off:
        event = "switched off" if off else "raised"
        msg = f"{type(e).__name__}: {e}"[:500]
        _report._emit(
            f"pprobe: {what} raised {msg}"
            + (
                f"; switched off after {src.failures} failures."
                if off
                else f"; reported once, switched off after {MAX_FAILURES} failures."
            )
        )
        _add(
            "errors",
            [{"source": what, "event": event, "error": type(e).__name__, "message": msg,
              "failures": src.failures}],
        )  # fmt: skip
        _activate()


def sample(reason: str = "demand") -> None:
    """Call every ``@table`` and ``@metric`` function now; their rows wait for the flush.

    This runs on the program's thread (at a step boundary, say), so it does only what must be
    done now: call the functions (as pprobe's own code: their ops are not recorded), take a
    metric's number, and copy a returned dict (the program may change it later). Checking the
    rows, adding the standard columns and handing them to the exporters' taps wait in
    ``_raw`` for :func:`_drain` (the flusher thread, a live query, the exit)."""
    todo = _todo
    if not todo:
        return
    gots: list[Any] = []
    some = False
    local = state.local
    saved = local.depth
    local.depth = state.INTERNAL
    try:
        for s in todo:
            if s.off:
                gots.append(_SKIP)
                continue
            try:
                got = s.fn()
                if s.kind == "metric":
                    got = None if got is None else float(got)
                elif type(got) is dict:
                    got = dict(got)
                elif isinstance(got, (list, tuple)):
                    got = [dict(r) if type(r) is dict else r for r in got]
                elif got is not None:  # a DataFrame or an Arrow table: rows now
                    got = _rows_of(s.name, got)
            except Exception as e:
                note_failure(s.what, s, e)
                gots.append(_SKIP)
                continue
            gots.append(got)
            some = True
    finally:
        local.depth = saved
    if some:
        entry = (state.step, state.rank, time.time_ns(), todo, tuple(gots))
        if _untrack is not None:  # the native core: no collection scans it before the flush
            _untrack(entry)
        # one list append, atomic under the GIL: no lock on the program's thread
        _raw.append(entry)


_untrack = core.native.untrack_sample if core.native is not None else None


def _take_raw() -> list[tuple[int, Any, int, tuple[Source, ...], tuple[Any, ...]]]:
    return _cut(_raw)


def _pairs(todo: tuple[Source, ...], gots: tuple[Any, ...]) -> list[tuple[Source, Any]]:
    """One sample's (source, value) pairs, the sources that gave none left out."""
    return [(s, g) for s, g in zip(todo, gots) if g is not _SKIP]


def _drain() -> None:
    """Turn the sampled values waiting in ``_raw`` into rows of ``pending``: one hand-off
    per table for the whole batch. The exporters' taps still get each sampled step's rows
    apart (a step's tables, then its metrics), as :func:`_add_rows` gives them."""
    _take_recorded()
    _take_recorded_cols()
    batch = _take_raw()
    if not batch:
        return
    std0 = _std()
    run_id, pid = std0["run_id"], std0["pid"]
    tapped = list(taps)
    out: dict[str, list[dict[str, Any]]] = {}
    str_keys: set[tuple[Any, ...]] = set()  # key sets checked (all str) in this drain
    for step, rank, ts_ns, todo, gots in batch:
        here: dict[str, list[dict[str, Any]]] = {}  # this step's rows, by table
        metrics = []
        for s, got in _pairs(todo, gots):
            std = {"run_id": run_id, "pid": pid, "rank": rank, "step": step, "ts_ns": ts_ns}
            if s.kind == "metric":
                std["name"] = s.name
                std["value"] = got
                metrics.append(std)
                continue
            dest = here.setdefault(s.name, [])
            if type(got) is dict:  # the common case: one row, its keys seen before
                keys = tuple(got)
                if keys in str_keys:
                    std.update(got)  # the user's column wins over pprobe's
                    dest.append(std)
                    continue
                if all(type(k) is str for k in keys):
                    str_keys.add(keys)
            dest.extend(_sampled_rows(s, got, std))
        if metrics:
            here.setdefault("metrics", []).extend(metrics)
        for table, rows in here.items():
            if rows:
                out.setdefault(table, []).extend(rows)
                for tap in tapped:
                    tap(table, rows)
    with _lock:
        for table, rows in out.items():
            pending.setdefault(table, []).extend(rows)


def _sampled_rows(s: Source, got: Any, std: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``@table`` sample's rows with the standard columns (the user's column wins); none
    when the value is not rows (the failure is noted against the source)."""
    try:
        rows = _rows_of(s.name, got)
    except Exception as e:
        note_failure(s.what, s, e)
        return []
    return [{**std, **r} for r in rows]


def _columns_of(
    batch: list[tuple[int, Any, int, tuple[Source, ...], tuple[Any, ...]]],
) -> dict[str, Any]:
    """The flush's way from sampled values to Arrow tables when no tap wants rows: one
    Arrow table per table for the whole batch, built column by column, with no dict per row.

    A ``@table`` whose every sample is one dict with the same (str) keys is transposed at
    once; any other table (lists of rows, frames, changing keys) goes through rows into
    ``pending``, as :func:`_drain` makes them. Metrics always take the column way. The
    tables and their rows are the ones :func:`_drain` and :func:`build_table` would make."""
    import numpy as np
    import pyarrow as pa

    std0 = _std()
    run_id, pid = std0["run_id"], std0["pid"]
    per: dict[str, tuple[list[Any], ...]] = {}  # table -> steps, ranks, ts_ns, values, sources
    metrics: tuple[list[Any], ...] = ([], [], [], [], [])  # the same, names for sources
    steps, ranks, tss, todos, gotss = (list(c) for c in zip(*batch))
    n_steps = len(steps)
    by_source = _by_source(todos, gotss)
    k = 0  # metrics sampled at every step of the batch, source after source
    if by_source is not None:  # the same sources at every step: whole columns at once
        for src, values in by_source:
            if src.kind == "metric":
                k += 1
                for col, part in zip(metrics, (steps, ranks, tss, values, [src.name] * n_steps)):
                    col.extend(part)
            else:
                per[src.name] = (steps, ranks, tss, values, [src] * n_steps)
    else:
        for step, rank, ts_ns, todo, sampled in batch:
            for src, got in _pairs(todo, sampled):
                e: tuple[list[Any], ...] | None
                if src.kind == "metric":
                    e = metrics
                    got_or_name: Any = src.name
                else:
                    e = per.get(src.name)
                    if e is None:
                        e = per[src.name] = ([], [], [], [], [])
                    got_or_name = src
                e[0].append(step)
                e[1].append(rank)
                e[2].append(ts_ns)
                e[3].append(got)
                e[4].append(got_or_name)
    out: dict[str, Any] = {}
    rows_out: dict[str, list[dict[str, Any]]] = {}
    for name, (steps, ranks, tss, gots, srcs) in per.items():
        n = len(gots)
        keys = tuple(gots[0]) if type(gots[0]) is dict else None
        if (
            keys is not None
            and all(type(k) is str for k in keys)
            and set(map(type, gots)) == {dict}
            and set(map(tuple, gots)) == {keys}
        ):
            user: Any = ()
            if len(keys) == 1:
                user = [list(map(operator.itemgetter(keys[0]), gots))]
            elif keys:
                user = zip(*map(operator.itemgetter(*keys), gots))
            std = {"run_id": [run_id] * n, "pid": [pid] * n, "rank": ranks, "step": steps,
                   "ts_ns": tss}  # fmt: skip
            names = [*STD_COLUMNS, *(k for k in keys if k not in std)]
            std.update(zip(keys, user))  # the user's column wins over pprobe's, in its place
            out[name] = _from_columns(pa, np, names, [std[c] for c in names])
            continue
        rows: list[dict[str, Any]] = []
        for step, rank, ts_ns, got, s in zip(steps, ranks, tss, gots, srcs):
            std1 = {"run_id": run_id, "pid": pid, "rank": rank, "step": step, "ts_ns": ts_ns}
            rows.extend(_sampled_rows(s, got, std1))
        if rows:
            rows_out[name] = rows
    if metrics[0]:
        m = len(metrics[0])
        cols: list[Any] = list(metrics)  # steps, ranks, ts_ns, values, names
        if k > 1:  # source after source -> step after step, as the rows are sampled (no
            # pyarrow.compute: its import registers an atexit function, refused at exit)
            order = operator.itemgetter(*np.arange(m).reshape(k, n_steps).T.ravel().tolist())
            cols = [order(c) for c in cols]
        m_steps, m_ranks, m_ts, m_values, m_names = cols
        out["metrics"] = _from_columns(
            pa, np, [*STD_COLUMNS, "name", "value"],
            [[run_id] * m, [pid] * m, m_ranks, m_steps, m_ts, m_names, m_values],
        )  # fmt: skip
    if rows_out:
        with _lock:
            for table, rows in rows_out.items():
                pending.setdefault(table, []).extend(rows)
    return out


def _by_source(
    todos: list[tuple[Source, ...]], gotss: list[tuple[Any, ...]]
) -> list[tuple[Source, list[Any]]] | None:
    """Sampled values as one column per source, when every step sampled the same sources
    and each gave a value (the common case); else None."""
    todo = todos[0]
    if not todo or todos.count(todo) != len(todos):  # the same tuple: identity first
        return None
    cols = list(zip(*gotss))
    skip = id(_SKIP)  # by identity: ``in`` would compare the program's values (arrays)
    if any(skip in map(id, col) for col in cols):
        return None
    return [(s, list(col)) for s, col in zip(todo, cols)]


def on_step(old: int, new: int) -> None:
    """The recorder's step listener: every ``sample_steps`` boundaries, sample (rows carry
    the step that ends, ``old``)."""
    global _steps_seen, _every
    every = _every
    if every is None:  # the session's setting, read once (it does not change while it runs)
        every = _every = _setting("sample_steps", 1)
    if every <= 0 or not sources or old == new:  # pprobe.step(n) at the step it is: no boundary
        return
    _steps_seen += 1
    if _steps_seen % every:
        return
    saved = state.step
    state.step = old  # what the functions record (pprobe.record in a @table) is in ``old``
    try:
        sample("step")
    finally:
        state.step = saved


def _sampled_value(s: Source, got: Any) -> Any:
    """A ``@table``'s value that is neither a dict nor None, as :func:`sample` keeps it (the
    native core's step listener hands these here)."""
    if isinstance(got, (list, tuple)):
        return [dict(r) if type(r) is dict else r for r in got]
    return _rows_of(s.name, got)


_listener: Any = None


def _step_listener() -> Any:
    """The recorder's step listener: the native core's twin of :func:`on_step` (no Python
    frame at a step boundary: ``_native.ext_on_step``), or :func:`on_step` itself."""
    global _listener
    if _listener is None:
        native = core.native
        if native is not None:
            native.ext_setup(globals(), vars(state), on_step, _sampled_value, note_failure, _SKIP)
            _listener = native.ext_on_step
        else:
            _listener = on_step
    return _listener


# ---------------------------------------------------------------------- lifecycle
def _session() -> Any:
    mod = sys.modules.get("pprobe.session")
    return mod.Session.active if mod is not None else None


def _setting(name: str, default: Any) -> Any:
    s = _session()
    return getattr(s.config, name, default) if s is not None else default


def _activate() -> None:
    """First use: the step listener, the exit hook and the flusher thread."""
    global _active, _flusher
    if _active and _flusher is not None:  # the common case: every later row
        return
    if not _active:
        _active = True
        from .. import recorder

        listener = _step_listener()
        if listener not in recorder.step_listeners:
            recorder.step_listeners.append(listener)
    s = _session()
    if s is not None and _flusher is None:
        _flusher = _Flusher(s)
        _flusher.start()


def clear_rows() -> None:
    """Forget the rows not yet written: sampled values, pending rows, rows kept in memory."""
    with _lock:
        _raw.clear()
        _recorded.clear()
        _recorded_cols.clear()
        pending.clear()
        pending_cols.clear()
        memory.clear()


def _after_fork() -> None:
    """A forked child: its parent's unwritten rows and open shards are not its own."""
    global _flusher, _write_lock, _lock, _pid, _fork_locked
    _pid = None
    _fork_locked = False
    _flusher = None  # the next record or stop starts or needs none
    _lock = threading.RLock()  # another thread may have held them at the fork
    _write_lock = threading.Lock()
    clear_rows()
    _sinks.clear()
    _shard_k.clear()


_fork_locked = False


def _before_fork() -> None:
    """Wait for a write in progress: the pprobe-ext thread imports numpy and pyarrow, builds
    and writes under ``_write_lock``, and a child forked in the middle inherits importlib's
    lock on the module held by a thread it does not have (its first import would wait
    forever)."""
    global _fork_locked
    _fork_locked = _write_lock.acquire(timeout=FORK_WAIT_S)


def _after_fork_parent() -> None:
    global _fork_locked
    if _fork_locked:
        _fork_locked = False
        _write_lock.release()


#: Longest a fork waits for a write of the python tables in progress.
FORK_WAIT_S = 5.0

if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork
    )


def stop(exiting: bool = True) -> None:
    """At the session's stop (exit included): sample once more, write everything, close."""
    global _flusher, _every
    _every = None  # the next session's setting
    if not _active:
        return
    if exiting:
        sample("exit")
    st = sys.modules.get("pprobe.ext.settings")
    if st is not None:
        st._persist()  # settings registered before the run started
    f = _flusher
    _flusher = None
    if f is not None:
        f.stop()
    flush()
    with _lock:
        for sink in _sinks.values():
            try:
                sink[0].close()
                sink[1].close()
            except Exception:
                pass
        _sinks.clear()


class _Flusher:
    """The daemon thread that writes pending rows and samples on the time interval."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.stopping = False
        self.event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="pprobe-ext", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.event.set()
        if self.thread is not threading.current_thread() and self.thread.is_alive():
            self.thread.join(timeout=10)

    def _loop(self) -> None:
        state.local.depth = state.INTERNAL
        cfg = self.session.config
        period = float(getattr(cfg, "flush_seconds", 1.0))
        every = float(getattr(cfg, "sample_seconds", 0.0))
        wait = min(period, every) if every > 0 else period
        last = time.monotonic()
        while not self.stopping:
            self.event.wait(wait)
            if self.stopping:
                break
            try:
                if every > 0 and time.monotonic() - last >= every:
                    last = time.monotonic()
                    sample("interval")
                flush()
            except Exception as e:
                _report.internal_error("writing python tables", e)


# ---------------------------------------------------------------------- shards
_sinks: dict[str, tuple[Any, Any, Any]] = {}  # table -> (stream writer, file, schema)
_shard_k: dict[str, int] = {}
_write_lock = threading.Lock()


def _folder(session: Any) -> Any:
    return session.run.folder.subdir("log").subdir("python")


def _host(session: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", session.run.host)


def flush() -> None:
    """Write every pending row (this process's shards); without a run, keep them in memory.

    Sampled values go straight to Arrow columns (:func:`_columns_of`) when the run records
    them and no exporter taps rows; otherwise they become rows first (:func:`_drain`)."""
    s = _session()
    built: dict[str, Any] = {}
    if s is not None and not taps:
        _take_recorded()
        batch = _take_raw()
        if batch:
            # under _write_lock: the first build imports numpy and pyarrow, and a fork waits
            # for it (_before_fork)
            with state.internal(), _write_lock:
                try:
                    built = _columns_of(batch)
                except Exception as e:
                    _report.internal_error("writing the python tables", e)
    else:
        _drain()
    if s is None:
        _cols_to_rows()
    cols = _take_cols()
    with _lock:
        todo = {k: v for k, v in pending.items() if v}
        pending.clear()
    if not todo and not built and not cols:
        return
    if s is None:
        with _lock:
            for t, rows in todo.items():
                kept = memory.setdefault(t, [])
                kept.extend(rows)
                del kept[: max(0, len(kept) - MEMORY_ROWS)]
        return
    with state.internal(), _write_lock:
        for t, rows in todo.items():  # rows made before ``built``'s values were sampled
            try:
                _append(s, t, build_table(rows, list(STD_COLUMNS)))
            except Exception as e:
                _report.internal_error(f"writing python.{t}", e)
        for t, tbl in built.items():
            try:
                _append(s, t, tbl)
            except Exception as e:
                _report.internal_error(f"writing python.{t}", e)
        for t, parts in cols.items():
            try:
                _append(s, t, _table_of_cols(parts))
            except Exception as e:
                _report.internal_error(f"writing python.{t}", e)


def _append(session: Any, name: str, tbl: Any) -> None:
    import pyarrow as pa

    fw = getattr(session, "forwarder", None)  # PPROBE_COLLECTOR (pprobe.collect.client)
    if fw is not None:
        for b in tbl.to_batches():
            fw.submit(f"python.{name}", b)
        if not fw.keep_local:
            return

    sink = _sinks.get(name)
    sch = tbl.schema
    if sink is not None and not sch.equals(sink[2]):
        merged = unify_schemas([sink[2], sch])
        if merged != sink[2]:  # a new column or type: a new shard with the merged schema
            sink[0].close()
            sink[1].close()
            del _sinks[name]
            sink = None
        sch = merged
    elif sink is not None:
        sch = sink[2]
    if sink is None:
        k = _shard_k.get(name, -1) + 1
        folder = _folder(session)
        while True:
            fname = f"{name}-{_host(session)}-{os.getpid()}-{k}.arrows"
            try:
                f = folder.create_for(fname, lambda p: pa.OSFile(p, "ab"))
                break
            except FileExistsError:  # left by an earlier process of the same pid
                k += 1
        folder.close()
        _shard_k[name] = k
        w = pa.ipc.new_stream(f, sch)
        sink = _sinks[name] = (w, f, sch)
    for b in (tbl if tbl.schema.equals(sch) else conform(tbl, sch)).to_batches():
        sink[0].write_batch(b)
    sink[1].flush()


def write_settings(rows: list[dict[str, Any]]) -> None:
    """The registered settings of this process, as ``log/python/_settings-*.static.arrows``."""
    if _session() is None:
        return
    with state.internal():
        try:
            tbl = build_table(rows, []) if rows else None
        except Exception as e:
            _report.internal_error("writing the settings", e)
            return
    if tbl is not None:
        _write_snapshot("_settings", tbl)


def _write_static(name: str) -> None:
    """A ``register_table`` snapshot, replacing this process's earlier one atomically."""
    with _lock:
        got = static.get(name)
    if got is not None:
        _write_snapshot(name, got[0], std_columns=True)


def _write_snapshot(name: str, tbl: Any, std_columns: bool = False) -> None:
    s = _session()
    if s is None:
        return
    import pyarrow as pa

    with state.internal():
        try:
            std = _std()
            for c in STD_COLUMNS if std_columns else ():
                if c not in tbl.column_names:
                    tbl = tbl.append_column(
                        c, build_table([{c: std[c]}] * tbl.num_rows, [c]).column(0)
                    )
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, tbl.schema) as w:
                w.write_table(tbl)
            folder = _folder(s)
            folder.replace_atomic(
                f"{name}-{_host(s)}-{os.getpid()}.static.arrows", sink.getvalue().to_pybytes()
            )
            folder.close()
        except Exception as e:
            _report.internal_error(f"writing python.{name}", e)


def snapshot_memory() -> dict[str, Any]:
    """Rows not written to a run (no session, or still pending) as Arrow tables, by table."""
    _drain()
    _cols_to_rows()
    with _lock:
        rows = {t: list(memory.get(t, [])) + list(pending.get(t, [])) for t in
                set(memory) | set(pending)}  # fmt: skip
        stat = {k: v[0] for k, v in static.items()}
    out = {t: build_table(r, list(STD_COLUMNS)) for t, r in rows.items() if r}
    for k, v in stat.items():
        out.setdefault(k, v)
    return out
