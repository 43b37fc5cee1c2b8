"""Hooks into the program's classes and functions: ``register_hook`` and ``hook_function``.

- ``register_hook("torch.nn.Linear", "forward")``: for a torch ``nn.Module`` class and
  ``forward`` / ``backward``, one global module hook (``register_module_forward_hook``,
  ``register_module_full_backward_hook``) filtered by ``isinstance``: every instance, made
  before or after, of the class and its subclasses. For any other method, the method is
  wrapped (wrapt) on the class and on each subclass that defines its own.
- ``hook_function("pkg.mod.func")`` / ``("pkg.mod.Class.method")``: the attribute is wrapped
  with wrapt, and module-level names bound to the original function before (``from pkg.mod
  import func``) are re-pointed to the wrapper.

A target whose module is not imported yet is resolved when it is (wrapt post-import hooks).
Hooks run under ``state.internal()`` (their own NumPy/torch calls are not recorded), their
return value is ignored (a hook never changes a result), and a hook that raises is reported
once and switched off after :data:`pprobe.ext.tables.MAX_FAILURES` failures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from . import tables

#: Every hook registered and not removed.
handles: list[Handle] = []


class Handle:
    """What a registration did, so that ``remove()`` (and ``unload_plugin``) can undo it."""

    def __init__(self, kind: str, target: str, method: str | None, fn: Callable[..., Any],
                 owner: str | None) -> None:  # fmt: skip
        self.kind, self.target, self.method, self.fn, self.owner = kind, target, method, fn, owner
        self.failures = 0
        self.off = False
        self.removed = False
        self.resolved = False
        self._undo: list[Callable[[], None]] = []
        self.what = f"hook {target}{'.' + method if method else ''}"

    def call(self, *args: Any, **kw: Any) -> None:
        if self.off or self.removed:
            return
        tables.call_guarded(self.what, self.fn, self, *args, **kw)
        if self.failures:
            tables._activate()

    def remove(self) -> None:
        self.removed = True
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo.clear()
        if self in handles:
            handles.remove(self)


# ---------------------------------------------------------------------- resolution
def _candidates(path: str) -> list[tuple[str, list[str]]]:
    """(module, attribute path) splits of a dotted path, longest module first."""
    parts = path.split(".")
    return [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]


def _resolve(path: str) -> tuple[Any, Any, str] | None:
    """(owner object, object, last name) of an imported dotted path, or None."""
    for mod, attrs in _candidates(path):
        m = sys.modules.get(mod)
        if m is None:
            continue
        obj, owner = m, m
        try:
            for a in attrs:
                owner, obj = obj, getattr(obj, a)
        except AttributeError:
            continue
        return owner, obj, attrs[-1]
    return None


def _when_imported(path: str, h: Handle, apply: Callable[[Any, Any, str], None]) -> None:
    """Apply now if ``path`` resolves, else on the import of the module that holds it."""

    def attempt(_module: Any = None) -> None:
        if h.resolved or h.removed:
            return
        try:
            got = _resolve(path)
            if got is not None:
                h.resolved = True
                apply(*got)
        except Exception as e:  # a post-import hook must never break the user's import
            tables.note_failure(h.what + " (installing it)", h, e)

    attempt()
    if h.resolved:
        return
    import wrapt

    for mod, _attrs in _candidates(path):
        if mod not in sys.modules:
            wrapt.register_post_import_hook(attempt, mod)


# ---------------------------------------------------------------------- register_hook
def register_hook(
    target: Any, method: str = "forward", fn: Callable[..., Any] | None = None,
    owner: str | None = None,
) -> Any:  # fmt: skip
    """Call ``fn`` on every call of ``target.method`` (``target``: a class or a dotted path).

    ``forward`` of a torch module: ``fn(module, input, output)``; ``backward``:
    ``fn(module, grad_input, grad_output)``; any other method: ``fn(self, args, kwargs,
    result)`` after the call. Without ``fn``, a decorator. Returns ``fn``; the
    :class:`Handle` is ``fn.pprobe_hook``."""
    if fn is None:
        return lambda f: register_hook(target, method, f, owner)
    if not callable(fn):
        raise tables.ExtensionError(f"register_hook: {fn!r} is not callable")
    if not isinstance(method, str) or not method.isidentifier():
        raise tables.ExtensionError(f"register_hook: method {method!r} is not a method name")
    if isinstance(target, type):
        path = f"{target.__module__}.{target.__qualname__}"
    elif (
        isinstance(target, str)
        and all(p.isidentifier() for p in target.split("."))
        and ("." in target)
    ):
        path = target
    else:
        raise tables.ExtensionError(
            f"register_hook: target {target!r} is not valid; allowed: a class or a dotted path "
            "such as 'torch.nn.Linear'"
        )
    h = Handle("class", path, method, fn, owner)
    handles.append(h)
    if isinstance(target, type):
        h.resolved = True
        _hook_class(h, target)
    else:
        _when_imported(path, h, lambda _owner, cls, _name: _hook_class(h, cls))
    try:
        fn.pprobe_hook = h  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass
    return fn


def _is_module_class(cls: Any) -> bool:
    torch_nn = sys.modules.get("torch.nn")
    return torch_nn is not None and isinstance(cls, type) and issubclass(cls, torch_nn.Module)


def _hook_class(h: Handle, cls: Any) -> None:
    if not isinstance(cls, type):
        raise TypeError(f"{h.target} is a {type(cls).__name__}, not a class")
    if h.method in ("forward", "backward") and _is_module_class(cls):
        from torch.nn.modules import module as tm

        if h.method == "forward":

            def fwd(module: Any, inp: Any, out: Any) -> None:
                if isinstance(module, cls):
                    h.call(module, inp, out)
                return None  # never a replacement output

            r = tm.register_module_forward_hook(fwd)
        else:

            def bwd(module: Any, gin: Any, gout: Any) -> None:
                if isinstance(module, cls):
                    h.call(module, gin, gout)
                return None  # never a replacement gradient

            r = tm.register_module_full_backward_hook(bwd)
        h._undo.append(r.remove)
        return
    method = h.method or ""
    if not callable(getattr(cls, method, None)):
        raise AttributeError(f"{cls.__qualname__} has no method {method!r}")
    for c in [cls, *_subclasses(cls)]:
        if method in c.__dict__:
            _wrap_attr(h, c, method, after=True)


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    return out


def _wrap_attr(h: Handle, owner: Any, name: str, after: bool) -> Any:
    """Wrap ``owner.name`` with wrapt; the hook is told of each call (never changes it)."""
    import wrapt

    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        lead = () if instance is None or isinstance(instance, type) else (instance,)
        if not after:
            h.call(*lead, *args, **kwargs)
            return wrapped(*args, **kwargs)
        result = wrapped(*args, **kwargs)
        h.call(*lead, args, kwargs, result)
        return result

    w = wrapt.FunctionWrapper(original, wrapper)
    setattr(owner, name, w)

    def undo() -> None:
        if (owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)) is w:
            setattr(owner, name, original)

    h._undo.append(undo)
    return w


# ---------------------------------------------------------------------- hook_function
def hook_function(path: str, fn: Callable[..., Any] | None = None,
                  owner: str | None = None) -> Any:  # fmt: skip
    """Call ``fn`` with each call's arguments (a method's instance first), before the call,
    for the function or method at dotted ``path``. Without ``fn``, a decorator."""
    if fn is None:
        return lambda f: hook_function(path, f, owner)
    if (
        not isinstance(path, str)
        or "." not in path
        or not all(p.isidentifier() for p in path.split("."))
    ):
        raise tables.ExtensionError(
            f"hook_function: {path!r} is not valid; allowed: a dotted path such as "
            "'pkg.mod.func' or 'pkg.mod.Class.method'"
        )
    h = Handle("function", path, None, fn, owner)
    handles.append(h)

    def apply(parent: Any, obj: Any, name: str) -> None:
        if not callable(obj):
            raise TypeError(f"{path} is a {type(obj).__name__}, not a function")
        original = parent.__dict__.get(name, obj) if isinstance(parent, type) else obj
        w = _wrap_attr(h, parent, name, after=False)
        if not isinstance(parent, type):
            _rebind(h, original, w)

    _when_imported(path, h, apply)
    try:
        fn.pprobe_hook = h  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass
    return fn


def _rebind(h: Handle, original: Any, wrapper: Any) -> None:
    """Module globals bound to ``original`` before the hook (``from m import f``) now name
    the wrapper. Other references (a bound method, a local, a container) cannot be reached."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict) or mod is None:
            continue
        for k, v in list(d.items()):
            if v is original:
                d[k] = wrapper

                def undo(d: dict = d, k: str = k) -> None:
                    if d.get(k) is wrapper:
                        d[k] = original

                h._undo.append(undo)


def remove_owned(owner: str) -> int:
    """Remove the hooks a plugin registered; returns how many."""
    mine = [h for h in handles if h.owner == owner]
    for h in mine:
        h.remove()
    return len(mine)


__all__ = ["register_hook", "hook_function", "Handle", "handles", "remove_owned"]
