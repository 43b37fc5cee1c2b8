"""Statistics inside the native recording core (stats and dump modes, native engine).

pprobe/_native.c records a NumPy call in stats mode itself when pprobe/_dumpio.c's one-pass
statistics are loaded: it reads each array's buffer through _dumpio's capsule (no Python call,
no ndarray made, any strides), and writes min, max, mean, std, NaN and inf counts straight into
the tensor record. It follows the Python engine's rules (``recorder._describe``): an ``out=``
input and the outputs of an op whose outputs are uninitialised memory get a note instead of
statistics; arrays the C code does not read (complex, byte-swapped, string, object dtypes) are
statted by the Python handler (:func:`_fallback`), giving the same numbers as the Python engine.
Torch tensors (the api level's calls, and tensors in NumPy calls) are described by the core and
statted by the torch handler (:func:`_tensor_stats`). Dump mode takes the statistics the same
way and hands each described array to ``recorder._native_dump``. ``PPROBE_DTYPES`` and
``PPROBE_ON_NAN`` keep the calls on the Python engine's path.
"""

from __future__ import annotations

from typing import Any

from . import core, records

OUT_NOTE = "out= buffer"


def _fallback(x: Any) -> Any:
    """What the Python engine records for an array the C statistics do not take."""
    from .interceptors.numpy_arrays import HANDLER

    return HANDLER.stats(x)


_torch_stats: Any = None


def _tensor_stats(x: Any) -> Any:
    """A torch tensor's statistics, as the Python engine takes them (the torch handler: CPU
    tensors read in C from their memory, CUDA ones a Lazy read back by the writer)."""
    global _torch_stats
    f = _torch_stats
    if f is None:
        from .interceptors import torch_values  # torch is loaded: a tensor is here

        f = _torch_stats = torch_values.HANDLER.stats
    return f(x)


def attach(native: Any, uninit_note: str) -> bool:
    """Hand the native core the C statistics; False when they are not loaded (the Python
    engine then describes stats-mode calls, as before)."""
    mod = core.dumpio()
    cap = getattr(mod, "_C_STATS", None) if mod is not None else None
    if cap is None or not hasattr(native, "set_stats"):
        return False
    tcap = getattr(mod, "_C_TENSOR_STATS", None)  # plain CPU tensors, no Python call
    native.set_stats(cap, _fallback, OUT_NOTE, uninit_note, records.sid("out"), _tensor_stats, tcap)
    return True
