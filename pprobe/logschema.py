"""The log's three schemas without pyarrow: (name, type) per column, in order.

The writer encodes the shards from these (:mod:`pprobe.arrowipc`) and never imports pyarrow on
that path; :mod:`pprobe.schema` holds the same schemas as pyarrow objects for the query side
(tests/test_ipc_writer.py checks that both say the same). Every column is nullable; a
``list<int64>``'s values are a nullable int64 field named ``item`` (pyarrow's default).
"""

from __future__ import annotations

#: A string column of few distinct values (names, call sites, dtypes): written as int32
#: indices into the stream's one dictionary (pprobe.arrowipc); readers see strings.
DICT = "dict<utf8>"

SCHEMA_VERSION = "3"  # 2: tensors.dump_codec, dump_max_abs_error, dump_bytes; 3: stacks

OPS: tuple[tuple[str, str], ...] = (
    ("run_id", "utf8"),
    ("host", "utf8"),
    ("pid", "int64"),
    ("rank", "int32"),
    ("world_size", "int32"),
    ("seq", "int64"),
    ("thread", DICT),
    ("ts_ns", "int64"),
    ("dur_ns", "int64"),
    ("framework", DICT),
    ("op", DICT),
    ("kind", DICT),
    ("ufunc", DICT),
    ("status", DICT),
    ("caller", DICT),
    ("caller_function", DICT),
    ("module_path", DICT),
    ("phase", DICT),
    ("step", "int64"),
    ("depth", "int32"),
    ("parent", "int64"),
    ("args", "utf8"),
    ("stack_id", "int64"),
)

TENSORS: tuple[tuple[str, str], ...] = (
    ("run_id", "utf8"),
    ("pid", "int64"),
    ("seq", "int64"),
    ("role", DICT),
    ("idx", DICT),
    ("shape", "list<int64>"),
    ("dtype", DICT),
    ("device", DICT),
    ("requires_grad", "bool"),
    ("min", "float64"),
    ("max", "float64"),
    ("mean", "float64"),
    ("std", "float64"),
    ("nan_count", "int64"),
    ("inf_count", "int64"),
    ("dump_path", "utf8"),
    ("note", "utf8"),
    ("dump_codec", "utf8"),
    ("dump_max_abs_error", "float64"),
    ("dump_bytes", "int64"),
)

STACKS: tuple[tuple[str, str], ...] = (
    ("run_id", "utf8"),
    ("pid", "int64"),
    ("stack_id", "int64"),
    ("level", "int32"),
    ("caller", DICT),
    ("caller_function", DICT),
)

TABLES = {"ops": OPS, "tensors": TENSORS, "stacks": STACKS}
