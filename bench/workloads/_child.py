"""Helpers for the benchmark's child programs: read the arguments, stop the probe, report.

A child program is started by ``bench/harness.py`` as ``python bench/workloads/<name>.py
'<json args>'`` in a fresh interpreter, with or without pprobe's bootstrap on PYTHONPATH. It
prints one line ``BENCH_RESULT {json}`` on stdout. This module imports only the standard
library, so it never changes what the probe sees or how long start-up takes.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

MARK = "BENCH_RESULT "
ARGS: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
#: "cpu": process CPU time (every thread of the child, pprobe's writer included), robust on a
#: machine that other processes share; "wall": elapsed time. The other is reported too.
CLOCK = ARGS.get("clock", "cpu")


class Span:
    """Times a block on both clocks; ``.s`` is the chosen one, ``.wall`` and ``.cpu`` both."""

    def __enter__(self) -> Span:
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c
        self.s = self.cpu if CLOCK == "cpu" else self.wall

    def put(self, out: dict[str, Any], key: str) -> None:
        """out[key] (chosen clock), out[key + '_wall'], out[key + '_cpu']."""
        out[key], out[key + "_wall"], out[key + "_cpu"] = self.s, self.wall, self.cpu


def session() -> Any:
    """pprobe's active session in this process, or None (probe absent or off)."""
    mod = sys.modules.get("pprobe.session")
    return None if mod is None else mod.Session.active


def rows_per_call(fn: Any, n: int = 200) -> float | None:
    """How many log rows ``fn(n)`` (n calls of one op) adds, per call; None without a probe.

    Flushes the writer before and after (outside any timing) so that every row is counted.
    """
    s = session()
    if s is None:
        return None
    s.writer.flush()
    before = s.writer.rows_written
    fn(n)
    s.writer.flush()
    return (s.writer.rows_written - before) / n


def calibrated(fn: Any, n_max: int, target_s: float, n_min: int = 200) -> int:
    """Calls per timed loop so that one loop takes about ``target_s`` (also the warm-up).

    A probed op can be 100x slower than the bare one: a fixed count would make the slow
    variants run for minutes.
    """
    probe = 500
    per_call = fn(probe) / 1e9 / probe
    return int(max(n_min, min(n_max, target_s / max(per_call, 1e-9))))


def finish_probe() -> tuple[float, dict[str, Any]]:
    """Stop pprobe as the program's exit would (flush the log, write meta.json).

    Returns the seconds it took and facts about what the probe did: which frameworks it
    installed, why torch was not probed when it was not, rows written, dumps, internal errors.
    """
    s = session()
    if s is None:
        return 0.0, {"active": False, "untouched": untouched()}
    installed = sorted(s.installed)
    coverage = json.loads(json.dumps(s.run.coverage, default=str))
    with Span() as sp:
        s.stop()
    dt = sp.s
    facts: dict[str, Any] = {
        "active": True,
        "installed": installed,
        "coverage": coverage,
        "config": {"mode": s.config.mode, "torch_levels": list(s.config.torch_levels)},
        "rows": s.writer.rows_written,
        "dumps": s.dumper.summary() if s.dumper is not None else None,
        "run_dir": s.run.dir,
    }
    report = sys.modules.get("pprobe._report")
    if report is not None and report.errors:
        facts["errors"] = [
            f"{e.get('where')}: {e.get('type', '')} {e.get('message', '')}".strip()
            for e in report.errors[:5]
        ]
    if "torch" in sys.modules and "torch" not in installed and "torch" in s.config.frameworks:
        facts["torch_error"] = _torch_probe_error()
    return dt, facts


def untouched() -> dict[str, bool]:
    """Whether the frameworks this process imported are exactly as without pprobe.

    With PPROBE=0 nothing may be patched: then the steady-state cost is zero by
    construction, whatever a noisy timing says.
    """
    out: dict[str, bool] = {"pprobe_session_imported": "pprobe.session" in sys.modules}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy_unpatched"] = type(np.add) is np.ufunc and type(np.mean).__module__ != "wrapt"
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.overrides import _get_current_function_mode_stack

        out["torch_no_mode"] = not _get_current_function_mode_stack()
    return out


def _torch_probe_error() -> str:
    """Why the torch interceptor is not installed (session.py hides a missing module)."""
    from pprobe import session as sess

    name = sess.INTERCEPTORS.get("torch", "?")
    try:
        importlib.import_module(name)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return f"{name} imports but was not installed"


def emit(result: dict[str, Any]) -> None:
    """Print the result line the harness parses (after stopping the probe, timed)."""
    dt, facts = finish_probe()
    result.setdefault("finish_s", 0.0)
    result["finish_s"] += dt
    result["probe"] = facts
    sys.stdout.write(MARK + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
