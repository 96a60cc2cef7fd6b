"""A thread-safe token bucket: at most `rate` acquisitions per second, bursts of `burst`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float, burst: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = max(1, burst if burst is not None else int(rate) or 1)
        self._clock, self._sleep = clock, sleep
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def try_acquire(self) -> float:
        """Take a token if one is free (0.0); else how long until one is, taking nothing."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            # A hair under one after sleeping the exact pause (float rounding) counts as one.
            if self._tokens >= 1 - 1e-9:
                self._tokens = max(0.0, self._tokens - 1)
                return 0.0
            return (1 - self._tokens) / self.rate

    def acquire(self) -> float:
        """Block until a token is free; returns the time waited."""
        waited = 0.0
        while (pause := self.try_acquire()) > 0:
            self._sleep(pause)
            waited += pause
        return waited
