"""Extra cost per call of routing ndarray operators/methods through Python (pprobe._cpython).

For each statement the unpatched and the patched timings are taken in alternation (install,
time, restore, time, ...), each the best of ``--repeat`` runs of ``--number`` calls, so that
drift on a busy machine hits both sides alike.  The patch is a no-op: ``__add__`` (and
friends) only call the saved original slot wrapper; ``sum``/``reshape`` only call the saved
original method descriptor.

    python bench/_slots_micro.py [--number 200000] [--repeat 9]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pprobe import _cpython as cp  # noqa: E402


def noop_operator(name: str) -> Callable[..., Any]:
    orig = np.ndarray.__dict__[name]

    def op(self: Any, other: Any, _orig: Any = orig) -> Any:
        return _orig(self, other)

    return op


def noop_unary(name: str) -> Callable[..., Any]:
    orig = np.ndarray.__dict__[name]

    def op(self: Any, _orig: Any = orig) -> Any:
        return _orig(self)

    return op


def noop_method(name: str) -> Callable[..., Any]:
    orig = np.ndarray.__dict__[name]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return orig(self, *args, **kwargs)

    return method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    ok, why = cp.selftest()
    if not ok:
        raise SystemExit(f"slot patching unavailable: {why}")

    ops = {n: noop_operator(n) for n in ("__add__", "__radd__", "__lt__")}
    ops["__neg__"] = noop_unary("__neg__")
    methods = {n: noop_method(n) for n in ("sum", "reshape")}

    def install() -> None:
        cp.install_operator_slots(np.ndarray, ops)
        for name, func in methods.items():
            cp.set_type_attr(np.ndarray, name, func)

    env = {"a": np.ones(10), "b": np.ones(10)}
    stmts = ["a + b", "1.0 + a", "a < b", "-a", "a.sum()", "a.reshape(2, 5)"]
    timers = {s: timeit.Timer(s, globals=env) for s in stmts}
    best: dict[tuple[str, bool], float] = {}
    for _ in range(args.repeat):
        for patched in (False, True):
            if patched:
                install()
            try:
                for stmt, timer in timers.items():
                    t = timer.timeit(args.number) / args.number * 1e9
                    key = (stmt, patched)
                    best[key] = min(best.get(key, float("inf")), t)
            finally:
                cp.restore_all()

    print(f"numpy {np.__version__}, Python {sys.version.split()[0]}, 10-element float64 arrays")
    print(f"{'statement':<18}{'unpatched ns':>14}{'patched ns':>12}{'extra ns':>10}")
    for stmt in stmts:
        base, patched = best[(stmt, False)], best[(stmt, True)]
        print(f"{stmt:<18}{base:>14.0f}{patched:>12.0f}{patched - base:>+10.0f}")


if __name__ == "__main__":
    main()
