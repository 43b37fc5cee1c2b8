"""Where nn.Module paths, training steps and module/gradient rows come from.

A row's ``ops.module_path`` is the path of the innermost module whose call runs on its thread,
learnt one of two ways (docs/torch.md "Module paths"):

- frames (``_frames``: the api level alone, native engine): the native core reads the module
  from the innermost frame of ``Module._call_impl`` / ``_wrapped_call_impl`` when a row is
  recorded, its path from ``_paths``, and asks :func:`frame_path` to name a module it has no
  path for. No global module hook: torch's ``_call_impl`` keeps its fast path.
- hooks: global module hooks (``register_module_forward_pre_hook`` and
  ``register_module_forward_hook(always_call=True)``, which PyTorch also calls when forward
  raises) keep a per-thread stack of running modules in ``state.local.mstack``; the innermost
  one's path is ``state.local.module``. Module rows, autograd tags (the aten level), gradient
  hooks and the Python engine use them.

Module names (docs/torch.md): the first time a module is seen, and it is not a descendant of
the module running around it, it is a root. Its name is the variable or attribute that holds
it in the calling frame (a local, then an attribute of that frame's ``self``, then a global),
``model`` when none is found; its descendants get ``{root}.{named_modules() name}`` at the same
time (``model.encoder.layers.0.self_attn``). A module first seen inside another one that is
its ancestor gets its name below it. ``torch.compile``'s wrapper (``_orig_mod``) and the root
share one path. Paths are kept per module object (weakly) and never change.

With the ``module`` level, each module call is also a row (kind ``module``, op = the module's
class), with its inputs (positional and keyword, see :func:`_forward_kwargs`) and its outputs;
the rows recorded inside it have it as ``parent`` (module rows do not count in ``depth``, so
the outermost-call rule of the other levels is unchanged). ``torch_params=params`` adds the
module's own parameters to its row (role ``param``); ``grads`` adds one row per parameter
gradient, recorded when backward has accumulated it (kind ``grad``, role ``grad``).

Backward rows (the ``aten`` level): when a module's forward ends, the autograd nodes it made
(``grad_fn`` nodes whose sequence number was taken during its forward, found from its outputs
through ``next_functions``) get its path in their ``metadata`` dict, the innermost module
first; an aten op run in backward reads it from ``torch._C._current_autograd_node()``
(:mod:`.torch_api`), so backward rows carry the module path of the forward they differentiate.

Optimizer steps (``register_optimizer_step_post_hook``) advance ``state.step`` by one, unless
the program counts steps itself with ``pprobe.step()``.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from time import perf_counter_ns
from typing import Any

import torch

from .. import _report, core, recorder, state, values
from ..state import INTERNAL

_local: Any = state.local
_is_compiling = torch.compiler.is_compiling
_task_id = torch._C._current_graph_task_id

#: id(module) -> (path, weakref to the module)
_paths: dict[int, tuple[str, Any]] = {}
_handles: list[Any] = []
_grad_handles: list[Any] = []
_module_ops: dict[type, recorder.Op] = {}
_rows = False  # the module level is on
_params = False
_grads = False
_on = False
_our_hook_ids: set[int] = set()
_orig_has_hook: Any = None
_tag_nodes = False  # the aten level is on: tag the autograd nodes a forward makes
_seq_nr = torch._C._autograd._get_sequence_nr
#: The key of an autograd node's ``metadata`` that holds the module path of its forward.
NODE_KEY = "pprobe_module"


def _has_other_global_hook() -> bool:
    """nn.modules.module._has_any_global_hook, not counting pprobe's own hooks."""
    from torch.nn.modules import module as m

    return bool(
        m._global_backward_pre_hooks
        or m._global_backward_hooks
        or any(k not in _our_hook_ids for k in m._global_forward_pre_hooks)
        or any(k not in _our_hook_ids for k in m._global_forward_hooks)
        or any(k not in _our_hook_ids for k in m._global_forward_hooks_always_called)
        or m._global_forward_hooks_with_kwargs
    )


class _Rec:
    """A module row in progress (between the pre-hook and the forward hook)."""

    __slots__ = ("seq", "op", "t0", "site", "ins", "others", "parent", "depth", "path", "prefix")
    seq: int
    op: recorder.Op
    t0: int
    site: Any
    ins: list
    others: list
    parent: int
    depth: int
    path: str
    prefix: str


# ---------------------------------------------------------------------- names
def _forget(i: int, ref: Any) -> None:
    e = _paths.get(i)
    if e is not None and e[1] is ref:
        del _paths[i]


def _same(x: Any) -> Any:
    return x


def _remember(module: Any, path: str) -> None:
    i = id(module)
    e = _paths.get(i)
    if e is not None and e[1]() is module:
        return
    ref: Any
    try:
        ref = weakref.ref(module, functools.partial(_forget, i))
    except TypeError:  # not weak-referenceable: keep it alive rather than mis-name another
        ref = functools.partial(_same, module)
    _paths[i] = (path, ref)
    if _grads:
        _watch_grads(module, path)


def path_of(module: Any) -> str | None:
    e = _paths.get(id(module))
    return e[0] if e is not None and e[1]() is module else None


def _root_name(module: Any, f: Any) -> str:
    """The name that holds ``module`` in the first frame outside pprobe and torch, from ``f``
    outwards."""
    is_internal = recorder._is_internal
    while f is not None and is_internal(f.f_code):
        f = f.f_back
    if f is None:
        return "model"
    try:
        loc = f.f_locals
        for k, v in loc.items():
            if v is module and k != "self" and k.isidentifier():
                return k
        owner = loc.get("self")
        d = getattr(owner, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                if v is module:
                    return k
        for k, v in f.f_globals.items():
            if v is module and not k.startswith("__"):
                return k
    except Exception:
        pass
    return "model"


def _assign(module: Any, outer: tuple[str, Any] | None, caller: Any) -> str:
    """Name a module seen for the first time, and its descendants. ``outer``: (path, module)
    of the module call running around it, if any; ``caller``: the frame its call came from
    (or one of torch's frames between them)."""
    path = None
    if outer is not None:
        for name, m in outer[1].named_modules():
            if m is module:
                path = f"{outer[0]}.{name}"
                break
    if path is None:
        path = _root_name(module, caller)
    _remember(module, path)
    inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(inner, torch.nn.Module):
        _remember(inner, path)
        module = inner
    for name, m in module.named_modules():
        if name:
            _remember(m, f"{path}.{name}")
    return path


# ---------------------------------------------------------------------- frames
#: The code objects whose frames run a module call: nn.Module.__call__ is _wrapped_call_impl,
#: which calls _call_impl (a direct call of _call_impl has that frame alone).
_CALL_CODE = torch.nn.Module._call_impl.__code__
_WRAPPED_CODE = torch.nn.Module._wrapped_call_impl.__code__


def _step_wrapper_code() -> Any:
    """The code of the wrapper that ``Optimizer.profile_hook_step`` puts around every
    optimizer's ``step`` (its frame: a step running), or None in a torch without it."""
    f = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    for c in getattr(getattr(f, "__code__", None), "co_consts", ()):
        if isinstance(c, type(_CALL_CODE)) and c.co_name == "wrapper":
            return c
    return None


_frames = False  # rows read their module from the frames (the native core), no global hooks


def frame_path(f: Any) -> str | None:
    """The path of the module whose call runs in frame ``f`` or, failing that, innermost above
    it (frames mode: the native core asks for a module it has no path for). The modules whose
    calls run around it are named first, outermost first, as the global hooks name them when
    each call starts."""
    chain: list[list[Any]] = []  # [module, the outermost frame of its call]
    while f is not None:
        c = f.f_code
        if c is _CALL_CODE or c is _WRAPPED_CODE:
            m = f.f_locals.get("self")
            if m is not None:
                if chain and chain[-1][0] is m:  # _call_impl inside _wrapped_call_impl
                    chain[-1][1] = f
                else:
                    chain.append([m, f])
        f = f.f_back
    outer: tuple[str, Any] | None = None
    for m, fr in reversed(chain):
        e = _paths.get(id(m))
        path = e[0] if e is not None and e[1]() is m else _assign(m, outer, fr.f_back)
        outer = (path, m)
    return outer[0] if outer is not None else None


# ---------------------------------------------------------------------- the hooks
def _pre(module: Any, args: Any) -> None:
    if _is_compiling():  # traced by dynamo as a no-op; compiled code has no module rows
        return None
    try:
        loc = _local.t
        e = _paths.get(id(module))
        if e is not None and e[1]() is module:
            path = e[0]
        else:
            st = loc.mstack
            path = _assign(module, st and (st[0], st[1]), sys._getframe(1))
        rec = _begin(module, path, args, loc) if _rows and recorder._active else None
        # [the first autograd sequence number this forward can take, how many of the numbers
        # after it inner modules' forwards took] (None: nothing to tag)
        nodes = (
            [_seq_nr(), 0] if _tag_nodes and _task_id() == -1 and torch.is_grad_enabled() else None
        )
        loc.mstack = (path, module, loc.mstack, rec, loc.phase, nodes)
        loc.module = path
        loc.phase = "forward"
        if not recorder._training:
            recorder.training_started()
    except Exception as exc:
        _report.internal_error("torch module pre-hook", exc)
    return None


def _post(module: Any, args: Any, result: Any) -> None:
    if _is_compiling():
        return None
    try:
        t1 = perf_counter_ns()
        loc = _local.t
        st = loc.mstack
        if st is None:
            return None
        if st[1] is not module:
            # A forward ended by a BaseException (KeyboardInterrupt...) skipped its hook:
            # drop the stale entries above this module.
            s = st
            while s is not None and s[1] is not module:
                if s[3] is not None:
                    loc.parent = s[3].parent
                s = s[2]
            if s is None:
                return None
            st = s
        rest = st[2]
        loc.mstack = rest
        loc.module = rest[0] if rest is not None else None
        loc.phase = st[4]
        nodes = st[5]
        if nodes is not None:
            end = _seq_nr()
            if end - nodes[0] > nodes[1]:  # some nodes are this forward's own (not a container's)
                _tag(result, st[0], nodes[0], end)
            if rest is not None and rest[5] is not None:
                rest[5][1] += end - nodes[0]
        rec = st[3]
        if rec is not None:
            loc.parent = rec.parent
            status = "ok"
            # PyTorch calls always_call hooks from _call_impl's ``except`` block when forward
            # raised (torch/nn/modules/module.py); the normal call comes from its inner().
            if sys._getframe(1).f_code.co_name == "_call_impl":
                exc = sys.exc_info()[1]
                if exc is not None:
                    status = type(exc).__name__
            _finish(rec, result, t1, status, loc)
    except Exception as exc:
        _report.internal_error("torch module forward hook", exc)
    return None


def _tag(result: Any, path: str, first: int, end: int) -> None:
    """Give the autograd nodes this forward made (sequence numbers ``first`` to ``end``) its
    module path, unless an inner module's forward gave them its own."""
    todo = []
    for t in _tensors(result):
        fn = t.grad_fn
        if fn is not None:
            todo.append(fn)
    seen: dict[int, Any] = {}  # keeps the node objects alive while their ids are keys
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        k = n._sequence_nr()
        if not first <= k < end:  # made before this forward (AccumulateGrad: the maximum)
            continue
        md = n.metadata
        if NODE_KEY not in md:
            md[NODE_KEY] = path
        for nxt, _ in n.next_functions:
            if nxt is not None:
                todo.append(nxt)


def _tensors(x: Any, depth: int = 0) -> list:
    """The tensors of a forward's result: a tensor, or in tuples, lists and dicts (2 levels)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if depth < 2:
        if isinstance(x, (tuple, list)):
            return [t for v in x for t in _tensors(v, depth + 1)]
        if isinstance(x, dict):
            return [t for v in x.values() for t in _tensors(v, depth + 1)]
    return []


_MODULE_PY = os.path.normcase(os.path.abspath(torch.nn.modules.module.__file__))
_inner_codes: dict[Any, bool] = {}


def _forward_kwargs() -> dict:
    """The keyword arguments of the module call whose pre-hook runs (called from _begin).

    A global forward pre-hook receives ``(module, args)`` only
    (``register_module_forward_pre_hook`` has no ``with_kwargs`` in torch 2.13), and the
    global forward hook's ``with_kwargs`` comes after forward ran, when an input changed in
    place no longer holds its value at call time. ``Module._call_impl`` calls the pre-hooks
    from its nested ``inner()``, which holds ``kwargs`` as a local (a cell it shares with
    ``_call_impl``): it is read from that frame. Any other caller (a changed PyTorch): none."""
    f: Any = sys._getframe(3)  # _forward_kwargs <- _begin <- _pre <- inner
    code = f.f_code
    ok = _inner_codes.get(code)
    if ok is None:
        ok = _inner_codes[code] = (
            code.co_name == "inner"
            and "kwargs" in code.co_freevars
            and os.path.normcase(os.path.abspath(code.co_filename)) == _MODULE_PY
        )
    if not ok:
        return {}
    kw = f.f_locals.get("kwargs")
    return kw if isinstance(kw, dict) else {}


def _module_op(tp: type) -> recorder.Op:
    op = _module_ops.get(tp)
    if op is None:
        op = _module_ops[tp] = recorder.op(f"{tp.__module__}.{tp.__qualname__}", "module", "torch")
    return op


def _begin(module: Any, path: str, args: Any, loc: Any) -> _Rec | None:
    depth = loc.depth
    if depth and (depth >= INTERNAL or not recorder._nested):
        return None
    op = _module_op(type(module))
    if not op.selected or (op.sampled and not op.take()):
        return None
    loc.depth = INTERNAL
    try:
        rec = _Rec()
        rec.seq = seq = next(state.seq)
        rec.op = op
        rec.path = path
        rec.depth = depth
        rec.prefix = prefix = f"{os.getpid()}-{seq}" if recorder._mode == 2 else ""
        kwargs = _forward_kwargs()
        arrays, rec.others = values.collect(args if isinstance(args, tuple) else (args,), kwargs)
        rec.ins = [_desc(op, "input", i, x, h, prefix) for i, x, h in arrays]
        if _params:
            from .torch_values import HANDLER

            for name, p in module._parameters.items():
                if p is not None:
                    rec.ins.append(_desc(op, "param", name, p, HANDLER, prefix))
        rec.site = recorder._caller()
    finally:
        loc.depth = depth
    rec.parent = loc.parent
    loc.parent = seq
    rec.t0 = perf_counter_ns()
    return rec


def _desc(op: Any, role: str, idx: str, x: Any, h: Any, prefix: str, many: bool = False) -> tuple:
    if recorder._mode:
        return recorder._describe(op, role, idx, x, h, prefix, many)
    return h.light(role, idx, x)


def _finish(rec: _Rec, result: Any, t1: int, status: str, loc: Any) -> None:
    depth = loc.depth
    loc.depth = INTERNAL
    try:
        ins = rec.ins
        if status == "ok":
            outs = values.outputs(result)
            many = len(outs) > 1
            for i, x, h in outs:
                ins.append(_desc(rec.op, "output", i, x, h, rec.prefix, many))
        phase = "backward" if _task_id() != -1 else "forward"  # checkpoint recomputation
        recorder.append_row(rec.seq, rec.op, rec.t0, t1, rec.depth, rec.parent, rec.site,
                            status, ins, rec.others, rec.path, phase)  # fmt: skip
    finally:
        loc.depth = depth


# ---------------------------------------------------------------------- gradients
_grad_op: recorder.Op | None = None
#: id(parameter) -> weakref: parameters whose gradient hook is registered. (Not a WeakSet:
#: weak containers compare tensors with ``==``, which is elementwise for tensors.)
_watched: dict[int, Any] = {}


def _watch_grads(module: Any, path: str) -> None:
    for name, p in module._parameters.items():
        if p is None or not p.requires_grad:
            continue
        w = _watched.get(id(p))
        if w is not None and w() is p:
            continue
        _watched[id(p)] = weakref.ref(p)
        _grad_handles.append(p.register_post_accumulate_grad_hook(_grad_hook(path, name)))


def _grad_hook(path: str, name: str) -> Any:
    def hook(p: Any) -> None:
        if not _on or not recorder._active or _is_compiling():
            return
        loc = _local.t
        depth = loc.depth
        if depth >= INTERNAL:
            return
        op = _grad_op
        if op is None or not op.selected or (op.sampled and not op.take()):
            return
        loc.depth = INTERNAL
        try:
            from .torch_values import HANDLER

            t = perf_counter_ns()
            seq = next(state.seq)
            prefix = f"{os.getpid()}-{seq}" if recorder._mode == 2 else ""
            g = p.grad
            descs = [] if g is None else [_desc(op, "grad", name, g, HANDLER, prefix)]
            recorder.append_row(seq, op, t, t, depth, loc.parent, -1, "ok", descs,
                                [("param", name)], path, "backward")  # fmt: skip
        except Exception as exc:
            _report.internal_error("torch gradient hook", exc)
        finally:
            loc.depth = depth

    return hook


# ---------------------------------------------------------------------- steps
def _on_step_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Inside ``Optimizer.step()`` rows are in the ``optimizer`` phase (a per-thread stack:
    an optimizer that steps another one). A step that raised skipped the post-hook: the same
    optimizer's next step finds its entry still on the stack and drops it."""
    if _is_compiling():
        return
    loc = _local
    st = getattr(loc, "opt_phases", None)
    if st is None:
        st = loc.opt_phases = []
    while st and st[-1][1] == id(optimizer):
        loc.phase = st.pop()[0]
    st.append((loc.phase, id(optimizer)))
    loc.phase = "optimizer"
    if not recorder._training:
        recorder.training_started()


def _on_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return
    st = getattr(_local, "opt_phases", None)
    if st:
        _local.phase = st.pop()[0]
    if state.manual_step or not _on:
        return
    try:
        recorder.set_step(state.step + 1)
    except Exception as exc:
        _report.internal_error("optimizer step hook", exc)


# ---------------------------------------------------------------------- install
def install(levels: tuple[str, ...], params: tuple[str, ...]) -> dict[str, Any]:
    global _rows, _params, _grads, _on, _grad_op, _tag_nodes
    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _rows = "module" in levels
    _params = "params" in params and _rows
    _grads = "grads" in params
    _tag_nodes = "aten" in levels
    _grad_op = recorder.op("torch.autograd.accumulate_grad", "grad", "torch") if _grads else None
    _on = True
    # The api level alone needs the running module when a row is recorded, nothing per module
    # call: the native core reads it from the frames (native.module_frames), and torch's
    # _call_impl keeps its fast path. Module rows, autograd tags and gradient hooks need the
    # global hooks (so does the Python engine, which has no frame reader of its own).
    native = core.native
    global _frames
    _frames = native is not None and not (_rows or _tag_nodes or _grads)
    if native is not None and _frames:
        native.module_frames(True, _CALL_CODE, _WRAPPED_CODE, _paths, frame_path,
                             recorder.training_started, _step_wrapper_code())  # fmt: skip
        recorder.set_where(native.where)
    else:
        hooks = [
            nn_module.register_module_forward_pre_hook(_pre),
            nn_module.register_module_forward_hook(_post, always_call=True),
        ]
        _handles.extend(hooks)
        _our_hook_ids.update(h.id for h in hooks)
    # torch.compile's OptimizedModule warns on every call when global module hooks exist
    # (torch/_dynamo/eval_frame.py asks nn.modules.module._has_any_global_hook()). pprobe's
    # hooks are not the program's: the program sees the warnings it would see without them.
    global _orig_has_hook
    if _orig_has_hook is None:
        _orig_has_hook = nn_module._has_any_global_hook
        nn_module._has_any_global_hook = _has_other_global_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _handles.append(register_optimizer_step_pre_hook(_on_step_pre))
    _handles.append(register_optimizer_step_post_hook(_on_step))
    if _grads:  # modules named before now (another session) get their hooks too
        for i, (path, ref) in list(_paths.items()):
            m = ref()
            if m is not None and id(m) == i:
                _watch_grads(m, path)
    return {"module_rows": _rows, "params": _params, "grads": _grads,
            "module_paths": "frames" if _frames else "hooks"}  # fmt: skip


def uninstall() -> None:
    global _on, _orig_has_hook, _tag_nodes, _frames
    _on = False
    _tag_nodes = False
    if _frames:
        _frames = False
        recorder.set_where(None)
        native = core.native
        if native is not None:
            native.module_frames(False, None, None, None, None, None, None)
    if _orig_has_hook is not None:
        from torch.nn.modules import module as nn_module

        nn_module._has_any_global_hook = _orig_has_hook
        _orig_has_hook = None
    _our_hook_ids.clear()
    for h in _handles + _grad_handles:
        try:
            h.remove()
        except Exception:
            pass
    _handles.clear()
    _grad_handles.clear()
    _watched.clear()
    _local.mstack = None
    _local.module = None
    _local.phase = None
