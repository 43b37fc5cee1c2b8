"""``pprobe run``'s flags: one per setting of :data:`pprobe.config.SETTINGS` (plus ``--core``
and ``--config``), each checked with the setting's own parser before the program starts, so
``pprobe run --mode wrong -- python x.py`` exits 2 with one line instead of running the
program unprobed.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import config

#: Allowed values of the settings that take names, shown in --help.
ALLOWED: dict[str, tuple[str, ...]] = {
    "mode": config.MODES,
    "dump_full": config.DUMP_FULL,
    "dump_direct": config.DUMP_DIRECT,
    "dump_codec": config.DUMP_CODECS,
    "buffer_full": config.BUFFER_FULL,
    "coverage": config.COVERAGES,
    "permissions": config.PERMISSIONS,
    "summary_line": config.SUMMARY_LINE,
    "frameworks": config.FRAMEWORKS,
    "torch_levels": config.TORCH_LEVELS,
    "torch_params": config.TORCH_PARAMS,
}
#: Settings that pprobe run sets itself.
SKIP = ("enabled",)
ENGINES = ("auto", "native", "python")


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """One flag per setting: ``--mode``, ``--budget``, ``--torch-levels``, ``--nested`` ..."""
    for s in config.SETTINGS:
        if s.field in SKIP:
            continue
        text = s.help.replace("%", "%%")
        if s.parse is config._bool:
            p.add_argument(
                flag(s.field),
                dest=s.field,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"sets {s.env}=1 (--no-...: 0). {text}",
            )
            continue
        allowed = ALLOWED.get(s.field)
        many = isinstance(s.default, tuple)
        metavar = (
            ("{" + ",".join(allowed) + "}" + (",..." if many else ""))
            if allowed
            else s.field.upper()
        )
        p.add_argument(
            flag(s.field),
            dest=s.field,
            metavar=metavar,
            help=f"sets {s.env} (default {_default(s.default)}). {text}"
            + (f" Allowed: {', '.join(allowed)}." if allowed else ""),
        )
    p.add_argument(
        "--core",
        metavar="{" + ",".join(ENGINES) + "}",
        help="sets PPROBE_CORE: the recording engine (default auto). Allowed: "
        + ", ".join(ENGINES)
        + ".",
    )
    p.add_argument("--config", metavar="PATH", help="sets PPROBE_CONFIG: a TOML config file")


def _default(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1 << 20:
        for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20)):
            if v % n == 0:
                return f"{v // n}{unit}"
    if isinstance(v, tuple):
        return ",".join(map(str, v)) or "empty"
    return str(v)


def run_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment variables the flags set, each value checked by its setting's parser.
    Raises :class:`pprobe.config.ConfigError` naming the flag and its allowed values."""
    env: dict[str, str] = {}
    for s in config.SETTINGS:
        v = getattr(args, s.field, None)
        if s.field in SKIP or v is None:
            continue
        if isinstance(v, bool):
            env[s.env] = "1" if v else "0"
            continue
        s.parse(flag(s.field), v)  # raises ConfigError
        env[s.env] = v
    if args.core is not None:
        if args.core.strip().lower() not in ENGINES:
            raise config.ConfigError(
                f"--core={args.core!r} is not valid; allowed: {', '.join(ENGINES)}"
            )
        env["PPROBE_CORE"] = args.core.strip().lower()
    if args.config is not None:
        import os

        if not os.path.isfile(args.config):
            raise config.ConfigError(f"--config {args.config!r}: no such file")
        env["PPROBE_CONFIG"] = os.path.abspath(args.config)
    return env
