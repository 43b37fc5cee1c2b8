"""Where torch.distributed is probed: ranks in every row, collectives as rows.

``state.rank`` / ``state.world_size`` come from the RANK / WORLD_SIZE variables that
torchrun and friends set (read at session start) and, once the program calls
``init_process_group``, from the process group itself. c10d's Python collectives
(``all_reduce``, ``broadcast``, ...) do not go through ``__torch_function__``: they are
wrapped in ``torch.distributed`` and ``torch.distributed.distributed_c10d`` (kind
``collective``). Collectives that DDP/FSDP issue from C++ are not rows (the ``aten`` level
sees the c10d ops that pass through the dispatcher).
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import torch

from .. import _report, recorder, state

COLLECTIVES = (
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
)
_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_patched: list[tuple[Any, str, Any]] = []
_is_compiling = torch.compiler.is_compiling


def _wrap_collective(fn: Any, name: str) -> Any:
    op = recorder.op(f"torch.distributed.{name}", "collective", "torch")
    call = recorder.call

    @functools.wraps(fn)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return fn(*args, **kwargs)
        return call(op, fn, args, kwargs)

    collective.__pprobe_original__ = fn  # type: ignore[attr-defined]
    return collective


def _wrap_init(fn: Any) -> Any:
    @functools.wraps(fn)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        refresh_rank()
        return result

    init_process_group.__pprobe_original__ = fn  # type: ignore[attr-defined]
    return init_process_group


def refresh_rank() -> None:
    """Take rank and world size from the default process group, if there is one."""
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            state.rank = dist.get_rank()
            state.world_size = dist.get_world_size()
            from ..session import Session

            s = Session.active
            if s is not None:
                s.write_meta()
    except Exception as e:
        _report.internal_error("reading the process group's rank", e)


def install() -> dict[str, Any]:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return {"distributed": False}
    importlib.import_module("torch.distributed.distributed_c10d")  # torch imported it already

    wrappers: dict[int, Any] = {}
    for modname in _MODULES:
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for name in (*COLLECTIVES, "init_process_group"):
            orig = getattr(mod, name, None)
            if orig is None or hasattr(orig, "__pprobe_original__"):
                continue
            w = wrappers.get(id(orig))
            if w is None:
                init = name == "init_process_group"
                w = _wrap_init(orig) if init else _wrap_collective(orig, name)
                wrappers[id(orig)] = w
            setattr(mod, name, w)
            _patched.append((mod, name, orig))
    refresh_rank()
    return {"distributed": True, "collectives": len(_patched)}


def uninstall() -> None:
    for mod, name, orig in reversed(_patched):
        if getattr(getattr(mod, name, None), "__pprobe_original__", None) is orig:
            setattr(mod, name, orig)
    _patched.clear()
