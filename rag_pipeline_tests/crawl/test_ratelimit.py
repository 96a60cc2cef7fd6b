"""The push rate limit, on an injected clock: exact, and instant to test."""

import pytest

from rag_pipeline.crawl.ratelimit import RateLimiter


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_then_the_rate():
    clock = FakeClock()
    limiter = RateLimiter(40, clock=clock, sleep=clock.sleep)
    waits = [limiter.acquire() for _ in range(60)]
    assert waits[:40] == [0.0] * 40                       # the burst of 40 goes at once
    assert sum(waits) == pytest.approx(20 / 40)           # 20 more at 40/s: half a second
    assert clock.now - 1000.0 == pytest.approx(0.5)


def test_idle_time_refills_the_bucket_up_to_its_burst():
    clock = FakeClock()
    limiter = RateLimiter(10, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        assert limiter.acquire() == 0.0
    clock.now += 60                                       # a minute idle refills 5, not 600
    assert [limiter.acquire() for _ in range(6)][:5] == [0.0] * 5
    assert clock.slept and clock.slept[-1] == pytest.approx(0.1)


def test_a_rate_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        RateLimiter(0)
