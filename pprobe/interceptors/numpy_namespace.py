"""Where NumPy's namespace is recorded: ``np.*`` functions, ufuncs and their methods.

Full coverage (the self-test of :mod:`pprobe._cpython` passed): NumPy's own objects stay in
its namespace, and calls are caught where every caller ends up, whatever name it used:

* ufuncs and array-function dispatchers (``np.add``, ``np.sum``: about 400 of NumPy's 700
  public callables) at their type's call slot (:func:`pprobe._cpython.install_call_slot`):
  ``np.ufunc.__call__`` and the dispatcher type's ``__call__`` are Python functions that look
  the called object up in :data:`_targets` (filled from the public namespaces; an object not
  there, such as a SciPy ufunc or a private dispatcher, is called straight through);
  ``reduce/accumulate/reduceat/outer/at`` are replaced in ``np.ufunc``'s type dict;
* NumPy's Python functions (``np.ones``, ``np.eye``, ``np.loadtxt``: about 200) keep their
  identity too: their ``__code__`` is swapped for a generated trampoline (same name, file and
  first line, so ``inspect.getsource`` is unchanged; ``__signature__`` keeps the signature)
  that calls a copy of the function holding the original code;
* what has neither a type of its own nor code (18 C builtins such as ``np.array``, numpy.random's
  module functions, which are bound methods of a hidden ``RandomState``, and Cython functions)
  is replaced in the namespace by a :class:`FunctionProxy`, as in namespace coverage.

So ``type(np.mean)``, ``func is np.add`` inside ``__array_ufunc__``/``__array_function__``
(also for a ``like=`` call) and ``pickle.loads(...) is np.cos`` are as unprobed.

Namespace coverage (``PPROBE_COVERAGE=namespace`` or a failed self-test): every public callable
is replaced in the module's namespace by a :class:`wrapt.ObjectProxy` subclass whose
``__call__`` goes through :func:`pprobe.recorder.call`. One proxy per original object, so
``np.fft.fft is np.fft.fft``. Proxies keep what NumPy and users rely on (FINDINGS 2):
isinstance, the ufunc methods and attributes, docstrings, ``inspect.signature`` (via
``__wrapped__``), ``==`` and hashing, pickling by reference and deepcopy. C code that reads
``numpy.add`` and needs a real ufunc gets the original: extension modules while they are
imported (the importing thread only), and the NumPy functions listed in
``UFUNC_READERS``/``UFUNC_TAKERS``. Known differences in that mode: ``type(np.add) is
np.ufunc``, ``func is np.add`` inside ``__array_ufunc__``/``__array_function__`` and
``pickle.loads(...) is np.cos`` are False (NumPy hands out the originals).

Submodules NumPy loads lazily (numpy.fft, numpy.random, ...) are patched by post-import hooks
when the program imports them. :func:`uninstall` puts every original back.
"""

from __future__ import annotations

import copyreg
import functools
import importlib
import inspect
import sys
import threading
import types
import warnings
from typing import Any

import numpy as np
import wrapt

from .. import _cpython, core, recorder
from . import numpy_arrays, numpy_ndarray

_call = recorder.call
_hidden = recorder.hidden
#: The native core when it is the engine (pprobe.core): it switches each ufunc's and
#: dispatcher's vectorcall pointer; no ctypes, no Python frame.
_native = core.native
#: ufunc method name -> {ufunc: op index} (native engine)
_native_method_ops: dict[str, dict[Any, int]] = {
    m: {} for m in ("reduce", "accumulate", "reduceat", "outer", "at")
}

#: Public module -> the name its functions are reported under.
MODULES = {
    "numpy": "numpy",
    "numpy.linalg": "numpy.linalg",
    "numpy.fft": "numpy.fft",
    "numpy.random": "numpy.random",
    "numpy.lib.scimath": "numpy.emath",
    "numpy.lib.stride_tricks": "numpy.lib.stride_tricks",
    "numpy.strings": "numpy.strings",
    "numpy.char": "numpy.char",
    "numpy.ma": "numpy.ma",
    "numpy.polynomial.polynomial": "numpy.polynomial.polynomial",
}
#: Configuration and introspection helpers, not array operations: never rows, and the calls
#: they make inside are hidden too (default_rng building a SeedSequence is not the program's op).
HIDDEN = frozenset(
    {
        "seterr",
        "geterr",
        "seterrcall",
        "geterrcall",
        "set_printoptions",
        "get_printoptions",
        "printoptions",
        "getbufsize",
        "setbufsize",
        "show_config",
        "show_runtime",
        "get_include",
        "info",
        "test",
        "add_newdoc",
        "add_docstring",
        "deprecate",
        "who",
        "typename",
        "set_string_function",
        "get_state",
        "set_state",
        "seed",
        "default_rng",
        "may_share_memory",
        "shares_memory",
        "iterable",
        "isscalar",
        "ndim",
        "shape",
        "size",
        "result_type",
        "promote_types",
        "can_cast",
        "min_scalar_type",
        "common_type",
        "issubdtype",
        "isdtype",
        "finfo",
        "iinfo",
        "broadcast_shapes",
        "getdata",
        "getmask",
        "getmaskarray",
        "is_mask",
        "isMaskedArray",
        "isMA",
        "isarray",
        "is_masked",
    }
)

_UFUNC_METHODS = ("reduce", "accumulate", "reduceat", "outer", "at")


class FunctionProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """A recorded NumPy function (array-function dispatcher, builtin, or Python function)."""

    __slots__ = ("_self_op", "_self_orig")

    def __init__(self, wrapped: Any, op: recorder.Op) -> None:
        super().__init__(wrapped)
        self._self_op = op
        self._self_orig = wrapped

    @property  # type: ignore[override]
    def __wrapped__(self) -> Any:
        # What the original's own ``__wrapped__`` is where it has one: an array-function
        # dispatcher's is its implementation (``np.concatenate.__wrapped__`` is the C function,
        # NumPy's test_multiarray.py reads its __text_signature__). Otherwise the original
        # itself, which inspect.signature() and help() follow.
        orig = self._self_orig
        return getattr(orig, "__wrapped__", orig)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # pytest leaves this frame out of tracebacks
        return _call(self._self_op, self._self_orig, args, kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle by reference, like the original: pickle's save_global finds the proxy under
        # the original's module and name, so the name alone is the reduce value.
        w = self._self_orig
        mod = sys.modules.get(getattr(w, "__module__", None) or "")
        name = getattr(w, "__qualname__", None) or getattr(w, "__name__", None)
        if mod is not None and name and getattr(mod, name, None) is self:
            return name
        # What pickle does for the original: its type's copyreg reducer first (NumPy < 2.1
        # ufuncs have no __module__ and pickle through numpy's _ufunc_reduce).
        reducer = copyreg.dispatch_table.get(type(w))
        if reducer is not None:
            return reducer(w)
        return w.__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # Functions and array-function dispatchers are descriptors: stored on a class
        # (``class Vec(np.ndarray): total = np.sum``) they bind to the instance. Ufuncs are not.
        if instance is None or not hasattr(type(self._self_orig), "__get__"):
            return self
        return types.MethodType(self, instance)

    def __repr__(self) -> str:
        # wrapt's default names the proxy ("<FunctionProxy at 0x.. for ufunc>"): printing
        # np.add, help(np.sum) or a list of functions must show what it showed unprobed.
        return repr(self._self_orig)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


class HiddenProxy(FunctionProxy):
    """A helper that is never a row; what it calls inside is hidden too."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return _hidden(self._self_orig, args, kwargs)


class UfuncProxy(FunctionProxy):
    """A recorded ufunc: calls and each ufunc method are rows of their own kind."""

    def __init__(self, wrapped: Any, op: recorder.Op) -> None:
        super().__init__(wrapped, op)
        name = wrapped.__name__
        self._self_mops = {
            m: recorder.op(f"{op.name}.{m}", f"ufunc.{m}", "numpy", name) for m in _UFUNC_METHODS
        }

    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._self_mops["reduce"], self._self_orig.reduce, args, kwargs)

    def accumulate(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._self_mops["accumulate"], self._self_orig.accumulate, args, kwargs)

    def reduceat(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._self_mops["reduceat"], self._self_orig.reduceat, args, kwargs)

    def outer(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._self_mops["outer"], self._self_orig.outer, args, kwargs)

    def at(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._self_mops["at"], self._self_orig.at, args, kwargs)


for _m in _UFUNC_METHODS:  # help(np.add.reduce) and inspect.signature as unprobed
    getattr(UfuncProxy, _m).__doc__ = getattr(np.ufunc, _m).__doc__
    getattr(UfuncProxy, _m).__wrapped__ = getattr(np.ufunc, _m)

if _native is not None:
    # A proxy's call goes to the core from its class's tp_call, with no Python frame of
    # __call__ (which stays, with the same meaning, for the Python engine). HiddenProxy keeps
    # its own __call__.
    try:
        _native.set_proxy_call(FunctionProxy, (FunctionProxy, UfuncProxy))
    except Exception as _e:  # a core that does not fit: the proxies' Python __call__
        from .. import _report

        _report.internal_error("the NumPy proxies' native call", _e)


# ------------------------------------------------------------------------ patching
def find_dispatcher_type(numpy: Any = np) -> type | None:
    """NumPy's array-function dispatcher class, found by its name (NumPy >= 1.25), or None.

    Never ``type(np.sum)``: before NumPy 1.25 that is ``function``, and patching its call
    slot (or hooking every instance's vectorcall) would catch every Python function."""
    for where in ("_core", "core"):  # NumPy 2 / NumPy 1.25-1.26 (no deprecated import)
        sub = numpy.__dict__.get(where)
        umath = getattr(sub, "_multiarray_umath", None) if sub is not None else None
        tp = getattr(umath, "_ArrayFunctionDispatcher", None)
        if isinstance(tp, type) and tp.__name__ == "_ArrayFunctionDispatcher":
            return tp
    return None


#: None on a NumPy without the class: its dispatchers are Python functions then, recorded as
#: NumPy's other Python functions are.
_dispatcher_type: Any = find_dispatcher_type()
_proxies: dict[int, FunctionProxy] = {}  # id(original) -> proxy
_patched: list[tuple[types.ModuleType, str, Any]] = []  # (module, attr, original)
_patched_modules: list[types.ModuleType] = []
_installed = False


def _classify(obj: Any) -> str | None:
    if isinstance(obj, np.ufunc):
        return "ufunc"
    if _dispatcher_type is not None and isinstance(obj, _dispatcher_type):
        return "function"
    if isinstance(obj, types.BuiltinFunctionType):
        return "function"
    if type(obj).__name__ == "cython_function_or_method":  # numpy.random.default_rng, ...
        return "function"
    if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("numpy"):
        return "function"
    if isinstance(obj, types.MethodType) and type(obj.__self__).__name__ == "RandomState":
        return "function"
    return None


def _proxy_for(obj: Any, public: str, attr: str, hidden: bool) -> FunctionProxy | None:
    p = _proxies.get(id(obj))
    if p is not None:
        return p
    kind = _classify(obj)
    if kind is None:
        return None
    name = f"{public}.{attr}"
    if hidden:
        p = HiddenProxy(obj, recorder.op(name, kind, "numpy"))
    elif kind == "ufunc":
        p = UfuncProxy(obj, recorder.op(name, "ufunc", "numpy", obj.__name__))
    else:
        p = FunctionProxy(obj, recorder.op(name, kind, "numpy"))
    _proxies[id(obj)] = p
    return p


def patch_module(mod: types.ModuleType) -> int:
    """Record the public callables of one module; return how many."""
    public = MODULES[mod.__name__]
    n = 0
    for attr, obj in list(vars(mod).items()):
        if attr.startswith("_") or isinstance(obj, FunctionProxy):
            continue
        # Aliases (np.concat, np.abs, np.permute_dims) are one object: name its row by the
        # object's own name where the module exports it, not by whichever alias comes first.
        canon = getattr(obj, "__name__", None)
        label = canon if isinstance(canon, str) and vars(mod).get(canon) is obj else attr
        hidden = attr in HIDDEN
        if _full:
            done = _record_in_place(obj, public, label, hidden)
            if done is not None:
                n += done
                continue
        p = _proxy_for(obj, public, label, hidden=hidden)
        if p is None:
            continue
        setattr(mod, attr, p)
        _patched.append((mod, attr, obj))
        n += 1
    return n


# ------------------------------------------------------------------------ full coverage
_full = False  # NumPy's objects stay in place (see the module docstring)
_dispatcher_orig_call: Any = None
_ufunc_orig_call: Any = None
_ufunc_orig_methods: dict[str, Any] = {}
#: id(ufunc or dispatcher) -> (op, bound original call (None with the native engine, which
#: keeps it in C), the object itself). A helper of HIDDEN has a hidden op: call() hides it.
_targets: dict[int, tuple[recorder.Op, Any, Any]] = {}
#: ufunc method name -> {id(ufunc): (op, bound original method)}
_method_targets: dict[str, dict[int, tuple[recorder.Op, Any]]] = {m: {} for m in _UFUNC_METHODS}
#: Python functions whose code was swapped: (function, original code, had __signature__)
_swapped: list[tuple[types.FunctionType, types.CodeType, bool]] = []
_swapped_ids: set[int] = set()
_CO_NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coro, async gen


def _make_call(orig_call: Any) -> Any:
    """The ``__call__`` put in a type's dict (see :func:`_cpython.install_call_slot`)."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        t = _targets.get(id(self))
        if t is None:  # not a public NumPy callable (SciPy's ufuncs, NumPy's private ones)
            return orig_call(self, *args, **kwargs)
        return _call(t[0], t[1], args, kwargs)

    return __call__


def _make_ufunc_method(name: str, orig: Any) -> Any:
    targets = _method_targets[name]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = targets.get(id(self))
        if t is None:
            return orig(self, *args, **kwargs)
        return _call(t[0], t[1], args, kwargs)

    method.__name__ = name
    method.__qualname__ = f"ufunc.{name}"
    method.__doc__ = orig.__doc__
    method.__wrapped__ = orig  # type: ignore[attr-defined]  # inspect.signature, help()
    return method


_template: types.CodeType | None = None
_PLACEHOLDERS = ("__pprobe_call__", "__pprobe_op__", "__pprobe_fn__")


def _trampoline_template() -> types.CodeType:
    """``def f(*args, **kwargs): return CALL(OP, FN, args, kwargs)`` with the three names as
    constants of the code object, to be replaced per function (no global name is needed)."""
    global _template
    if _template is None:
        call, op, fn = _PLACEHOLDERS
        src = f"def f(*args, **kwargs):\n    return '{call}'('{op}', '{fn}', args, kwargs)\n"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "'str' object is not callable"
            module = compile(src, "<pprobe trampoline>", "exec")
        code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
        if sorted(c for c in code.co_consts if c in _PLACEHOLDERS) != sorted(_PLACEHOLDERS):
            raise RuntimeError("unexpected trampoline constants")
        _template = code
    return _template


def _swap_code(func: types.FunctionType, op: recorder.Op) -> bool:
    """Make ``func`` record its calls without replacing it (see the module docstring)."""
    code = func.__code__
    if code.co_freevars or code.co_flags & _CO_NOT_PLAIN:
        return False  # a closure's code cannot be swapped; generators would change kind
    inner = types.FunctionType(code, func.__globals__, func.__name__, func.__defaults__)
    inner.__kwdefaults__ = func.__kwdefaults__
    inner.__qualname__ = func.__qualname__
    inner.__module__ = func.__module__
    inner.__doc__ = func.__doc__
    template = _trampoline_template()
    subst = dict(zip(_PLACEHOLDERS, (_call, op, inner), strict=True))
    consts = tuple(subst.get(c, c) if type(c) is str else c for c in template.co_consts)
    changes: dict[str, Any] = {
        "co_consts": consts,
        "co_name": code.co_name,
        "co_filename": code.co_filename,
        "co_firstlineno": code.co_firstlineno,
    }
    if sys.version_info >= (3, 11):
        changes["co_qualname"] = code.co_qualname
    tramp = template.replace(**changes)
    had_sig = "__signature__" in func.__dict__
    if not had_sig:
        func.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    recorder.add_internal_code(tramp)
    func.__code__ = tramp
    _swapped.append((func, code, had_sig))
    _swapped_ids.add(id(func))
    return True


def _record_in_place(obj: Any, public: str, attr: str, hidden: bool) -> int | None:
    """Full coverage: record ``obj`` without replacing it. 1 (newly recorded) or 0 (already),
    None when it needs a proxy."""
    key = id(obj)
    if key in _targets or key in _swapped_ids:
        return 0
    name = f"{public}.{attr}"
    if isinstance(obj, np.ufunc):
        op = recorder.op(name, "ufunc", "numpy", obj.__name__, hidden=hidden)
        for m in _UFUNC_METHODS:
            mop = recorder.op(f"{name}.{m}", f"ufunc.{m}", "numpy", obj.__name__)
            if _native is not None:
                _native_method_ops[m][obj] = mop.index
            else:
                _method_targets[m][key] = (mop, _ufunc_orig_methods[m].__get__(obj))
        orig_call = _ufunc_orig_call
    elif _dispatcher_type is not None and isinstance(obj, _dispatcher_type):
        op = recorder.op(name, "function", "numpy", hidden=hidden)
        orig_call = _dispatcher_orig_call
    else:
        if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("numpy"):
            # NumPy's own code calling them is hidden by the recorder anyway: a hidden helper
            # (np.seterr, np.printoptions) needs nothing.
            if hidden or _swap_code(obj, recorder.op(name, "function", "numpy")):
                return 0 if hidden else 1
        return None
    if _native is not None:
        _native.hook(obj, op.index)  # its own vectorcall pointer now reaches the core
        _targets[key] = (op, None, obj)
    else:
        _targets[key] = (op, orig_call.__get__(obj), obj)
    return 1


def _install_full() -> None:
    """Switch the call slots of ufuncs and dispatchers and ufunc's methods (full coverage)."""
    global _dispatcher_orig_call, _ufunc_orig_call
    if _native is not None:
        # Native engine: each public instance's own vectorcall pointer is switched as it is
        # found (_record_in_place); ufunc's methods become MethodProbes looking the op up by
        # the ufunc they are called on.
        for m in _UFUNC_METHODS:
            orig = np.ufunc.__dict__[m]
            _ufunc_orig_methods[m] = orig
            _native.set_type_attr(np.ufunc, m, _native.MethodProbe(orig, -1, _native_method_ops[m]))
        return
    _ufunc_orig_call = _cpython.original(np.ufunc, "__call__")
    for m in _UFUNC_METHODS:
        _ufunc_orig_methods[m] = orig = _cpython.original(np.ufunc, m)
        _cpython.set_type_attr(np.ufunc, m, _make_ufunc_method(m, orig))
    _cpython.install_call_slot(np.ufunc, _make_call(_ufunc_orig_call))
    if _dispatcher_type is not None:
        _dispatcher_orig_call = _cpython.original(_dispatcher_type, "__call__")
        _cpython.install_call_slot(_dispatcher_type, _make_call(_dispatcher_orig_call))
    # A check on the live objects before anything is recorded: the originals are reached.
    probe = np.arange(3.0)
    if not (np.add(probe, 1.0)[2] == 3.0 and np.add.reduce(probe) == 3.0 and np.sum(probe) == 3.0):
        raise RuntimeError("ufunc and dispatcher calls give wrong results after the switch")


def _uninstall_full() -> None:
    if _native is not None:
        _native.unhook_all()
        for m, orig in _ufunc_orig_methods.items():
            _native.set_type_attr(np.ufunc, m, orig)
        _ufunc_orig_methods.clear()
        for by_ufunc in _native_method_ops.values():
            by_ufunc.clear()
    else:
        for tp in (np.ufunc, _dispatcher_type):
            if tp is not None:
                _cpython.restore(tp)
    _targets.clear()
    for d in _method_targets.values():
        d.clear()
    for func, code, had_sig in reversed(_swapped):
        func.__code__ = code
        if not had_sig:
            func.__dict__.pop("__signature__", None)
    _swapped.clear()
    _swapped_ids.clear()


def probed(obj: Any) -> bool:
    """Whether calls of ``obj`` (a public NumPy callable as the namespace holds it now) are
    recorded: a proxy, or an original recorded in place."""
    if isinstance(obj, FunctionProxy):
        return True
    if _installed and _native is not None and id(obj) in _targets:
        return bool(_native.is_hooked(obj))
    return _installed and (id(obj) in _targets or id(obj) in _swapped_ids)


def _on_import(mod: types.ModuleType) -> None:
    if not _installed or getattr(mod, "__pprobe_patched__", False):
        return
    from .. import _report

    try:
        patch_module(mod)
        mod.__pprobe_patched__ = True  # type: ignore[attr-defined]
        _patched_modules.append(mod)
        if mod.__name__ == "numpy.random":
            numpy_ndarray.patch_random(mod)
    except Exception as e:  # never break the user's import
        _report.internal_error(f"patching {mod.__name__}", e)


_hooks_registered = False


class _ModuleRef:
    """Pickles as ``importlib.import_module(name)``: lets a reduce value name a module."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> Any:
        return (importlib.import_module, (self.name,))


def _reduce_original(obj: Any) -> Any:
    """copyreg reducer for the *original* ufuncs and dispatchers while their names hold proxies.

    NumPy hands originals out (exception args such as UFuncTypeError's, ``__array_ufunc__``)
    and pickles them by name; pickle then refuses them because ``numpy.add`` is now the proxy
    ("not the same object"), which breaks e.g. multiprocessing sending back an exception.
    ``getattr(import_module(module), name)`` unpickles anywhere, with or without pprobe.
    """
    name = getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None) or "numpy"
    p = _proxies.get(id(obj))
    if p is not None and name and getattr(sys.modules.get(module), name, None) is p:
        return (getattr, (_ModuleRef(module), name))
    saved = _saved_reducers.get(type(obj))
    return saved(obj) if saved is not None else obj.__reduce__()


_saved_reducers: dict[type, Any] = {}


def _install_reducers() -> None:
    for tp in (np.ufunc, _dispatcher_type):
        if tp is None:
            continue
        if copyreg.dispatch_table.get(tp) is not _reduce_original:
            _saved_reducers[tp] = copyreg.dispatch_table.get(tp)
            copyreg.pickle(tp, _reduce_original)


def _uninstall_reducers() -> None:
    for tp, saved in list(_saved_reducers.items()):
        if copyreg.dispatch_table.get(tp) is _reduce_original:
            if saved is None:
                del copyreg.dispatch_table[tp]
            else:
                copyreg.dispatch_table[tp] = saved
    _saved_reducers.clear()


# ------------------------------------------------------------------ extension modules
# C extensions that add loops to NumPy's ufuncs when they are imported (NumPy's own
# _rational_tests, ml_dtypes' bfloat16, ...) fetch ``numpy.add`` with PyObject_GetAttrString
# and cast it to ``PyUFuncObject *`` without a type check: a proxy there is read as a ufunc
# (garbage ``nargs``: "ufunc add takes 312429120 arguments") and would be written to. New-style
# dtypes look up np.sort/np.argsort the same way. So while an extension module is created and
# executed, *the importing thread* reads the original objects from the patched modules: their
# class is switched to :class:`_OriginalsModule` for that time, whose ``__getattribute__``
# answers that thread with the originals and every other thread as usual (the proxies).
class _ExtLocal(threading.local):
    depth = 0  # extension inits this thread is inside


_ext_local = _ExtLocal()
_ext_lock = threading.Lock()
_ext_active = 0  # extension inits under way, all threads
_ext_originals: dict[tuple[int, str], Any] = {}  # (id(module), attr) -> original
_ext_modules: list[types.ModuleType] = []  # modules whose class is _OriginalsModule
_ext_saved: dict[str, Any] = {}


class _OriginalsModule(types.ModuleType):
    def __getattribute__(self, name: str) -> Any:
        if _ext_local.depth:
            orig = _ext_originals.get((id(self), name))
            if orig is not None:
                return orig
        return types.ModuleType.__getattribute__(self, name)


class _OriginalsForThisThread:
    __slots__ = ()

    def __enter__(self) -> None:
        global _ext_active
        _ext_local.depth += 1
        with _ext_lock:
            _ext_active += 1
            if _ext_active > 1:
                return
            for mod, attr, orig in _patched:
                if vars(mod).get(attr) is _proxies.get(id(orig)):
                    _ext_originals[(id(mod), attr)] = orig
                    if type(mod) is types.ModuleType and mod not in _ext_modules:
                        mod.__class__ = _OriginalsModule
                        _ext_modules.append(mod)

    def __exit__(self, *exc: object) -> None:
        global _ext_active
        _ext_local.depth -= 1
        with _ext_lock:
            _ext_active -= 1
            if _ext_active:
                return
            for mod in _ext_modules:
                if type(mod) is _OriginalsModule:
                    mod.__class__ = types.ModuleType  # type: ignore[assignment]
            _ext_modules.clear()
            _ext_originals.clear()


_GUARD = _OriginalsForThisThread()
#: NumPy C functions that fetch public ufuncs by name when *called* (not at import) and refuse
#: a proxy ("numpy.multiply was not a ufunc!"): they run with the original ufuncs in place.
#: ``_get_sfloat_dtype`` (the scaled-float test dtype of NumPy's test suite) registers its
#: loops on numpy.multiply, numpy.add... the first time it is called.
UFUNC_READERS = {"numpy._core._multiarray_umath": ("_get_sfloat_dtype",)}
#: NumPy C functions that type-check a ufunc argument (``_add_newdoc_ufunc() argument 1 must be
#: numpy.ufunc, not UfuncProxy``): a proxy passed to them is replaced by its original.
UFUNC_TAKERS = {
    "numpy._core.umath": ("_add_newdoc_ufunc",),
    "numpy._core._multiarray_umath": ("_add_newdoc_ufunc",),
}
_readers: list[tuple[types.ModuleType, str, Any]] = []


def _guarded(f: Any) -> Any:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with _GUARD:
            return f(*args, **kwargs)

    return guarded


def _unwrapping(f: Any) -> Any:
    def unwrapping(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a._self_orig if isinstance(a, FunctionProxy) else a for a in args)
        return f(*args, **kwargs)

    return unwrapping


def _guard_ufunc_readers() -> None:
    for table, make in ((UFUNC_READERS, _guarded), (UFUNC_TAKERS, _unwrapping)):
        for modname, names in table.items():
            mod = sys.modules.get(modname)
            if mod is None:
                continue
            for name in names:
                f = getattr(mod, name, None)
                if f is None or any(m is mod and n == name for m, n, _ in _readers):
                    continue
                setattr(mod, name, functools.update_wrapper(make(f), f))
                _readers.append((mod, name, f))


def _unguard_ufunc_readers() -> None:
    for mod, name, f in reversed(_readers):
        setattr(mod, name, f)
    _readers.clear()


def _install_extension_guard() -> None:
    from importlib.machinery import ExtensionFileLoader as L

    _guard_ufunc_readers()
    if _ext_saved:
        return
    guard = _GUARD
    create, execute = L.create_module, L.exec_module

    def create_module(self: Any, spec: Any) -> Any:
        with guard:
            return create(self, spec)

    def exec_module(self: Any, module: Any) -> None:
        with guard:
            return execute(self, module)

    _ext_saved.update(create_module=create, exec_module=execute)
    L.create_module, L.exec_module = create_module, exec_module  # type: ignore[method-assign]


def _uninstall_extension_guard() -> None:
    from importlib.machinery import ExtensionFileLoader as L

    for name, orig in _ext_saved.items():
        setattr(L, name, orig)
    _ext_saved.clear()
    _unguard_ufunc_readers()


def install() -> dict[str, Any]:
    """Patch numpy now and its submodules as they are imported. Returns coverage facts."""
    global _installed, _hooks_registered, _full
    numpy_arrays.register()
    recorder.add_internal_path(np.__file__, owner="numpy")
    recorder.add_internal_path(wrapt.__file__)  # its import-hook loader runs module bodies
    cfg = recorder.current_config()
    facts = numpy_ndarray.install(cfg.coverage if cfg is not None else "auto")
    _full = facts["coverage"] == "full"
    if _full:
        try:
            _install_full()
        except Exception as e:
            from .. import _report

            _uninstall_full()
            numpy_ndarray.uninstall()
            _report.internal_error("switching ufunc and dispatcher calls", e)
            _full = False
            facts = {"coverage": "namespace", "reason": f"{type(e).__name__}: {e}"}
    if not _full:
        _install_reducers()
        _install_extension_guard()
    _installed = True
    if not _hooks_registered:
        _hooks_registered = True
        for name in MODULES:
            # Fires at once for modules already imported, later for lazy ones.
            wrapt.register_post_import_hook(_on_import, name)
    else:
        for name in MODULES:
            if name in sys.modules:
                _on_import(sys.modules[name])
    return {
        "coverage": facts.pop("coverage"),
        "numpy": {"namespace_functions": len(_targets) + len(_swapped) + len(_patched),
                  "in_place": len(_targets) + len(_swapped), "proxies": len(_patched),
                  "numpy_version": np.__version__, **facts},
    }  # fmt: skip


def uninstall() -> None:
    """Put every original object back where it was."""
    global _installed, _full
    _installed = False
    numpy_ndarray.uninstall()
    if _full:
        _uninstall_full()
        _full = False
    _uninstall_reducers()
    _uninstall_extension_guard()
    for mod, attr, orig in reversed(_patched):
        if getattr(mod, attr, None) is _proxies.get(id(orig)):
            setattr(mod, attr, orig)
    _patched.clear()
    for mod in _patched_modules:
        mod.__dict__.pop("__pprobe_patched__", None)
    _patched_modules.clear()
