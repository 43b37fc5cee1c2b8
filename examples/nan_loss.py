"""A training loop whose loss turns NaN: find the op where it was born with pprobe.

    PYTHONPATH=bootstrap PPROBE_MODE=stats python examples/nan_loss.py
    pprobe nan          # exit status 1: an origin was found

A buggy warm-up multiplies the learning rate every step instead of ramping it to a ceiling,
so the weights, and the gaps between the logits, grow every step. Nothing overflows: at
step 17 the largest logit is ~344, far below the ~709 where np.exp reaches inf. What
happens is an underflow:

1. softmax's division ``e / sum(e)`` rounds to exactly 0.0 the probability of a class whose
   logit lies more than ~745 below the best one's (e**-745 is under the smallest float64,
   5e-324): the logits of step 17 span -414 to 344;
2. ``np.log(p)`` turns those zeros into -inf (``pprobe nan`` names it: the origin);
3. ``onehot * np.log(p)`` computes 0 * -inf = NaN for the classes that are not the label
   (``pprobe nan --no-inf``, which counts NaN only, names this multiply), and the sum and
   the mean carry the NaN into the loss.

The fix is a log-softmax (``z - z.max() - log(sum(exp(z - z.max())))``), which never takes
the log of an underflowed probability, and a learning-rate ceiling.
"""

import numpy as np

try:
    import pprobe

    step = pprobe.step
except ImportError:  # pragma: no cover

    def step(n=None):
        return n


def softmax(z):
    e = np.exp(z)
    # Probabilities far below the largest one underflow to exactly 0.0 here ...
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
            # ... np.log(0) = -inf, then onehot's 0 * -inf = NaN: the loss is NaN.
            loss = -np.mean(np.sum(onehot * np.log(p), axis=1))
            grad = x.T @ (p - onehot) / len(x)
        w = w - lr * grad
        print(f"step {i:2d}  loss {loss:.4f}")
        if np.isnan(loss):
            print(f"loss is NaN at step {i}")
            break


if __name__ == "__main__":
    main()
