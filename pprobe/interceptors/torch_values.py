"""How pprobe describes torch tensors: metadata, statistics and what to dump.

Rules (docs/torch.md):
- metadata (shape, dtype, device, requires_grad) never touches the data, so log mode never
  synchronises an accelerator;
- statistics and dumps run with pprobe's own torch work hidden: no autograd, no
  ``__torch_function__`` / ``__torch_dispatch__`` modes (pprobe's included), no JIT tracer,
  no autocast;
- CPU tensors are statted by the native code straight from their memory (data_ptr, shape,
  stride; :func:`native_cpu_stats`), or else with the NumPy code (same numbers as NumPy
  arrays). CUDA tensors are statted on the device: one small float64 tensor copied
  ``non_blocking`` into pinned memory, with an event; the writer thread resolves it
  (:class:`pprobe.values.Lazy`), so the training step never waits. CUDA dumps go the same
  way through pinned memory;
- dtypes NumPy lacks (bfloat16, the float8/float4 family, complex32, bits) are dumped as their
  raw bits in a same-width unsigned view; the file name carries the true dtype
  (``op_..._{pid}-{seq}.bfloat16.npy``) and :func:`pprobe.load` views it back;
- anything that has no readable data (meta, fake and other Python-dispatch subclasses,
  sparse, nested, functorch-wrapped tensors) is described by metadata only, the reason in the
  tensor row's ``note``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .. import core, state, values

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor)})
_SHAPE_PACK = values.SHAPE_PACK
pack_shape = values.pack_shape

#: torch dtype -> the name in the log ("float32", "bfloat16": no "torch." prefix, like NumPy's).
DTYPE_NAMES: dict[Any, str] = {
    d: str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)
}
#: dtypes ``Tensor.numpy()`` takes as they are.
NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
    | {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
)
#: NumPy's type string of each: a CPU tensor is viewed through ``__array_interface__``.
_TYPESTR = {d: torch.empty(0, dtype=d).numpy().dtype.str for d in NUMPY_DTYPES}


class _Memory:
    """The ``__array_interface__`` of a CPU tensor's elements; holds the tensor."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor) -> None:
        n = t.element_size()
        self.tensor = t
        self.__array_interface__ = {
            "version": 3,
            "shape": tuple(t.shape),
            "typestr": _TYPESTR[t.dtype],
            "data": (t.data_ptr(), True),
            "strides": tuple(k * n for k in t.stride()),
        }


def host_array(t: torch.Tensor) -> Any:
    """A read-only NumPy view of a CPU tensor of a NumPy dtype, for the time of the call.

    Not ``Tensor.numpy()``: that marks the tensor's storage as not resizable for good, so a
    program that resizes the tensor later (``out=`` of another shape, ``resize_``) would fail
    under the probe. The view is used before the program's next line runs (statistics, the
    dump's copy into the queue), while the storage cannot change.
    """
    import numpy as np

    if t.numel() == 0:
        return np.empty(tuple(t.shape), dtype=_TYPESTR[t.dtype])
    return np.asarray(_Memory(t))


#: raw-bits views for the others, by element size.
_UINT = {1: torch.uint8, 2: getattr(torch, "uint16", torch.int16)}
_UINT[4] = getattr(torch, "uint32", torch.int32)
_UINT[8] = getattr(torch, "uint64", torch.int64)
_BITS = frozenset(getattr(torch, n) for n in dir(torch) if n.startswith("bits"))
_PYTHON_KEY = torch._C.DispatchKey.Python
_dispatch_keys = torch._C._dispatch_keys
_set_tracing_state: Any = getattr(torch._C, "_set_tracing_state")  # noqa: B009 (no stub)
_functorch = getattr(torch._C, "_functorch", None)
_is_functorch_wrapped = getattr(_functorch, "is_functorch_wrapped_tensor", None)


_DEVICE_NAMES: dict[Any, str] = {}


def device_name(x: Any) -> str:
    """ "cpu", "cuda:0": a str, not the torch.device (a GC-capable object would keep every
    buffered row tracked by the garbage collector), and cheap for CPU tensors."""
    if x.is_cpu:
        return "cpu"
    d = x.device
    n = _DEVICE_NAMES.get(d)
    if n is None:
        n = _DEVICE_NAMES[d] = str(d)
    return n


def dtype_name(dt: Any) -> str:
    n = DTYPE_NAMES.get(dt)
    if n is None:
        n = DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return n


def unreadable(x: Any) -> str | None:
    """Why ``x``'s values cannot be read (statistics, dumps), or None when they can."""
    tp = type(x)
    if tp not in _PLAIN and _dispatch_keys(x).has(_PYTHON_KEY):
        # FakeTensor, FunctionalTensor, DTensor, jagged NestedTensor...: their data, if any,
        # is behind their own __torch_dispatch__; pprobe never runs it.
        return f"{tp.__name__}: tensor subclass with __torch_dispatch__, values not read"
    if x.is_nested:
        return "nested tensor: values not read"
    if x.is_meta:
        return "meta tensor: no data"
    if x.layout != torch.strided:
        return f"{str(x.layout).removeprefix('torch.')} tensor: values not read"
    if _is_functorch_wrapped is not None and _is_functorch_wrapped(x):
        return "inside a functorch transform (vmap/grad): values not read"
    return None


class _Quiet:
    """pprobe's own torch work: no autograd, no modes, no JIT tracer."""

    __slots__ = ("grad", "tf", "td", "tracing")

    def __enter__(self) -> None:
        self.grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        self.tf = torch._C.DisableTorchFunction()
        self.tf.__enter__()
        self.td = torch._C._DisableTorchDispatch()
        self.td.__enter__()
        self.tracing = torch._C._get_tracing_state()
        if self.tracing is not None:  # jit.trace must not record pprobe's ops into the graph
            _set_tracing_state(None)

    def __exit__(self, *exc: object) -> None:
        if self.tracing is not None:
            _set_tracing_state(self.tracing)
        self.td.__exit__(None, None, None)
        self.tf.__exit__(None, None, None)
        torch._C._set_grad_enabled(self.grad)


# ---------------------------------------------------------------------- statistics
def device_stats(t: torch.Tensor) -> torch.Tensor:
    """[min, max, mean, std, nan, inf, finite] as one float64 tensor on ``t``'s device.

    min..std are over finite values only (as for NumPy arrays); nothing here reads a value back
    to the host, so on an accelerator it is all queued work.
    """
    if t.is_quantized:
        t = t.dequantize()
    if t.is_complex():
        t = t.abs()
    wide = torch.float32 if t.device.type == "mps" else torch.float64
    floating = t.is_floating_point()
    t = t.to(wide)
    n = t.numel()
    if floating:
        finite = torch.isfinite(t)
        nfin = finite.sum().to(wide)
        nan = torch.isnan(t).sum().to(wide)
        inf = n - nfin - nan
        mn = torch.where(finite, t, float("inf")).amin()
        mx = torch.where(finite, t, float("-inf")).amax()
        mean = torch.where(finite, t, 0.0).sum() / nfin
        std = torch.sqrt(torch.where(finite, (t - mean) ** 2, 0.0).sum() / nfin)
    else:
        # torch.full, not torch.tensor: a host-to-device copy would wait for the device
        nfin = torch.full((), float(n), dtype=wide, device=t.device)
        nan = inf = torch.zeros((), dtype=wide, device=t.device)
        mn, mx = t.amin(), t.amax()
        mean = t.mean()
        std = torch.sqrt(((t - mean) ** 2).mean())
    return torch.stack([mn, mx, mean, std, nan, inf, nfin])


def finish_stats(v: list[float]) -> tuple:
    """The 7 numbers of :func:`device_stats` -> the row's (min, max, mean, std, nan, inf)."""
    nan, inf, nfin = int(v[4]), int(v[5]), int(v[6])
    if nfin == 0:
        return (None, None, None, None, nan, inf)
    return (v[0], v[1], v[2], v[3], nan, inf)


def _wait(event: Any) -> None:
    """Wait for a device event from the writer thread: polling ``query()`` (which never counts
    as a synchronisation, even under ``torch.cuda.set_sync_debug_mode``), sleeping between
    polls so the training thread keeps the GIL."""
    query = getattr(event, "query", None)
    if query is None:
        event.synchronize()
        return
    while not query():
        time.sleep(0.0002)


class _DeviceStats(values.Lazy):
    """Statistics on their way from the device: resolved by the writer thread."""

    __slots__ = ("host", "event")

    def __init__(self, host: torch.Tensor, event: Any) -> None:
        self.host = host
        self.event = event

    def resolve(self) -> tuple:
        _wait(self.event)
        return finish_stats(self.host.tolist())


#: dtype -> pprobe/_dumpio.c's element type code (its enum's order): the dtypes whose
#: statistics the native code reads straight from a CPU tensor's memory.
_STATS_CODES = {
    d: i
    for i, n in enumerate(("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                           "int64", "uint64", "float16", "bfloat16", "float32", "float64"))
    if (d := getattr(torch, n, None)) is not None
}  # fmt: skip
_tf_mode_enabled = torch._C._is_torch_function_mode_enabled
_STRIDED = torch.strided
_stats_tensor: Any = False


def native_cpu_stats(x: Any) -> tuple | None:
    """Statistics of a plain CPU tensor computed by the native code on its memory: no ndarray,
    no conversion, no copy, no torch op. None when it does not apply (the native code is not
    loaded, or :func:`checked_cpu_stats` declines the tensor): the caller's general path then
    gives the same numbers. pprobe/_dumpio.c's ``stats_tensor`` makes the checks and the reads
    of :func:`checked_cpu_stats` through the CPython API (tests/test_stats_fast.py holds the
    two to the same answers)."""
    global _stats_tensor
    f = _stats_tensor
    if f is False:
        mod = core.dumpio()
        f = None
        if mod is not None:
            # _TYPESTR: what the native core's dumps of CPU tensors read (dumpable's fast path)
            mod.tensor_setup(tuple(_PLAIN), _STATS_CODES, _STRIDED, _tf_mode_enabled,
                             _is_functorch_wrapped, _TYPESTR)  # fmt: skip
            f = mod.stats_tensor
        _stats_tensor = f
    if f is None:
        return None
    return f(x)  # type: ignore[no-any-return]


def checked_cpu_stats(x: Any, stats_at: Any) -> tuple | None:
    """What ``stats_tensor`` does, in Python: ``x``'s statistics by ``stats_at`` (pprobe/
    _dumpio.c's kernel) read through public attributes (``data_ptr()``, ``shape``,
    ``stride()``, ``dtype``), or None when that does not apply (a subclass or a torch function
    mode would see the attribute reads, another device, layout or dtype, a negative view, a
    functorch wrapper)."""
    if x.__class__ not in _PLAIN or _tf_mode_enabled():
        return None
    code = _STATS_CODES.get(x.dtype)
    if code is None or not x.is_cpu or x.layout is not _STRIDED or x.is_nested or x.is_neg():
        return None
    if _is_functorch_wrapped is not None and _is_functorch_wrapped(x):
        return None
    try:
        return stats_at(x.data_ptr(), code, x.shape, x.stride())  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None  # symbolic sizes, no storage: the general path


def _cpu_stats(t: torch.Tensor) -> tuple | None:
    from .numpy_arrays import array_stats

    if t.is_quantized:
        t = t.dequantize()
    if t.dtype not in NUMPY_DTYPES:
        t = t.to(torch.complex64 if t.is_complex() else torch.float32)  # exact for these
    return array_stats(host_array(t.resolve_conj().resolve_neg()))


# ---------------------------------------------------------------------- dumps
class _Tagged(values.Dumpable):
    """A raw-bits view of a dtype NumPy lacks; the true dtype goes into the file name."""

    __slots__ = ("arr", "tag")

    def __init__(self, arr: Any, tag: str) -> None:
        self.arr = arr
        self.tag = tag

    def pprobe_dump(self, dumper: Any, op: str, which: str, prefix: str) -> tuple:
        return dumper.dump(self.arr, op, which, f"{prefix}.{self.tag}")


class _Deferred(values.Dumpable):
    """A device tensor being copied to pinned host memory; written once the copy is done."""

    __slots__ = ("host", "event", "tag")

    def __init__(self, host: torch.Tensor, event: Any, tag: str) -> None:
        self.host = host
        self.event = event
        self.tag = tag

    def pprobe_dump(self, dumper: Any, op: str, which: str, prefix: str) -> tuple:
        return _PendingDump(self, dumper, op, which, prefix), None


class _PendingDump(values.Lazy):
    """The dump file of a :class:`_Deferred`: written by the writer thread (path, note)."""

    __slots__ = ("d", "dumper", "op", "which", "prefix", "step")

    def __init__(self, d: _Deferred, dumper: Any, op: str, which: str, prefix: str) -> None:
        self.d, self.dumper, self.op, self.which, self.prefix = d, dumper, op, which, prefix
        self.step = state.step  # the call's step (the dump ring files it there)

    def resolve(self) -> tuple:
        d = self.d
        _wait(d.event)
        prefix = f"{self.prefix}.{d.tag}" if d.tag else self.prefix
        try:
            return self.dumper.dump(d.host.numpy(), self.op, self.which, prefix, self.step)
        finally:
            self.d = None  # type: ignore[assignment]  # free the pinned buffer


# ---------------------------------------------------------------------- the handler
class TorchHandler:
    framework = "torch"

    # Shapes are packed into bytes (values.pack_shape): a row must hold no small int (NumPy's
    # tests count their references), nor a torch.Size (a tuple subclass would keep the row
    # tracked by the garbage collector, and every collection would walk the buffered rows).
    def meta(self, x: Any) -> tuple:
        if type(x) in _PLAIN and not x.is_nested:
            return pack_shape(x.shape), dtype_name(x.dtype), device_name(x), x.requires_grad
        try:
            # Jagged nested tensors have symbolic (ragged) sizes: -1 stands for them.
            shape = pack_shape([s if type(s) is int else -1 for s in x.shape])
        except Exception:
            shape = b""  # strided nested tensors have no sizes
        return shape, dtype_name(x.dtype), device_name(x), x.requires_grad

    def light(self, role: str, idx: str, x: Any) -> tuple:
        if x.__class__ in _PLAIN:
            try:
                sh = x.shape
                return (role, idx, _SHAPE_PACK[len(sh)](*sh), DTYPE_NAMES[x.dtype],
                        "cpu" if x.is_cpu else device_name(x), x.requires_grad,
                        None, None, None)  # fmt: skip
            except Exception:
                pass  # nested (no sizes), a new dtype, symbolic sizes: the careful path
        return (role, idx, *self.meta(x), None, None, None)

    def dtype_name(self, x: Any) -> str:
        return dtype_name(x.dtype)

    def stats(self, x: Any) -> Any:
        """A tuple, a :class:`~pprobe.values.Lazy` (CUDA), or the reason there is none (str)."""
        fast = native_cpu_stats(x)
        if fast is not None:
            return fast
        why = unreadable(x)
        if why is not None:
            return why
        if x.dtype in _BITS:
            return f"{dtype_name(x.dtype)}: no statistics for raw bits"
        q = _Quiet()
        q.__enter__()
        try:
            if x.numel() == 0:  # under the quiet guard: numel() is traced by jit.trace
                return (None, None, None, None, 0, 0)
            dev = x.device.type
            if dev == "cpu":
                try:
                    return _cpu_stats(x.detach())
                except (RuntimeError, TypeError) as e:  # a dtype with no conversion
                    return f"no statistics: {e}"[:200]
            with torch.autocast(dev, enabled=False):
                st = device_stats(x.detach())
            if dev == "cuda":
                host = torch.empty(st.shape, dtype=st.dtype, pin_memory=True)
                host.copy_(st, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
                return _DeviceStats(host, ev)
            return finish_stats(st.tolist())  # other devices: read back now (documented)
        finally:
            q.__exit__()

    def dumpable(self, x: Any) -> tuple[Any, str | None]:
        if (
            x.__class__ in _PLAIN
            and not _tf_mode_enabled()
            and x.is_cpu
            and x.layout is _STRIDED
            and x.dtype in NUMPY_DTYPES
            and not x.is_nested
            and not x.is_conj()
            and not x.is_neg()
            and (_is_functorch_wrapped is None or not _is_functorch_wrapped(x))
        ):
            # a plain CPU tensor of a NumPy dtype, read in place with no torch op (for it the
            # general path's detach, resolve_conj/resolve_neg and view change nothing); no
            # torch function mode would see the attribute reads
            return host_array(x), None
        why = unreadable(x)
        if why is not None:
            return None, why
        q = _Quiet()
        q.__enter__()
        try:
            t = x.detach()
            note = None
            if t.is_quantized:
                if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                    note = (
                        f"{dtype_name(t.dtype)}: int_repr saved, scale={t.q_scale()}, "
                        f"zero_point={t.q_zero_point()}"
                    )
                else:
                    note = f"{dtype_name(t.dtype)} per-channel: int_repr saved, scales not saved"
                t = t.int_repr()
            t = t.resolve_conj().resolve_neg()
            tag = ""
            if t.dtype not in NUMPY_DTYPES:
                tag = dtype_name(t.dtype)
                t = t.view(_UINT[t.element_size()])
            dev = t.device.type
            if dev == "cpu":
                arr = host_array(t)
                return (_Tagged(arr, tag) if tag else arr), note
            if dev == "cuda":
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
                return _Deferred(host, ev, tag), note
            arr = t.cpu().numpy()  # other devices: a blocking copy (documented)
            return (_Tagged(arr, tag) if tag else arr), note
        finally:
            q.__exit__()


HANDLER = TorchHandler()
_registered = False


def _size_text(v: Any) -> values.Text:
    return values.Text(values.scalar_text(v))


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    values.register(torch.Tensor, HANDLER)
    for tp in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        values.register_scalar(tp)
    # A torch.Size holds ints (small ones are shared objects NumPy's tests count): its text.
    values.register_text(torch.Size, _size_text)
    qscheme = type(torch.per_tensor_affine)
    values.register_scalar(qscheme)


def torch_dtype_of_tag(tag: str) -> Any:
    """The torch dtype a dump's name tag stands for, or None (pprobe.load)."""
    dt = getattr(torch, tag, None)
    return dt if isinstance(dt, torch.dtype) else None
