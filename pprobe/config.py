"""One configuration object and every setting pprobe reads.

Precedence, lowest to highest: defaults < ``[tool.pprobe]`` in ./pyproject.toml <
./pprobe.toml (or the file named by PPROBE_CONFIG) < PPROBE_* environment variables <
arguments to :func:`pprobe.enable`.  Child processes do not re-read any of this: the parent
serialises the resolved settings into ``PPROBE_RESOLVED`` (see :mod:`pprobe.run`).

Every environment variable is declared once in :data:`SETTINGS`; README's settings table is
checked against it by ``tests/test_config.py``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MODES = ("log", "stats", "dump")
COVERAGES = ("auto", "full", "namespace")
DUMP_FULL = ("wait", "skip")
DUMP_DIRECT = ("auto", "on", "off")
BUFFER_FULL = ("wait", "drop")
LOG_WRITERS = ("auto", "pprobe", "pyarrow")
DUMP_CODECS = ("npy", "zstd", "sparse", "int8", "fp16", "bf16")  # pprobe.codecs.BUILTIN
FRAMEWORKS = ("numpy", "torch")
INTEGRATIONS = ("lightning", "transformers", "accelerate")  # pprobe/integrations/
TORCH_LEVELS = ("api", "aten", "module")
TORCH_PARAMS = ("params", "grads")
SUMMARY_LINE = ("auto", "on", "off")
PERMISSIONS = ("private", "group", "public")  # pprobe.safefs.PERMISSIONS gives their modes
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class ConfigError(ValueError):
    """A setting has a value pprobe cannot use; the message names the setting and what it takes."""


# ---------------------------------------------------------------- parsers (value -> python)
def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ConfigError(f"{name}={v!r} is not valid; allowed: 1/0, true/false, yes/no, on/off")


def _choice(allowed: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(name: str, v: Any) -> str:
        s = str(v).strip().lower()
        if s not in allowed:
            raise ConfigError(f"{name}={v!r} is not valid; allowed: {', '.join(allowed)}")
        return s

    return parse


def _choices(allowed: tuple[str, ...]) -> Callable[[str, Any], tuple[str, ...]]:
    def parse(name: str, v: Any) -> tuple[str, ...]:
        items = _list(name, v)
        bad = [i for i in items if i not in allowed]
        if bad or not items:
            raise ConfigError(
                f"{name}={v!r} is not valid; allowed: a comma-separated list of "
                f"{', '.join(allowed)}"
            )
        return tuple(dict.fromkeys(items))

    return parse


def _subset(allowed: tuple[str, ...]) -> Callable[[str, Any], tuple[str, ...]]:
    """Like :func:`_choices`, but the empty list is allowed (nothing chosen)."""

    def parse(name: str, v: Any) -> tuple[str, ...]:
        items = _list(name, v)
        if not items:
            return ()
        return _choices(allowed)(name, v)

    return parse


def _codec(name: str, v: Any) -> str:
    """A dump codec: a built-in one, or a name a program may register (pprobe.codecs)."""
    s = str(v).strip().lower()
    if not re.fullmatch(r"[a-z0-9_]{1,32}", s):
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: {', '.join(DUMP_CODECS)} or a codec "
            "registered with pprobe.codecs.register"
        )
    return s


def _keep(name: str, v: Any) -> int:
    """PPROBE_DUMP_KEEP: ``all`` (0) or ``steps:K`` (K >= 1), the dump ring's size in steps."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v  # a resolved value handed to a child process
    s = str(v).strip().lower()
    if s in ("all", ""):
        return 0
    kind, _, k = s.partition(":")
    if kind == "steps" and k.strip().isdigit() and int(k) >= 1:
        return int(k)
    raise ConfigError(f"{name}={v!r} is not valid; allowed: all, steps:K (K >= 1)")


def _list(name: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(str(i).strip() for i in v if str(i).strip())
    return tuple(i.strip() for i in str(v).split(",") if i.strip())


def _int(minimum: int) -> Callable[[str, Any], int]:
    def parse(name: str, v: Any) -> int:
        try:
            n = int(str(v).strip()) if not isinstance(v, int) or isinstance(v, bool) else v
        except ValueError:
            n = None
        if n is None or isinstance(n, bool) or n < minimum:
            raise ConfigError(f"{name}={v!r} is not valid; allowed: an integer >= {minimum}")
        return n

    return parse


#: PPROBE_FLUSH_SECONDS' range: below it the writer thread would spin; above it (inf, 1e10)
#: a row could wait for ever, and waits past threading.TIMEOUT_MAX raise in the writer.
FLUSH_SECONDS_RANGE = (0.01, 86400.0)


def _seconds(name: str, v: Any) -> float:
    lo, hi = FLUSH_SECONDS_RANGE
    try:
        f = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        f = math.nan
    if not lo <= f <= hi:  # NaN fails both comparisons
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: a number of seconds from {lo:g} to {hi:g}"
        )
    return f


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def _interval(name: str, v: Any) -> float:
    """0 (off) or a number of seconds in FLUSH_SECONDS_RANGE."""
    try:
        if not isinstance(v, bool) and float(v) == 0:
            return 0.0
    except (TypeError, ValueError):
        pass
    try:
        return _seconds(name, v)
    except ConfigError:
        lo, hi = FLUSH_SECONDS_RANGE
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: 0 (off) or a number of seconds from {lo:g} "
            f"to {hi:g}"
        ) from None


def _size(name: str, v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(v))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: a byte count such as 1073741824, 512MiB, 2GB, 0"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def _str(name: str, v: Any) -> str:
    s = v.strip() if isinstance(v, str) else ""
    if not s:  # a TOML list or number is no path: never str() it into a folder name
        raise ConfigError(f"{name}={v!r} is not valid; allowed: a non-empty path (a string)")
    return s


def collector_url(name: str, v: Any) -> str:
    """PPROBE_COLLECTOR: empty (off) or grpc://host:port, grpc+tcp://host:port, grpc+tls://host:port."""
    s = v.strip() if isinstance(v, str) else ""
    if not s:
        return ""
    m = re.fullmatch(r"grpc(\+tcp|\+tls)?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})", s)
    if not m or not 0 < int(m.group(3)) < 65536:
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: empty (off), grpc://host:port or "
            "grpc+tls://host:port"
        )
    return s


def _path_or_empty(name: str, v: Any) -> str:
    if v == "" or v is None:
        return ""
    return _str(name, v)


#: What ``str(dtype)`` prints for NumPy's and torch's dtypes (torch's without ``torch.``), as
#: the recorder compares them: the sized names, NumPy's type strings ('<U5', '>f8') and
#: datetime units. Checked without importing either framework (start-up imports neither).
_DTYPE_NAME = re.compile(
    r"bool|object|StringDType\(\)|bfloat16|u?int\d{1,2}|float\d{1,3}|complex\d{2,3}"
    r"|float[48]_\w+|bits\w+|qu?int\d+(x\d+)?|(datetime|timedelta)64(\[\d*[a-zA-Z]+\])?"
    r"|[<>|=]?[biufcmMOSUVa]\d+(\[\d*[a-zA-Z]+\])?"
)


def _dtype_names(name: str, v: Any) -> tuple[str, ...]:
    items = tuple(i.removeprefix("torch.") for i in _list(name, v))
    bad = [i for i in items if not _DTYPE_NAME.fullmatch(i)]
    if bad:
        raise ConfigError(
            f"{name}={v!r} is not valid: {bad[0]!r} is no dtype name; allowed: a comma-separated "
            "list of dtype names as str(dtype) prints them, such as float32,float16,bfloat16,"
            "int64,bool,complex64,<U5"
        )
    return tuple(dict.fromkeys(items))


def never_matches(pattern: str) -> str | None:
    """Why an include/exclude glob can match no op name, or None. Op names are dotted Python
    names (``numpy.add``, ``torch.Tensor.add_``, ``pkg.make.<locals>.Net``); fnmatch reads a
    ``[`` without its ``]`` as a literal ``[``."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                return "'[' has no closing ']'"
            i = j + 1
            continue
        if c not in "*?" and not (c.isalnum() or c in "_.<>"):
            return f"{c!r} is in no op name"
        i += 1
    return None


def parse_steps(name: str, v: Any) -> tuple[tuple[int, int], ...]:
    """``"10-12,100"`` -> ((10, 12), (100, 100)); ``""`` -> () meaning every step."""
    if isinstance(v, (list, tuple)) and all(isinstance(i, int) for i in v):
        return tuple((int(i), int(i)) for i in v)
    out = []
    for part in _list(name, v):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(
                f"{name}={v!r} is not valid; allowed: steps and ranges such as 10-12,100"
            )
        lo = int(m.group(1))
        out.append((lo, int(m.group(2)) if m.group(2) is not None else lo))
    return tuple(out)


def nan_allow_patterns(name: str, v: Any) -> tuple[str, ...]:
    """``pprobe nan``'s allowlist: comma-separated op-name globs, each optionally ending in
    ``:mask`` (allowed only when the op's array inputs are a 0/1 mask). Checked here so that a
    wrong value names its variable, like every setting."""
    items = _list(name, v)
    for item in items:
        pattern, _, cond = item.partition(":")
        why = never_matches(pattern) if pattern else "it is empty"
        if why is None and cond not in ("", "mask"):
            why = f"{':' + cond!r} is no condition (only :mask is)"
        if why is not None:
            raise ConfigError(
                f"{name}={v!r} is not valid: {item!r} can match no op ({why}); allowed: a "
                "comma-separated list of glob patterns over op names, each optionally ending "
                "in :mask, such as torch.Tensor.masked_fill,numpy.where,numpy.log:mask"
            )
    return tuple(dict.fromkeys(items))


_STEP_AT_FUNC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def parse_step_at(name: str, v: Any) -> tuple[str, ...]:
    """``pkg.mod:func`` (each call is a step) or ``file.py:LINE`` (each run of the line)."""
    items = _list(name, v)
    for item in items:
        path, _, line = item.rpartition(":")
        if path and line.isdigit() and int(line) > 0:
            continue
        if _STEP_AT_FUNC.fullmatch(item):
            continue
        raise ConfigError(
            f"{name}={v!r} is not valid: {item!r}; allowed: comma-separated `pkg.mod:func` "
            "(each call of the function is a step) or `file.py:LINE` (each run of the line)"
        )
    return items


def parse_hooks(name: str, v: Any) -> tuple[dict[str, Any], ...]:
    """``[[hooks]]`` tables (TOML), or the path of a YAML/TOML/JSON file holding a ``hooks``
    list. Each entry is a table with a string ``type``; its other keys are the hook's
    parameters, checked when the hooks are built (pprobe.hooks.config)."""
    src = name
    if isinstance(v, str):
        path = v.strip()
        if not path:
            return ()
        v = _hooks_file(name, path)
        src = f"{name} ({path})"
    if isinstance(v, dict):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ConfigError(
            f"{name}={v!r} is not valid; allowed: [[hooks]] tables with a type, or the path "
            "of a YAML, TOML or JSON file with a hooks list"
        )
    out = []
    for i, entry in enumerate(v):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ConfigError(
                f"{src}: entry {i + 1} ({entry!r}) is not valid; allowed: a table with a "
                'string type, such as {type = "TimeTrackingHook", frequency = 10}'
            )
        out.append(dict(entry))
    return tuple(out)


def _hooks_file(name: str, path: str) -> Any:
    if not os.path.isfile(path):
        raise ConfigError(f"{name}={path!r} is not valid; allowed: an existing hooks file")
    try:
        if path.endswith((".yaml", ".yml")):
            try:
                import yaml
            except ModuleNotFoundError:
                raise ConfigError(
                    f"{name}={path!r}: reading YAML needs PyYAML; allowed: pip install pyyaml, "
                    "or [[hooks]] tables in pprobe.toml"
                ) from None
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        elif path.endswith(".json"):
            import json

            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        else:
            data = _read_toml(path)
    except ConfigError:
        raise
    except Exception as e:  # yaml.YAMLError, JSONDecodeError, TOMLDecodeError, OSError
        raise ConfigError(f"{name}={path!r} cannot be read: {e}") from None
    if isinstance(data, dict):
        data = data.get("hooks", data.get("tool", {}).get("pprobe", {}).get("hooks"))
    if data is None:
        raise ConfigError(f"{name}={path!r} is not valid; allowed: a file with a hooks list")
    return data


# ---------------------------------------------------------------- the settings table
@dataclass(frozen=True)
class Setting:
    field: str
    env: str
    default: Any
    parse: Callable[[str, Any], Any]
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "enabled",
        "PPROBE",
        False,
        _bool,
        "Turn the probe on (1) or off (0). 0 is a kill switch that wins over everything.",
    ),
    Setting(
        "mode",
        "PPROBE_MODE",
        "dump",
        _choice(MODES),
        "log: op rows with shapes and dtypes; stats: + min/max/mean/std/nan/inf counts; "
        "dump: + .npy files of inputs and outputs.",
    ),
    Setting(
        "output",
        "PPROBE_OUTPUT",
        "np_op_dumps",
        _str,
        "Folder that receives one sub-folder per run and a `latest` pointer.",
    ),
    Setting(
        "budget",
        "PPROBE_BUDGET",
        1024**3,
        _size,
        "Bytes of .npy dumps per run (all processes together). Past it dumping stops; "
        "logging goes on.",
    ),
    Setting(
        "dump_queue",
        "PPROBE_DUMP_QUEUE",
        32 * 1024**2,
        _size,
        "Memory for dumps waiting to be written (copies of the values at call time). A "
        "writer thread empties it off the program's threads.",
    ),
    Setting(
        "dump_full",
        "PPROBE_DUMP_FULL",
        "wait",
        _choice(DUMP_FULL),
        "When the dump queue is full: wait (the recording thread waits for room; every dump "
        "is kept) or skip (that dump is not written; its row says why).",
    ),
    Setting(
        "dump_codec",
        "PPROBE_DUMP_CODEC",
        "npy",
        _codec,
        "How dumps are stored: npy (plain .npy files), zstd (lossless), sparse (lossless COO "
        "when sparse), int8, fp16, bf16 (lossy, max error in the row) or a codec registered "
        "with pprobe.codecs.register. See docs/codecs.md.",
    ),
    Setting(
        "dump_pack",
        "PPROBE_DUMP_PACK",
        1 << 20,
        _size,
        "Dumps of at most this many bytes (.npy header + data) are appended to one pack file "
        "per process (<run>/.packs/*.npk) instead of one file each; rows keep the file name "
        "and pprobe.load / `pprobe export --npy` read them. 0: every dump is its own file. "
        "Ignored (files) with PPROBE_DUMP_KEEP=steps:K and PPROBE_ON_NAN=dump. docs/output.md.",
    ),
    Setting(
        "dump_direct",
        "PPROBE_DUMP_DIRECT",
        "auto",
        _choice(DUMP_DIRECT),
        "How the native writer writes dumps of 256 KiB and more that get a file each: auto "
        "(one of its two threads with O_DIRECT, the other through the page cache or O_DIRECT, "
        "whichever its recent files wrote faster), on (O_DIRECT where the file system takes "
        "it) or off (the page cache). docs/output.md.",
    ),
    Setting(
        "dump_keep",
        "PPROBE_DUMP_KEEP",
        0,
        _keep,
        "all: keep every dump (within the budget); steps:K: a ring buffer of the dumps of the "
        "last K steps, each process deleting older ones as it goes (freed bytes go back to "
        "the budget). docs/output.md.",
    ),
    Setting(
        "stack_depth",
        "PPROBE_STACK_DEPTH",
        3,
        _int(1),
        "Program frames recorded per call (the innermost first: the call site, its caller, "
        "...), interned: a row holds one stack id, the `stacks` view lists the frames.",
    ),
    Setting(
        "include",
        "PPROBE_INCLUDE",
        (),
        _list,
        "Comma-separated glob patterns of op names to capture (e.g. `numpy.linalg.*,*matmul`)."
        " Empty: all.",
    ),
    Setting(
        "exclude",
        "PPROBE_EXCLUDE",
        (),
        _list,
        "Comma-separated glob patterns of op names never captured.",
    ),
    Setting(
        "every", "PPROBE_EVERY", 1, _int(1), "Capture every N-th call of each op (1: every call)."
    ),
    Setting(
        "first",
        "PPROBE_FIRST",
        0,
        _int(0),
        "Capture only the first N calls of each op (0: no limit).",
    ),
    Setting(
        "steps",
        "PPROBE_STEPS",
        (),
        parse_steps,
        "Step window such as `10-12,100`: capture only during those steps. Empty: all.",
    ),
    Setting(
        "dtypes",
        "PPROBE_DTYPES",
        (),
        _dtype_names,
        "Capture only calls whose array inputs (or outputs, when there are no array inputs) "
        "have one of these dtypes, e.g. `float32,float16`. Empty: all.",
    ),
    Setting(
        "nested",
        "PPROBE_NESTED",
        False,
        _bool,
        "Also record calls made inside other recorded calls, with depth and parent.",
    ),
    Setting(
        "frameworks",
        "PPROBE_FRAMEWORKS",
        FRAMEWORKS,
        _choices(FRAMEWORKS),
        "Which frameworks to probe when the program imports them.",
    ),
    Setting(
        "integrations",
        "PPROBE_INTEGRATIONS",
        INTEGRATIONS,
        _subset(INTEGRATIONS),
        "Training frameworks whose boundaries and logged metrics pprobe follows when the "
        "program imports them (docs/integrations.md): lightning, transformers, accelerate; "
        "empty: none.",
    ),
    Setting(
        "coverage",
        "PPROBE_COVERAGE",
        "auto",
        _choice(COVERAGES),
        "NumPy coverage: full (operators and ndarray methods too), namespace (np.* only), "
        "auto (full where the interpreter self-test passes).",
    ),
    Setting(
        "torch_levels",
        "PPROBE_TORCH_LEVEL",
        ("api",),
        _choices(TORCH_LEVELS),
        "PyTorch capture levels: api (__torch_function__), aten (dispatcher, backward "
        "included), module (one row per nn.Module call).",
    ),
    Setting(
        "torch_params",
        "PPROBE_TORCH_PARAMS",
        (),
        _subset(TORCH_PARAMS),
        "PyTorch parameters and gradients: params (each module row also describes the "
        "module's own parameters; needs the module level), grads (one row per parameter "
        "gradient as backward accumulates it). Empty: neither.",
    ),
    Setting(
        "on_nan",
        "PPROBE_ON_NAN",
        "off",
        _choice(("off", "warn", "raise", "dump")),
        "At the first op that makes NaN or inf from finite inputs (stats and dump modes; "
        "infs of ops on pprobe nan's allowlist are expected): "
        "off; warn (a RuntimeWarning at the program's line); raise (FloatingPointError from "
        "the op's call); dump (dump mode: keep the full dumps of that step and of the K steps "
        "before it, K from PPROBE_DUMP_KEEP=steps:K or 1, even past the budget). The rows so "
        "far are flushed first. docs/nan.md.",
    ),
    Setting(
        "sync",
        "PPROBE_SYNC",
        False,
        _bool,
        "Synchronise the accelerator around each op for device-accurate timings.",
    ),
    Setting(
        "flush_rows",
        "PPROBE_FLUSH_ROWS",
        16384,
        _int(1),
        "Rows buffered before a batch is written to the log.",
    ),
    Setting(
        "buffer_rows",
        "PPROBE_BUFFER_ROWS",
        65536,
        _int(1),
        "Rows the record buffer holds while the writer is busy (about 400 bytes each); the "
        "memory of the log side is bounded by twice that.",
    ),
    Setting(
        "buffer_full",
        "PPROBE_BUFFER_FULL",
        "wait",
        _choice(BUFFER_FULL),
        "When the record buffer is full: wait (the recording thread waits for the writer, "
        "nothing is lost) or drop (rows are dropped and counted in meta.json and in the log "
        "as `pprobe.rows_dropped` rows).",
    ),
    Setting(
        "log_writer",
        "PPROBE_LOG_WRITER",
        "auto",
        _choice(LOG_WRITERS),
        "Who encodes the log's shards: pprobe (its own Arrow IPC encoder: pyarrow is never "
        "imported into the program to write the log; uncompressed), pyarrow (pyarrow's writer, "
        "LZ4-compressed), auto (pyarrow where the process needs it anyway, a collector's tap "
        "(PPROBE_COLLECTOR); pprobe otherwise). meta.json's core.log_writer says which ran.",
    ),
    Setting(
        "flush_seconds",
        "PPROBE_FLUSH_SECONDS",
        1.0,
        _seconds,
        "Longest time a recorded row waits before it is written (0.01 to 86400).",
    ),
    Setting(
        "permissions",
        "PPROBE_PERMISSIONS",
        "private",
        _choice(PERMISSIONS),
        "Who may read a run's folders and files: private (folders 0700, files 0600: dumps "
        "hold your data), group (0750/0640), public (0755/0644).",
    ),
    Setting(
        "summary_line",
        "PPROBE_SUMMARY_LINE",
        "auto",
        _choice(SUMMARY_LINE),
        "One line on stderr as a run ends (run folder, ops, dumps and bytes, pprobe's "
        "errors): auto (when stderr is a terminal), on, off.",
    ),
    Setting(
        "nan_allow",
        "PPROBE_NAN_ALLOW",
        (),
        nan_allow_patterns,
        "`pprobe nan`: more ops whose inf outputs are expected (not NaN/inf origins), added to "
        "its built-in allowlist: comma-separated globs such as `*masked_fill*,numpy.log:mask` "
        "(`:mask`: only when the op's inputs are a 0/1 mask). Read by `pprobe nan` only.",
    ),
    Setting(
        "sample_steps",
        "PPROBE_SAMPLE_STEPS",
        1,
        _int(0),
        "Sample `@table` and `@metric` functions every N step boundaries (0: never at steps).",
    ),
    Setting(
        "sample_seconds",
        "PPROBE_SAMPLE_SECONDS",
        0.0,
        _interval,
        "Also sample `@table` and `@metric` functions every this many seconds, from pprobe's "
        "thread (0: off).",
    ),
    Setting(
        "plugins",
        "PPROBE_PLUGINS",
        (),
        _list,
        "Comma-separated plugins loaded at start-up: entry points of the group "
        "`pprobe.plugins` or module paths (`pkg.mod`, `pkg.mod:Class`); `*`: every entry point.",
    ),
    Setting(
        "live",
        "PPROBE_LIVE",
        "off",
        _choice(("off", "unix", "tcp")),
        "The live endpoint `pprobe query --live` asks: off, unix (a socket in the run folder; "
        "loopback TCP where its path is too long) or tcp (127.0.0.1). A token in an owner-only "
        "file guards it; it runs read-only SQL over the run only.",
    ),
    Setting(
        "collector",
        "PPROBE_COLLECTOR",
        "",
        collector_url,
        "Stream every process's log batches to a `pprobe collect` server: grpc://host:port or "
        "grpc+tls://host:port (empty: off). docs/distributed.md.",
    ),
    Setting(
        "collector_token_file",
        "PPROBE_COLLECTOR_TOKEN_FILE",
        "",
        _path_or_empty,
        "File holding the collector's token (sent as a bearer header, never printed).",
    ),
    Setting(
        "collector_tls_root",
        "PPROBE_COLLECTOR_TLS_ROOT",
        "",
        _path_or_empty,
        "PEM file of the certificate(s) that grpc+tls:// trusts (a self-signed collector's "
        "own certificate); empty: the system's roots.",
    ),
    Setting(
        "collector_local",
        "PPROBE_COLLECTOR_LOCAL",
        "keep",
        _choice(("keep", "drop")),
        "With a collector: keep the local log shards too, or drop them (meta.json and dumps "
        "stay local).",
    ),
    Setting(
        "collector_dumps",
        "PPROBE_COLLECTOR_DUMPS",
        False,
        _bool,
        "With a collector: send the .npy dumps too (encoded by a codec).",
    ),
    Setting(
        "collector_spool",
        "PPROBE_COLLECTOR_SPOOL",
        "",
        _path_or_empty,
        "Folder where batches wait while the collector is unreachable (empty: `.spool/` in "
        "the run folder). `pprobe collect --resend` sends what is left.",
    ),
    Setting(
        "collector_spool_bytes",
        "PPROBE_COLLECTOR_SPOOL_BYTES",
        1024**3,
        _size,
        "Bytes the spool may hold per process; past it batches are dropped and counted "
        "(meta.json `collector.rows_dropped`).",
    ),
    Setting(
        "collector_retries",
        "PPROBE_COLLECTOR_RETRIES",
        3,
        _int(1),
        "Tries per send (exponential backoff with jitter between them) before its batches "
        "go to the spool.",
    ),
    Setting(
        "collector_breaker_failures",
        "PPROBE_COLLECTOR_BREAKER_FAILURES",
        3,
        _int(1),
        "Consecutive failed sends that open the circuit breaker (no more tries; batches spool).",
    ),
    Setting(
        "collector_breaker_seconds",
        "PPROBE_COLLECTOR_BREAKER_SECONDS",
        5.0,
        _seconds,
        "How long the breaker stays open before one trial send (half-open).",
    ),
    Setting(
        "collector_drain_seconds",
        "PPROBE_COLLECTOR_DRAIN_SECONDS",
        10.0,
        _interval,
        "At exit, the longest wait for unsent batches to reach the collector; the rest stays "
        "in the spool (0: no wait).",
    ),
    Setting(
        "hooks",
        "PPROBE_HOOKS",
        (),
        parse_hooks,
        "Lifecycle hooks (docs/hooks.md): `[[hooks]]` tables in pprobe.toml, each with a `type` "
        "and its parameters, or the path of a YAML/TOML/JSON file with a `hooks` list.",
    ),
    Setting(
        "hook_modules",
        "PPROBE_HOOK_MODULES",
        (),
        _list,
        "Comma-separated modules imported before the hooks are built: their "
        "`@HookRegistry.register` classes become hook types.",
    ),
    Setting(
        "step_at",
        "PPROBE_STEP_AT",
        (),
        parse_step_at,
        "Zero-code steps for loops without an optimizer (NumPy too): `pkg.mod:func` (each call "
        "is a step) or `file.py:LINE` (each run of that line starts a step). Comma-separated.",
    ),
    Setting(
        "strict",
        "PPROBE_STRICT",
        False,
        _bool,
        "Make a configuration error fatal instead of running the program unprobed.",
    ),
)
BY_FIELD = {s.field: s for s in SETTINGS}
BY_ENV = {s.env: s for s in SETTINGS}
# Variables pprobe reads that are not settings of their own.
OTHER_ENV = {
    "PPROBE_CORE": "Recording engine: auto (the native core where it is built and supported, "
    "else Python), native, python. Read from the environment when pprobe is first imported; "
    "meta.json's `core` says which ran and why.",
    "PPROBE_CONFIG": "Path of a TOML config file to read instead of ./pprobe.toml.",
    "PPROBE_RESOLVED": "Internal: resolved settings and run folder handed to child processes.",
}


@dataclass(frozen=True)
class Config:
    """Resolved settings. Field defaults mirror :data:`SETTINGS`."""

    enabled: bool = False
    mode: str = "dump"
    output: str = "np_op_dumps"
    budget: int = 1024**3
    dump_queue: int = 32 * 1024**2
    dump_full: str = "wait"
    dump_codec: str = "npy"
    dump_pack: int = 1 << 20
    dump_direct: str = "auto"
    dump_keep: int = 0
    stack_depth: int = 3
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    every: int = 1
    first: int = 0
    steps: tuple[tuple[int, int], ...] = ()
    dtypes: tuple[str, ...] = ()
    nested: bool = False
    frameworks: tuple[str, ...] = FRAMEWORKS
    integrations: tuple[str, ...] = INTEGRATIONS
    coverage: str = "auto"
    torch_levels: tuple[str, ...] = ("api",)
    torch_params: tuple[str, ...] = ()
    on_nan: str = "off"
    sync: bool = False
    flush_rows: int = 16384
    buffer_rows: int = 65536
    buffer_full: str = "wait"
    log_writer: str = "auto"
    flush_seconds: float = 1.0
    permissions: str = "private"
    summary_line: str = "auto"
    nan_allow: tuple[str, ...] = ()
    sample_steps: int = 1
    sample_seconds: float = 0.0
    plugins: tuple[str, ...] = ()
    live: str = "off"
    collector: str = ""
    collector_token_file: str = ""
    collector_tls_root: str = ""
    collector_local: str = "keep"
    collector_dumps: bool = False
    collector_spool: str = ""
    collector_spool_bytes: int = 1024**3
    collector_retries: int = 3
    collector_breaker_failures: int = 3
    collector_breaker_seconds: float = 5.0
    collector_drain_seconds: float = 10.0
    hooks: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    hook_modules: tuple[str, ...] = ()
    step_at: tuple[str, ...] = ()
    strict: bool = False
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["steps"] = [list(s) for s in self.steps]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Config:
        d = dict(d)
        d["steps"] = tuple(tuple(s) for s in d.get("steps", ()))
        for k in (
            "include",
            "exclude",
            "dtypes",
            "frameworks",
            "integrations",
            "torch_levels",
            "torch_params",
            "nan_allow",
            "plugins",
            "hooks",
            "hook_modules",
            "step_at",
        ):
            if k in d:
                d[k] = tuple(d[k])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def step_selected(self, step: int) -> bool:
        return not self.steps or any(lo <= step <= hi for lo, hi in self.steps)

    def op_selected(self, name: str) -> bool:
        """Include/exclude patterns match the qualified name (numpy.add) or the last part (add)."""
        short = name.rsplit(".", 1)[-1]

        def hit(pats: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(name, p) or fnmatchcase_short(short, p) for p in pats)

        if self.include and not hit(self.include):
            return False
        return not hit(self.exclude)


def fnmatchcase_short(short: str, pattern: str) -> bool:
    return "." not in pattern and fnmatch.fnmatchcase(short, pattern)


# ---------------------------------------------------------------- loading
def _toml_parser() -> Any:
    """tomllib (3.11+), else tomli (a dependency on 3.10), else None. Imported only when a file
    exists: keeps start-up lean."""
    try:
        import tomllib

        return tomllib
    except ModuleNotFoundError:
        pass
    try:
        import tomli

        return tomli
    except ModuleNotFoundError:
        return None


def _read_toml(path: str, is_pyproject: bool = False) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    parser = _toml_parser()
    if parser is None:
        # As coverage.py does: a pyproject.toml that says nothing of pprobe needs no parser.
        if is_pyproject and b"pprobe" not in raw:
            return {}
        raise ConfigError(
            f"{path}: reading it needs tomli on Python < 3.11; allowed: pip install tomli, "
            "or settings in PPROBE_* variables"
        )
    data: dict[str, Any] = parser.loads(raw.decode("utf-8"))
    return data


def _candidates(cwd: str | None, env: Mapping[str, str]) -> list[tuple[str, bool]]:
    """(path, is_pyproject) of the files to read, lowest precedence first."""
    cwd = cwd or os.getcwd()
    pyproject = os.path.join(cwd, "pyproject.toml")
    explicit = env.get("PPROBE_CONFIG")
    candidates: list[tuple[str, bool]] = []
    if os.path.isfile(pyproject):
        candidates.append((pyproject, True))
    if explicit:
        if not os.path.isfile(explicit):
            raise ConfigError(
                f"PPROBE_CONFIG={explicit!r} is not valid; allowed: an existing TOML file"
            )
        candidates.append((explicit, False))
    elif os.path.isfile(os.path.join(cwd, "pprobe.toml")):
        candidates.append((os.path.join(cwd, "pprobe.toml"), False))
    return candidates


def _table(path: str, is_pyproject: bool) -> dict[str, Any]:
    """pprobe's table of one file: all of pprobe.toml, ``[tool.pprobe]`` of pyproject.toml."""
    try:
        data = _read_toml(path, is_pyproject)
    except ConfigError:
        raise
    except Exception as e:  # tomllib.TOMLDecodeError, OSError, UnicodeDecodeError
        raise ConfigError(f"{path}: cannot be read as TOML: {e}") from None
    if not is_pyproject:
        return data
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(
            f"{path}: tool = {tool!r} is not valid; allowed: a table ([tool.pprobe] holds "
            "pprobe's settings)"
        )
    table = tool.get("pprobe", {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"{path}: [tool] pprobe = {table!r} is not valid; allowed: a table [tool.pprobe] "
            'of settings such as mode = "log"'
        )
    return table


def file_values(
    cwd: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """Values from pyproject.toml [tool.pprobe] then pprobe.toml / PPROBE_CONFIG (later wins)."""
    out: dict[str, tuple[Any, str]] = {}
    for path, is_pyproject in _candidates(cwd, os.environ if env is None else env):
        for key, value in _table(path, is_pyproject).items():
            if key not in BY_FIELD and isinstance(value, dict):
                continue  # [my_plugin]: settings extensions register (pprobe.ext.settings)
            if key not in BY_FIELD:
                raise ConfigError(
                    f"{path}: unknown setting {key!r}; allowed: {', '.join(sorted(BY_FIELD))}"
                )
            out[key] = (value, path)
    return out


def strict_requested(env: Mapping[str, str] | None = None, cwd: str | None = None) -> str | None:
    """After a :class:`ConfigError`: the setting that makes it fatal (``PPROBE_STRICT=1``,
    ``strict = true (path)``), or None. Each layer is read on its own, so ``strict = true``
    counts even when another line of its file is the error; the environment wins."""
    env = os.environ if env is None else env
    if "PPROBE_STRICT" in env:
        try:
            return "PPROBE_STRICT=1" if _bool("PPROBE_STRICT", env["PPROBE_STRICT"]) else None
        except ConfigError:
            return None
    found = None
    try:
        candidates = _candidates(cwd, env)
    except ConfigError:
        candidates = []
    for path, is_pyproject in candidates:
        try:
            table = _table(path, is_pyproject)
            if "strict" in table:
                found = f"strict = true ({path})" if _bool("strict", table["strict"]) else None
        except ConfigError:
            continue
    return found


def load(
    overrides: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Config:
    """Resolve the configuration. Raises :class:`ConfigError` naming the first bad setting."""
    if env is None:
        env = os.environ
    raw: dict[str, tuple[Any, str]] = {}
    raw.update(file_values(cwd, env))
    for s in SETTINGS:
        if s.env in env:
            raw[s.field] = (env[s.env], "env " + s.env)
    # PPROBE_A__B: a setting an extension registers (pprobe.ext.settings), checked there.
    unknown = [
        k
        for k in env
        if k.startswith("PPROBE_") and k not in BY_ENV and k not in OTHER_ENV and "__" not in k
    ]
    if unknown:
        close = ", ".join(sorted(BY_ENV))
        raise ConfigError(
            f"{unknown[0]} is not a pprobe setting; known variables: {close}, "
            + ", ".join(OTHER_ENV)
        )
    if "PPROBE_CORE" in env:
        _choice(("auto", "native", "python"))("PPROBE_CORE", env["PPROBE_CORE"])
    for k, v in (overrides or {}).items():
        if k not in BY_FIELD:
            raise ConfigError(f"unknown setting {k!r}; allowed: {', '.join(sorted(BY_FIELD))}")
        raw[k] = (v, "argument")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for k, (v, src) in raw.items():
        s = BY_FIELD[k]
        label = s.env if src.startswith("env") else f"{k} (from {src})"
        values[k] = s.parse(label, v)
        sources[k] = src
        if k in ("include", "exclude"):
            for pattern in values[k]:
                why = never_matches(pattern)
                if why is not None:
                    from . import _report

                    _report.warn_once(
                        f"pattern {label} {pattern}",
                        f"{label} pattern {pattern!r} can never match an op name ({why}); "
                        "allowed: glob patterns (*, ?, [abc]) over dotted names such as "
                        "numpy.linalg.*,*matmul.",
                    )
    return Config(**values, sources=sources)


# ---------------------------------------------------------------- settings of extensions
def register(name: str, default: Any = None, type: Any = None, help: str = "") -> Any:
    """Declare an extension's setting ``ns.name`` (docs/extending.md); returns its value.

    Read from ``[tool.pprobe.ns]`` / ``[ns]`` of the config files and ``PPROBE_NS__NAME``,
    with the precedence of pprobe's own settings."""
    from .ext import settings

    return settings.register(name, default, type, help)


def get(name: str) -> Any:
    """The value of a registered setting, or of pprobe's own (``mode``, ...)."""
    from .ext import settings

    return settings.get(name)


def set(name: str, value: Any) -> Any:  # noqa: A001 - config.set is the API's name
    """Set a registered setting (highest precedence); returns the parsed value."""
    from .ext import settings

    return settings.set(name, value)
