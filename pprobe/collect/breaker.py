"""The circuit breaker and the retry backoff of the collector client.

A breaker stops a client from hammering a collector that is down: after ``failures``
consecutive failed sends it *opens* (no tries; batches spool), after ``reset_s`` it lets one
trial through (*half-open*): a success closes it, a failure opens it again. The clock is a
parameter so that tests can drive it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class Breaker:
    def __init__(
        self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = max(1, failures)
        self.reset_s = reset_s
        self.clock = clock
        self.state = CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.opened = 0  # how many times it opened (meta.json)

    def allow(self) -> bool:
        """Whether a send may be tried now (an open breaker past ``reset_s`` turns half-open)."""
        if self.state == OPEN and self.clock() - self.opened_at >= self.reset_s:
            self.state = HALF_OPEN
        return self.state != OPEN

    def success(self) -> None:
        self.state = CLOSED
        self.failures = 0

    def failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or self.failures >= self.threshold:
            if self.state != OPEN:
                self.opened += 1
            self.state = OPEN
            self.opened_at = self.clock()

    def wait_s(self) -> float:
        """Seconds until an open breaker turns half-open (0 when not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.reset_s - self.clock())


def backoff(attempt: int, base: float = 0.05, cap: float = 2.0, rng: random.Random | None = None
            ) -> float:  # fmt: skip
    """Seconds to wait before try ``attempt + 1``: exponential with full jitter (AWS
    architecture blog, "Exponential Backoff And Jitter"): uniform in [0, min(cap, base*2^n)]."""
    r = rng or random
    return r.uniform(0.0, min(cap, base * (2**attempt)))
