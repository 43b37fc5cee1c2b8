"""``PPROBE_STEP_AT``: training steps for loops without an optimizer (NumPy loops included).

Two forms (comma-separated, several allowed):

* ``pkg.mod:func`` (or ``pkg.mod:Class.method``): each call of that function is a step. The
  function is replaced in its module (or class) by a wrapper when the module is imported (at
  once when it already is): the n-th call (0-based) runs in step n, and lifecycle hooks see
  ``before_step(n)`` as it is entered and ``after_step(n)`` as it returns or raises. A call
  made inside another call of it (recursion) is part of the outer step. A reference taken
  before the patch (only possible when the module was imported before pprobe started) keeps
  calling the original. The program's own script (``__main__``) is not importable by name:
  use the ``file.py:LINE`` form for its functions (the first line of the function's body).
* ``file.py:LINE``: each time that line starts running, a step starts: its n-th run (0-based)
  begins step n (``after_step(n-1)``, then ``before_step(n)``); the last step ends with the
  program. The file is matched by its path from the working folder, or by its path's tail
  (``train.py`` matches ``/any/where/train.py``). Python 3.12+: ``sys.monitoring`` line
  events, switched on for the code objects of that line only. Python 3.10/3.11: a
  ``sys.settrace`` function that looks at each Python call once per code object and traces
  lines in the target code only (never a per-line tracer on all code); it stands aside when
  another tracer (a debugger, coverage) is set.

Rows recorded before the first step are in step 0 (their ``phase`` is ``init``). A step set
here stops the optimizer's step counting, like ``pprobe.step()``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from typing import Any

from . import _report, recorder, state

_funcs: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) to restore
_calls = 0  # calls of PPROBE_STEP_AT functions so far (the next step)
_line_hits = 0
_depth = threading.local()
_targets: list[tuple[str, int]] = []  # (file spec, line)
_code_lines: dict[Any, tuple[int, ...]] = {}  # code object -> target lines it holds ((): none)
_tracing = False
_monitoring_id: int | None = None


def install(specs: Any) -> None:
    for spec in specs:
        path, _, tail = spec.rpartition(":")
        if tail.isdigit():
            _targets.append((path, int(tail)))
        else:
            _watch_function(path, tail)
    if _targets:
        _start_lines()


def uninstall() -> None:
    global _tracing, _monitoring_id
    for owner, attr, orig in reversed(_funcs):
        try:
            setattr(owner, attr, orig)
        except Exception:  # noqa: BLE001
            pass
    _funcs.clear()
    if _tracing:
        if sys.gettrace() is _global_trace:
            sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        _tracing = False
    if _monitoring_id is not None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        mon.set_events(_monitoring_id, 0)
        mon.free_tool_id(_monitoring_id)
        _monitoring_id = None
    _targets.clear()
    _code_lines.clear()


# ---------------------------------------------------------------------- the step itself
def _lifecycle() -> Any:
    lc = sys.modules.get("pprobe.hooks.lifecycle")
    return lc if lc is not None and lc._active else None


def _begin(n: int) -> None:
    state.manual_step = True  # the optimizer hook stops counting
    lc = _lifecycle()
    if lc is None:
        recorder.set_step(n)
        return
    with lc.quiet():
        recorder.set_step(n)
    lc.begin_step(n)


# ---------------------------------------------------------------------- functions
def _watch_function(module: str, qualname: str) -> None:
    if module in sys.modules:
        _patch(sys.modules[module], module, qualname)
        return
    import wrapt

    def hook(mod: Any) -> None:
        try:
            _patch(mod, module, qualname)
        except Exception as exc:  # noqa: BLE001 - the program's import must go on
            _report.internal_error(f"PPROBE_STEP_AT {module}:{qualname}", exc)

    wrapt.register_post_import_hook(hook, module)


def _patch(mod: Any, module: str, qualname: str) -> None:
    owner: Any = mod
    *parents, attr = qualname.split(".")
    try:
        for p in parents:
            owner = getattr(owner, p)
        raw = inspect.getattr_static(owner, attr)
    except AttributeError:
        _report.warn_once(
            f"step_at {module}:{qualname}",
            f"PPROBE_STEP_AT={module}:{qualname}: {module} has no {qualname}; no steps from it.",
        )
        return
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    fn = raw.__func__ if kind is not None else raw
    if not callable(fn):
        _report.warn_once(
            f"step_at {module}:{qualname}",
            f"PPROBE_STEP_AT={module}:{qualname} is a {type(fn).__name__}, not a function; "
            "no steps from it.",
        )
        return
    wrapped = _wrap(fn)
    setattr(owner, attr, kind(wrapped) if kind is not None else wrapped)
    _funcs.append((owner, attr, raw))


def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def step_function(*args: Any, **kwargs: Any) -> Any:
        global _calls
        d = getattr(_depth, "n", 0)
        if d:  # recursion: part of the outer call's step
            _depth.n = d + 1
            try:
                return fn(*args, **kwargs)
            finally:
                _depth.n = d
        n = _calls
        _calls += 1
        try:
            with state.internal():
                _begin(n)
        except Exception as exc:  # noqa: BLE001
            _report.internal_error("PPROBE_STEP_AT step start", exc)
        _depth.n = 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth.n = 0
            lc = _lifecycle()
            if lc is not None:
                try:
                    lc.end_step()
                except Exception as exc:  # noqa: BLE001
                    _report.internal_error("PPROBE_STEP_AT step end", exc)

    step_function.__pprobe_step_at__ = True  # type: ignore[attr-defined]
    return step_function


# ---------------------------------------------------------------------- lines
def _file_matches(filename: str, spec: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    if os.path.isabs(spec):
        return os.path.abspath(filename) == os.path.normpath(spec)
    full = os.path.abspath(filename)
    if full == os.path.abspath(spec):
        return True
    tail = os.sep + os.path.normpath(spec)
    return full.endswith(tail)


def _lines_in(code: Any) -> tuple[int, ...]:
    """The target lines that ``code`` itself holds (nested functions are their own code)."""
    got = _code_lines.get(code)
    if got is None:
        # pprobe's trampolines (recorder.as_caller) carry the caller's file and line: not it
        own = code in recorder._own_code
        want = [] if own else [ln for spec, ln in _targets if _file_matches(code.co_filename, spec)]
        if want:
            have = {ln for _, _, ln in code.co_lines() if ln is not None}
            got = tuple(ln for ln in want if ln in have)
        else:
            got = ()
        _code_lines[code] = got
    return got


def _hit() -> None:
    global _line_hits
    n = _line_hits
    _line_hits += 1
    try:
        with state.internal():
            _begin(n)
    except Exception as exc:  # noqa: BLE001
        _report.internal_error("PPROBE_STEP_AT line step", exc)


def _start_lines() -> None:
    if sys.version_info >= (3, 12):
        _start_monitoring()
    else:
        _start_trace()


# Python 3.10/3.11: settrace, looking once per code object ------------------------------
def _global_trace(frame: Any, event: str, arg: Any) -> Any:
    code = frame.f_code
    lines = _code_lines.get(code)
    if lines is None:
        lines = _lines_in(code)
    if not lines:
        return None
    return _local_trace


def _local_trace(frame: Any, event: str, arg: Any) -> Any:
    if event == "line" and frame.f_lineno in _code_lines.get(frame.f_code, ()):
        _hit()
    return _local_trace


def _start_trace() -> None:
    global _tracing
    if sys.gettrace() is not None:
        _report.warn_once(
            "step_at tracer",
            "PPROBE_STEP_AT file:LINE cannot run: another tracer (a debugger, coverage) is "
            "set; no steps from it.",
        )
        return
    _tracing = True
    threading.settrace(_global_trace)
    sys.settrace(_global_trace)
    f: Any = sys._getframe(1)
    while f is not None:  # frames already running (pprobe.enable() inside the program)
        if _lines_in(f.f_code):
            f.f_trace = _local_trace
        f = f.f_back


# Python 3.12+: sys.monitoring, line events on the target code only -------------------------
def _start_monitoring() -> None:  # pragma: no cover - the CI interpreter of this file is 3.11
    global _monitoring_id
    mon = sys.monitoring  # type: ignore[attr-defined]
    for tool in (4, 3, 5, 1, 2):
        try:
            mon.use_tool_id(tool, "pprobe")
        except ValueError:
            continue
        _monitoring_id = tool
        break
    else:
        _report.warn_once("step_at tool", "PPROBE_STEP_AT file:LINE: no free sys.monitoring tool")
        return
    ev = mon.events

    def on_start(code: Any, offset: int) -> Any:
        if _lines_in(code):
            mon.set_local_events(tool, code, ev.LINE)
        return mon.DISABLE

    def on_line(code: Any, line: int) -> Any:
        if line in _code_lines.get(code, ()):
            _hit()
            return None
        return mon.DISABLE

    mon.register_callback(tool, ev.PY_START, on_start)
    mon.register_callback(tool, ev.LINE, on_line)
    mon.set_events(tool, ev.PY_START)
    for frame in sys._current_frames().values():
        f: Any = frame
        while f is not None:
            if _lines_in(f.f_code):
                mon.set_local_events(tool, f.f_code, ev.LINE)
            f = f.f_back
