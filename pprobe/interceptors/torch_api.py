"""Where PyTorch is probed: a process-wide TorchFunctionMode, and the other torch levels.

``install()`` runs when the program imports torch (a post-import hook of the session). It
enters, once and with no ``with`` block, the modes the capture levels ask for
(``torch_levels`` / PPROBE_TORCH_LEVEL, docs/torch.md):

- ``api`` (default): a ``TorchFunctionMode``. torch.* functions, Tensor methods and
  operators, torch.nn.functional: the outermost call only (PyTorch takes the mode off its
  stack while the mode's ``__torch_function__`` runs, so calls made inside are not seen:
  the ``aten`` level shows what a call did). Property reads (``x.shape``, ``p.grad`` arrive as
  ``__get__``) and a few introspection calls are not rows (:data:`SKIP`).
- ``aten``: a ``TorchDispatchMode``: every ATen op, backward included, each row's ``phase``
  ``forward`` or ``backward``. An aten row inside an api row is recorded too (depth 1, the api
  row as parent): the levels nest, the outermost-call rule holds within a level.
- ``module``: nn.Module calls as rows (:mod:`.torch_modules`).

Mode stacks are thread-local: threads started later enter the modes in
``Thread._bootstrap_inner``; forked processes inherit them; spawn/forkserver children run
the bootstrap and import torch again. Module paths, steps and ranks: :mod:`.torch_modules`,
:mod:`.torch_dist`. While dynamo traces (``torch.compiler.is_compiling()``), every handler is
a pass-through that dynamo traces away, so the compiled graph is the unprobed one; what runs
in Python when it executes (the wrapper's extern kernels such as ``torch.addmm``) is recorded,
fused kernels are not.
"""

from __future__ import annotations

import atexit
import functools
import threading
from types import CodeType, FunctionType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _report, core, recorder, records, state
from ..state import INTERNAL
from . import torch_dist, torch_modules, torch_values

_local: Any = state.local
_call = recorder.call
_is_compiling = torch.compiler.is_compiling
_task_id = torch._C._current_graph_task_id
_current_node = torch._C._current_autograd_node
_NODE_KEY = torch_modules.NODE_KEY
#: the native core's api-level handler (pprobe.core), None with the Python engine
_torch_call = core.native.torch_call if core.native is not None else None
_as_caller = recorder.as_caller  # warnings name the program's line (recorder.as_caller)
# handle_torch_function: between a Python-level torch function and the mode it dispatches to
recorder.add_dispatch_file(torch.overrides.__file__)

#: Calls that are not operations: property access, introspection, grad-mode switches.
SKIP = frozenset(
    {
        "__get__",
        "__set__",
        "__delete__",
        "__repr__",
        "__str__",
        "__format__",
        "__hash__",
        "__len__",
        "__dir__",
        "__reduce_ex__",
        "__reduce__",
        "__setstate__",
        "__getstate__",
        "__deepcopy__",
        "__torch_function__",
        "_set_grad_enabled",
        "is_grad_enabled",
        "is_inference_mode_enabled",
        "_is_view",
        "_has_compatible_shallow_copy_type",
        "dim",
        "ndimension",
        "size",
        "stride",
        "numel",
        "nelement",
        "element_size",
        "storage_offset",
        "data_ptr",
        "untyped_storage",
        "storage",
        "_typed_storage",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "is_signed",
        "is_inference",
        "get_device",
        "has_names",
        "device",
        "is_tensor",
        "is_storage",
        "_version",
    }
)
#: Bookkeeping ops: torch.profiler.record_function (the optimizers use it), ...
SKIP_PREFIXES = ("profiler.", "torch.autograd.profiler.", "torch._C._log_api_usage")
_SKIP_OP: Any = object()  # in the op caches: "never a row"

_api_ops: dict[Any, Any] = {}
_aten_ops: dict[Any, Any] = {}
_on = False
_api_mode: Any = None
_aten_mode: Any = None
_levels: tuple[str, ...] = ()
_sync = False
_orig_bootstrap: Any = None
_entered = threading.local()  # this thread has entered our modes
_retired: list[Any] = []  # modes of earlier installs, kept alive (see uninstall())
_atexit_done = False
_C: Any = torch._C
_native_handler: Any = None  # ApiMode.__torch_function__ of the native core (_set_handler)


# ---------------------------------------------------------------------- naming
def _api_name(func: Any) -> tuple[str, str] | None:
    name = resolve_name(func)
    if name is None:
        mod = getattr(func, "__module__", None) or ""
        short = getattr(func, "__name__", None) or repr(func)
        if mod in ("torch", "torch._C", "torch._C._VariableFunctions") or not mod:
            mod = "torch"
        name = f"{mod}.{short}"
    short = name.rsplit(".", 1)[-1]
    if short in SKIP or name.startswith(SKIP_PREFIXES):
        return None
    if name.startswith("torch.Tensor."):
        return name, ("operator" if short.startswith("__") else "method")
    return name, "function"


def _api_op(func: Any) -> Any:
    try:
        named = _api_name(func)
        op = _SKIP_OP if named is None else recorder.op(named[0], named[1], "torch")
    except Exception as e:
        _report.internal_error("naming a torch function", e)
        return _SKIP_OP
    try:
        _api_ops[func] = op
    except TypeError:  # unhashable callable: named again next time
        pass
    return op


def _api_op_index(func: Any) -> int:
    """The op index of a torch function for the native core; -1: never a row."""
    op = _api_ops.get(func) if _hashable(func) else None
    if op is None:
        op = _api_op(func)
    return -1 if op is _SKIP_OP else op.index


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _aten_op(func: Any) -> Any:
    try:
        name = str(func)  # aten.addmm.default; a higher-order op's name (cond)
        if name.startswith(("aten.sym_", "prim.", "profiler.")):
            op = _SKIP_OP
        else:
            op = recorder.op(name, "aten", "torch")
        _aten_ops[func] = op
    except Exception as e:
        _report.internal_error("naming an ATen op", e)
        return _SKIP_OP
    return op


# ---------------------------------------------------------------------- the modes
class _Sync:
    """PPROBE_SYNC: wait for the device after the op, so the row's time covers its work."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        r = self.fn(*args, **kwargs)
        torch.cuda.synchronize()
        return r


def _maybe_sync(fn: Any) -> Any:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # earlier queued work is not this op's
        return _Sync(fn)
    return fn


def _py_torch_function(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    """ApiMode.__torch_function__ in Python: the Python engine, and PPROBE_SYNC. With the
    native engine the class holds a copy of this function whose calls run the native handler
    (torch_function in pprobe/_native.c: no Python frame of pprobe's between the program and
    the op); dynamo, which inlines bytecode, still traces this code (see :func:`_set_handler`).
    On CPython 3.11 a call of the copy from Python bytecode (torch.overrides'
    handle_torch_function, for Python-level torch functions such as F.relu) runs this code
    too: 3.11 pushes a Python function's frame whatever its vectorcall (pprobe/_native.c,
    tf_vectorcall); the first branch below is that case."""
    __tracebackhide__ = True  # pytest and IPython leave this frame out of tracebacks
    if _torch_call is not None and not _sync and _on and not _is_compiling():
        # the native core: op lookup, phase, descriptions and the row, in C
        return _as_caller(func)(_torch_call, (func, args, kwargs), {})
    if kwargs is None:
        kwargs = {}
    if _is_compiling():  # dynamo traces this: no frame of ours to hide, nothing to record
        return func(*args, **kwargs)
    if not recorder._active or not _on:
        return _as_caller(func)(func, args, kwargs)
    op = _api_ops.get(func)
    if op is None:
        op = _api_op(func)
    if op is _SKIP_OP:
        return _as_caller(func)(func, args, kwargs)
    loc = _local.t
    phase = loc.phase
    if _task_id() != -1:  # the autograd engine runs it; else the phase hooks set
        loc.phase = "backward"
    try:
        if _sync:
            func = _maybe_sync(func)
        return _call(op, func, args, kwargs)
    finally:
        loc.phase = phase


class ApiMode(TorchFunctionMode):
    """The ``api`` level: one row per torch call the program makes."""

    __torch_function__ = _py_torch_function  # the native handler replaces it: _set_handler()


class AtenMode(TorchDispatchMode):
    """The ``aten`` level: one row per ATen op, backward included."""

    # Higher-order ops (torch.cond, ...) come here instead of raising under the mode.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile turns the mode off while it compiles and back on to run the compiled
        # artifact, instead of falling back to eager: compiled results stay what they are.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        __tracebackhide__ = True
        if kwargs is None:
            kwargs = {}
        if not recorder._active or not _on:
            return _as_caller(func)(func, args, kwargs)
        op = _aten_ops.get(func)
        if op is None:
            op = _aten_op(func)
        loc = _local.t
        depth = loc.depth
        if op is _SKIP_OP or depth >= INTERNAL or not op.selected:
            return _as_caller(func)(func, args, kwargs)
        if op.sampled and not op.take():
            return _as_caller(func)(func, args, kwargs)
        phase = loc.phase
        module = loc.module
        if _task_id() != -1:
            loc.phase = "backward"
            # The module path of the forward this node differentiates (torch_modules._tag).
            node = _current_node() if torch_modules._tag_nodes else None
            if node is not None:
                path = node.metadata.get(_NODE_KEY)  # type: ignore[attr-defined]  # a dict
                if path is not None:
                    loc.module = path
        try:
            if _sync:
                func = _maybe_sync(func)
            # Recorded at any depth: an aten op inside an api row is that row's child.
            return recorder._record(op, func, args, kwargs, depth)
        finally:
            loc.phase = phase
            loc.module = module


def _set_handler() -> None:
    """The api mode's handler: the native core's while it records (no PPROBE_SYNC), else
    the Python one. Set on the class: modes of earlier installs follow (they pass calls
    through once ``_on`` is off)."""
    native = core.native
    fast = native is not None and _on and not _sync
    if native is not None:
        native.torch_mode(fast, torch.compiler.__dict__, native.torch_call)
    global _native_handler
    if fast and _native_handler is None:
        # a copy of the Python handler (dynamo inlines its bytecode), whose calls run C
        f = _py_torch_function
        h = FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__)
        h.__qualname__ = "ApiMode.__torch_function__"
        native.torch_handler(h)  # type: ignore[union-attr]
        _native_handler = h
    ApiMode.__torch_function__ = _native_handler if fast else _py_torch_function  # type: ignore[method-assign]


def _enter_modes() -> None:
    """Enter our modes in the thread that installs the probe (the modes' own __enter__)."""
    if getattr(_entered, "done", False):
        return
    _entered.done = True
    if _aten_mode is not None:
        _aten_mode.__enter__()
    if _api_mode is not None:
        _api_mode.__enter__()


def _bootstrap_inner(self: threading.Thread) -> None:
    # Runs in every new thread: threading.Thread._bootstrap_inner calls run(), also when a
    # subclass overrides run(). Pushing directly on this thread's stacks leaves the dispatch
    # mode's process-wide flags to the installing thread's __enter__/__exit__.
    pushed = False
    if _on and not self.name.startswith("pprobe"):
        try:
            if _aten_mode is not None:
                _C._push_on_torch_dispatch_stack(_aten_mode)
            if _api_mode is not None:
                _C._push_on_torch_function_stack(_api_mode)
            pushed = True
        except Exception as e:
            _report.internal_error("entering the torch modes in a thread", e)
    try:
        _orig_bootstrap(self)
    finally:
        if pushed:
            # The thread's C++ stacks would otherwise drop their references to the modes in
            # its thread-local destructors, after Python let the thread go: taking the GIL
            # there while the interpreter finalizes aborts the process (std::terminate).
            _leave_thread()


def _leave_thread() -> None:
    """Pop our modes (current or retired) off the top of this thread's stacks."""
    try:
        n = _C._len_torch_function_stack()
        while n and isinstance(_C._get_function_stack_at(n - 1), ApiMode):
            _C._pop_torch_function_stack()
            n -= 1
        n = _C._len_torch_dispatch_stack()
        while n and isinstance(_C._get_dispatch_stack_at(n - 1), AtenMode):
            _C._pop_torch_dispatch_stack(None)
            n -= 1
    except Exception as e:
        _report.internal_error("leaving the torch modes in a thread", e)


def _leave_modes() -> None:
    """Leave our modes in the installing thread where they are on top of its stacks."""
    from torch.overrides import _get_current_function_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    api: Any = _api_mode
    aten: Any = _aten_mode
    if api is not None and _get_current_function_mode() is api:
        api.__exit__(None, None, None)
    if aten is not None and _get_current_dispatch_mode() is aten:
        aten.__exit__(None, None, None)  # type: ignore[union-attr]
    _entered.done = False


def _at_exit() -> None:
    # Same reason as in _bootstrap_inner, for the installing (main) thread: its C++ stacks
    # are destroyed after the interpreter finalized.
    if _on:
        try:
            _leave_modes()
        except Exception as e:
            _report.internal_error("leaving the torch modes at exit", e)


# ---------------------------------------------------------------------- zero_grad
_orig_zero_grad: Any = None  # Optimizer.zero_grad as pprobe found it (None: not patched)
_zero_grad: Any = None  # the patch in place


def _mode_off(orig: Any, args: tuple, kwargs: dict, ready: Any = None) -> Any:
    """``orig(*args, **kwargs)`` with the api mode taken off this thread's stack where it is
    on top (a program's mode above it, or none of pprobe's: as it is), and put back after.
    With ``ready``, a check run with the mode off first (``ready(*args)``): where it fails
    (or raises: ``orig`` then meets the same problem, with the mode on, as unprobed) the mode
    goes back on before ``orig`` runs."""
    mode = _api_mode
    if not _on or mode is None or _is_compiling():
        return orig(*args, **kwargs)
    try:
        n = _C._len_torch_function_stack()
        top = _C._get_function_stack_at(n - 1) if n else None
    except Exception as e:
        _report.internal_error("reading the torch function mode stack", e)
        return orig(*args, **kwargs)
    if top is not mode:
        return orig(*args, **kwargs)
    try:
        _C._pop_torch_function_stack()  # (in the try: an interrupt right after it)
        if ready is not None:
            try:
                ok = ready(*args)
            except Exception:  # (what orig then raises with the mode on is the program's)
                ok = False
            if not ok:
                _C._push_on_torch_function_stack(mode)
        return orig(*args, **kwargs)
    finally:
        if _C._len_torch_function_stack() < n:
            _C._push_on_torch_function_stack(mode)


def _zero_grad_for(orig: Any) -> Any:
    """``Optimizer.zero_grad`` (``orig``) with the api mode off this thread's stack while it
    sets the gradients to None (its default): that makes no row, and each of its property
    reads and writes (``p.grad``, two a parameter) and profiler calls would pass through the
    mode, which costs ~1.3-2 us a call in torch before any handler runs. With
    ``set_to_none=False`` it runs ops (``zero_``, ``_foreach_zero_``), which are rows: the mode
    stays. ``orig`` is held by the closure: a patch still referenced after uninstall (a bound
    method kept, another library's wrapper around it) goes on calling it."""

    @functools.wraps(orig)
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        if set_to_none is not True:
            return orig(self, *args, **kwargs)
        return _mode_off(orig, (self, *args), kwargs)

    return zero_grad


def _patch_zero_grad(on: bool) -> None:
    global _orig_zero_grad, _zero_grad
    opt = torch.optim.Optimizer
    if on and _orig_zero_grad is None:
        _orig_zero_grad = opt.zero_grad
        _zero_grad = _zero_grad_for(_orig_zero_grad)
        opt.zero_grad = _zero_grad  # type: ignore[method-assign]
    elif not on and _orig_zero_grad is not None:
        if opt.__dict__.get("zero_grad") is _zero_grad:  # (else another wrapper holds ours)
            opt.zero_grad = _orig_zero_grad  # type: ignore[method-assign]
        _orig_zero_grad = _zero_grad = None


#: The ``_init_group`` methods that run with the api mode off, by their code
#: (:func:`_init_group_digest`): SGD's of torch 2.13 on CPython 3.11, which reads each
#: parameter's ``grad`` and ``is_sparse`` and uses list and dict methods, nothing else (its
#: fused kernels' check aside: see :func:`_init_group_for`). Another version's code keeps
#: the mode until it is read and added here: an ``_init_group`` can make rows (Adam's makes
#: its state's tensors at the first step), and tensor arithmetic names nothing in the code.
_QUIET_INIT_GROUPS = frozenset({"4f37e3b65b7e88390e98f788256b63c2"})
#: The ``_init_group`` methods that make rows only while a parameter with a gradient has no
#: state yet (its lazy initialisation: ``torch.zeros``, ``torch.zeros_like``): run with the
#: api mode off once every such parameter has its state (:func:`_states_ready`), by their
#: code, those of torch 2.13 on CPython 3.11: Adam's (AdamW's is Adam's), RMSprop's,
#: Adagrad's, NAdam's, RAdam's, Adamax's, Adadelta's, ASGD's, Rprop's and Muon's. Past the
#: first step they read each parameter's ``grad`` (Adam: three times) and ``is_sparse``, call
#: ``torch.is_complex`` (no row) and look up the state's tensors: 30 passes through the mode
#: a step on the torch MLP with Adam. (Adagrad makes its state in its constructor: its first
#: step is quiet too.)
_QUIET_WITH_STATE = frozenset(
    {
        "a6a6d12cda2bcbedbf2a883ba510c5fe",  # Adam
        "4d3c15b3eddbf2887ea3d2a5a3fdef1b",  # RMSprop
        "53664e643e340afea3f2b54005723c42",  # Adagrad
        "9ccb9aa7a3a8efb019d3c644a7d79c68",  # NAdam
        "070eb81f5a11677680395dc089095bc9",  # RAdam
        "c4f2141bd6e9fa9ba546a37417e8fec7",  # Adamax
        "20b988ac8a53c3e8250b2ffad279cc9e",  # Adadelta
        "c2365d9429de96c953bc8cbba2327c19",  # ASGD
        "b60f02bb85f080df3582400d1f4c05b3",  # Rprop
        "40695c8959457131a54febdc033a3bca",  # Muon
    }
)
_init_groups: list[tuple[type, Any, Any]] = []  # (optimizer class, its original, the patch)


def _states_ready(self: Any, group: Any, *args: Any) -> bool:
    """Whether every parameter of ``group`` that has a gradient has its optimizer state
    (run with the api mode off; reads only: ``self.state`` is a defaultdict, not indexed)."""
    state = self.state
    for p in group["params"]:
        if p.grad is not None and not state.get(p):
            return False
    return True


def _init_group_for(orig: Any, ready: Any = None) -> Any:
    """An optimizer's ``_init_group`` (``orig``) with the api mode off while it gathers the
    parameters that have gradients: SGD reads ``p.grad`` three times and ``p.grad.is_sparse``
    once a parameter each step, 24 passes through the mode on the torch MLP, ~1 us each in
    torch. With ``fused`` set the mode stays: the fused kernels' check calls
    ``torch.is_floating_point``.

    ``orig`` makes no row (:data:`_QUIET_INIT_GROUPS`), or, with ``ready``
    (:func:`_states_ready`: one of :data:`_QUIET_WITH_STATE`), none once its parameters'
    state exists: ``ready`` is checked with the mode off at each call, and before that (the
    first step, a parameter's first gradient) the mode stays on, as the state's tensors are
    rows; so it does for ``capturable`` and ``differentiable`` groups."""

    @functools.wraps(orig)
    def _init_group(self: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if (
            group.__class__ is not dict
            or group.get("fused")
            or (ready is not None and (group.get("capturable") or group.get("differentiable")))
        ):
            return orig(self, group, *args, **kwargs)
        return _mode_off(orig, (self, group, *args), kwargs, ready)

    return _init_group


def _init_group_digest(code: CodeType) -> str:
    """A digest of a function's code: its bytecode, names and constants."""
    import hashlib

    data = code.co_code + repr(code.co_names).encode() + repr(code.co_consts).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _patch_init_groups(on: bool) -> None:
    if on and not _init_groups:
        for cls in {id(v): v for v in vars(torch.optim).values()}.values():
            if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
                continue
            orig = cls.__dict__.get("_init_group")
            code = getattr(orig, "__code__", None)
            if not isinstance(code, CodeType):
                continue
            digest = _init_group_digest(code)
            if digest in _QUIET_INIT_GROUPS:
                patch = _init_group_for(orig)
            elif digest in _QUIET_WITH_STATE:
                patch = _init_group_for(orig, _states_ready)
            else:
                continue
            cls._init_group = patch  # type: ignore[attr-defined]
            _init_groups.append((cls, orig, patch))
    elif not on:
        for cls, orig, patch in _init_groups:
            if cls.__dict__.get("_init_group") is patch:  # (else another wrapper holds ours)
                cls._init_group = orig  # type: ignore[attr-defined]
        _init_groups.clear()


# ---------------------------------------------------------------------- install
def install() -> dict[str, Any]:
    """Enter the modes, install hooks and patches. Returns coverage facts for meta.json."""
    global _on, _api_mode, _aten_mode, _levels, _sync, _orig_bootstrap
    cfg = recorder._cfg
    _levels = tuple(getattr(cfg, "torch_levels", ("api",)))
    params = tuple(getattr(cfg, "torch_params", ()))
    _sync = bool(getattr(cfg, "sync", False))
    torch_values.register()
    recorder.add_internal_path(torch.__file__)
    if core.native is not None:
        dtypes = {d: records.sid(n) for d, n in torch_values.DTYPE_NAMES.items()}
        core.native.torch_init(tuple(torch_values._PLAIN), dtypes, torch_values.device_name,
                               _api_op_index, _task_id)  # fmt: skip
    _on = True
    _set_handler()
    _api_mode = ApiMode() if "api" in _levels else None
    _aten_mode = AtenMode() if "aten" in _levels else None
    # aten rows nest in api rows, and rows in module rows: their ``parent`` must be kept
    recorder.want_parents("aten" in _levels or "module" in _levels)
    _entered.done = False
    _enter_modes()
    if _api_mode is not None:
        try:
            _patch_zero_grad(True)
        except Exception as e:
            _report.internal_error("patching Optimizer.zero_grad", e)
        try:
            _patch_init_groups(True)
        except Exception as e:
            _report.internal_error("patching the optimizers' _init_group", e)
    global _atexit_done
    if not _atexit_done:
        _atexit_done = True
        atexit.register(_at_exit)  # after the session's: runs before it (LIFO)
    if _orig_bootstrap is None and hasattr(threading.Thread, "_bootstrap_inner"):
        _orig_bootstrap = threading.Thread._bootstrap_inner
        threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
    facts: dict[str, Any] = {"torch_version": torch.__version__, "levels": list(_levels)}
    if _api_mode is not None:  # what runs with the api mode off (no row is lost)
        facts["mode_off"] = (["torch.optim.Optimizer.zero_grad"] if _zero_grad else []) + [
            f"{cls.__module__}.{cls.__qualname__}._init_group" for cls, _, _ in _init_groups
        ]
    # Each part on its own: a failure in one leaves the others working (and is reported).
    try:
        facts.update(torch_modules.install(_levels, params))
    except Exception as e:
        _report.internal_error("installing the torch module hooks", e)
    try:
        facts.update(torch_dist.install())
    except Exception as e:
        _report.internal_error("probing torch.distributed", e)
    return {"torch": facts}


def uninstall() -> None:
    """Leave the modes (this thread), remove hooks and patches. Modes entered by other
    threads stay on their stacks but do nothing (a thread's mode stack is its own)."""
    global _on, _orig_bootstrap, _api_mode, _aten_mode
    _on = False
    _set_handler()
    recorder.want_parents(False)
    try:
        _leave_modes()
    finally:
        if _orig_bootstrap is not None:
            threading.Thread._bootstrap_inner = _orig_bootstrap  # type: ignore[attr-defined]
            _orig_bootstrap = None
        # Threads that entered the modes keep them on their own stacks (inert now). Their
        # C++ thread-local stacks drop those references when the threads end, possibly while
        # the interpreter finalizes: the last reference must never be theirs.
        _retired.extend(m for m in (_api_mode, _aten_mode) if m is not None)
        _api_mode = _aten_mode = None
        _patch_zero_grad(False)
        _patch_init_groups(False)
        torch_modules.uninstall()
        torch_dist.uninstall()
