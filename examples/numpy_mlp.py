"""A two-layer MLP trained with plain NumPy: forward, manual backward, SGD.

Run it under the probe:  PYTHONPATH=bootstrap python examples/numpy_mlp.py
Every op it runs (np.* calls, ufuncs, operators and array methods) becomes a row of the log.
"""

import numpy as np

try:  # mark training steps in the log when pprobe is importable; the script runs without it
    import pprobe

    step = pprobe.step
except ImportError:  # pragma: no cover

    def step(n=None):
        return n


def main(steps: int = 30, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 20))
    true_w = rng.standard_normal((20, 1))
    y = (np.tanh(np.matmul(x, true_w)) > 0).astype(np.float64)

    w1 = rng.standard_normal((20, 32)) * 0.1
    b1 = np.zeros(32)
    w2 = rng.standard_normal((32, 1)) * 0.1
    b2 = np.zeros(1)
    lr = 0.5
    loss = float("nan")
    for i in range(steps):
        step(i)
        h = np.maximum(np.add(np.matmul(x, w1), b1), 0.0)  # ReLU
        logits = np.add(np.matmul(h, w2), b2)
        p = np.divide(1.0, np.add(1.0, np.exp(np.negative(logits))))  # sigmoid
        eps = 1e-9
        loss = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))

        # backward
        g_logits = (p - y) / len(x)
        g_w2 = np.matmul(h.T, g_logits)
        g_b2 = np.sum(g_logits, axis=0)
        g_h = np.matmul(g_logits, w2.T)
        g_h = np.where(h > 0, g_h, 0.0)
        g_w1 = np.matmul(x.T, g_h)
        g_b1 = np.sum(g_h, axis=0)

        for param, grad in ((w1, g_w1), (b1, g_b1), (w2, g_w2), (b2, g_b2)):
            np.subtract(param, lr * grad, out=param)
        report(i, float(loss))
    return float(loss)


def report(i: int, loss: float) -> None:
    """Called once a step with the loss (examples/ext_demo.py hooks it)."""
    if i % 10 == 0:
        print(f"step {i:3d}  loss {loss:.4f}")


if __name__ == "__main__":
    main()
