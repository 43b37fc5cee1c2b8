"""A training loop whose loss turns NaN: find the first bad op with pprobe.

    PYTHONPATH=bootstrap PPROBE_MODE=stats python examples/nan_loss.py
    pprobe query "SELECT o.step, o.seq, o.op, o.caller, t.role, t.idx, t.nan_count, t.inf_count
                  FROM ops o JOIN tensors t USING (pid, seq)
                  WHERE t.nan_count > 0 OR t.inf_count > 0 ORDER BY o.seq LIMIT 5"

A buggy warm-up multiplies the learning rate every step instead of ramping it to a ceiling:
the weights grow until np.exp overflows to inf, and inf / inf gives NaN in the softmax.
"""

import numpy as np

try:
    import pprobe

    step = pprobe.step
except ImportError:  # pragma: no cover

    def step(n=None):
        return n


def softmax(z):
    e = np.exp(z)  # no max-subtraction: overflows once logits exceed ~709
    return e / np.sum(e, axis=1, keepdims=True)


def main(steps: int = 40) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 8))
    labels = rng.integers(0, 3, size=64)
    onehot = np.eye(3)[labels]
    w = rng.standard_normal((8, 3))
    lr = 0.5
    for i in range(steps):
        lr = lr * 1.5  # the bug: should be min(lr * 1.5, 2.0)
        step(i)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            p = softmax(x @ w)
            loss = -np.mean(np.sum(onehot * np.log(p), axis=1))
            grad = x.T @ (p - onehot) / len(x)
        w = w - lr * grad
        print(f"step {i:2d}  loss {loss:.4f}")
        if np.isnan(loss):
            print(f"loss is NaN at step {i}")
            break


if __name__ == "__main__":
    main()
