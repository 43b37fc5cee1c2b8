"""A small NumPy classifier whose precision is a setting: the program `pprobe compare` is
shown on (run_examples.sh, README "Compare two runs").

    PYTHONPATH=bootstrap PRECISION=float64 python examples/precision_mlp.py   # the reference
    PYTHONPATH=bootstrap PRECISION=float32 python examples/precision_mlp.py
    pprobe compare <first run id> latest

Its softmax is the naive one (exp of the raw logits, sharpened by a temperature): float64
holds exp(300), float32 overflows to inf above exp(88.7), and inf / inf is NaN. The compare
names the op where float32 first left float32's tolerance. ``STABLE=1`` subtracts the row
maximum first (three more ops per step), and both precisions then agree.
"""

import os

import numpy as np

try:  # mark training steps when pprobe is importable; the script runs without it
    import pprobe

    step = pprobe.step
except ImportError:  # pragma: no cover

    def step(n=None):
        return n


def softmax(z: np.ndarray) -> np.ndarray:
    if os.environ.get("STABLE"):
        z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def main(steps: int = 3) -> float:
    dt = np.dtype(os.environ.get("PRECISION", "float64"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 64)).astype(dt)
    w1 = (rng.standard_normal((64, 256)) * 0.1).astype(dt)
    w2 = (rng.standard_normal((256, 10)) * 0.1).astype(dt)
    loss = 0.0
    for i in range(steps):
        step(i)
        h = np.tanh(x @ w1)
        p = softmax((h @ w2) * 100.0)  # temperature 0.01
        loss = float(-np.log(p[:, 0] + 1e-12).mean())
        w2 = w2 - 0.1 * (h.T @ (p - 0.1)) / len(x)
    print(f"loss {loss:.6f} ({dt})")
    return loss


if __name__ == "__main__":
    main()
