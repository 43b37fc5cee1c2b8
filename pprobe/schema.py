"""The log's Arrow schemas (documented in docs/schema.md; bump SCHEMA_VERSION on any change).

pprobe.logschema describes the same schemas without pyarrow (the writer's own encoder uses it);
a test checks that both agree.

Imported only by the writer thread and the query side, never at start-up (pyarrow is heavy).
"""

from __future__ import annotations

import pyarrow as pa

from .logschema import SCHEMA_VERSION  # noqa: F401  (one version for both descriptions)

OPS = pa.schema(
    [
        ("run_id", pa.string()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("rank", pa.int32()),
        ("world_size", pa.int32()),
        ("seq", pa.int64()),
        ("thread", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("framework", pa.string()),
        ("op", pa.string()),
        ("kind", pa.string()),
        ("ufunc", pa.string()),
        ("status", pa.string()),
        ("caller", pa.string()),
        ("caller_function", pa.string()),
        ("module_path", pa.string()),
        ("phase", pa.string()),
        ("step", pa.int64()),
        ("depth", pa.int32()),
        ("parent", pa.int64()),
        ("args", pa.string()),
        ("stack_id", pa.int64()),
    ]
)

TENSORS = pa.schema(
    [
        ("run_id", pa.string()),
        ("pid", pa.int64()),
        ("seq", pa.int64()),
        ("role", pa.string()),
        ("idx", pa.string()),
        ("shape", pa.list_(pa.int64())),
        ("dtype", pa.string()),
        ("device", pa.string()),
        ("requires_grad", pa.bool_()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("mean", pa.float64()),
        ("std", pa.float64()),
        ("nan_count", pa.int64()),
        ("inf_count", pa.int64()),
        ("dump_path", pa.string()),
        ("note", pa.string()),
        # how the dump is stored (pprobe.codecs; NULL in shards of version 1: plain .npy)
        ("dump_codec", pa.string()),
        ("dump_max_abs_error", pa.float64()),
        ("dump_bytes", pa.int64()),
    ]
)

#: Call stacks (PPROBE_STACK_DEPTH): one row per frame of each stack a process recorded,
#: level 0 the call site (``ops.caller``), 1 its caller, ...
STACKS = pa.schema(
    [
        ("run_id", pa.string()),
        ("pid", pa.int64()),
        ("stack_id", pa.int64()),
        ("level", pa.int32()),
        ("caller", pa.string()),
        ("caller_function", pa.string()),
    ]
)

TABLES = {"ops": OPS, "tensors": TENSORS, "stacks": STACKS}
