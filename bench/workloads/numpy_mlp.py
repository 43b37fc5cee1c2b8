"""Workload 4a: a 128-256-256-10 MLP in pure NumPy with a hand-written backward pass.

Written the way NumPy code usually is: namespace functions (np.dot, np.maximum, np.exp, ...)
mixed with operators and methods, so the rows per step show what the probe's coverage sees.
"""

from __future__ import annotations

import _child  # noqa: F401  (first: it meters pprobe's writer from its first flush)
import numpy as np
from _child import ARGS, Span, emit

steps, warmup = int(ARGS.get("steps", 200)), int(ARGS.get("warmup", 5))
rng = np.random.default_rng(0)
sizes = (128, 256, 256, 10)
W = [
    (rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32)
    for i, o in zip(sizes, sizes[1:])
]
B = [np.zeros(o, dtype=np.float32) for o in sizes[1:]]
data = [
    (rng.standard_normal((64, 128)).astype(np.float32), rng.integers(0, 10, 64)) for _ in range(8)
]
LR = np.float32(0.01)


def step(i: int) -> float:
    x, y = data[i % len(data)]
    # forward
    acts = [x]
    for k in range(len(W)):
        z = np.add(np.dot(acts[-1], W[k]), B[k])
        acts.append(np.maximum(z, 0) if k < len(W) - 1 else z)
    logits = acts[-1]
    shifted = logits - np.max(logits, axis=1, keepdims=True)
    e = np.exp(shifted)
    probs = e / np.sum(e, axis=1, keepdims=True)
    n = x.shape[0]
    loss = -np.mean(np.log(probs[np.arange(n), y] + 1e-9))
    # backward
    g = probs.copy()
    g[np.arange(n), y] -= 1
    g /= n
    for k in reversed(range(len(W))):
        gw = np.dot(acts[k].T, g)
        gb = np.sum(g, axis=0)
        if k:
            g = np.dot(g, W[k].T)
            g = np.where(acts[k] > 0, g, 0).astype(np.float32)
        np.subtract(W[k], LR * gw, out=W[k])
        np.subtract(B[k], LR * gb, out=B[k])
    return float(loss)


def main() -> None:
    for i in range(warmup):
        step(i)
    with Span() as loop:
        for i in range(steps):
            step(i)
    out = {"steps": steps, "units": warmup + steps + 1, "final_loss": step(steps)}
    loop.put(out, "loop_s")
    emit(out)


main()
