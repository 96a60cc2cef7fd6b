"""The one retry policy every outbound client uses."""

import random

from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.retrying import Backoff, is_retryable_status


@given(attempt=st.integers(0, 30), seed=st.integers(0, 2**32 - 1))
def test_full_jitter_stays_within_the_exponential_bound_and_the_cap(attempt, seed):
    policy = Backoff(base_s=0.5, cap_s=30.0)
    delay = policy.delay(attempt, rng=random.Random(seed))
    assert 0.0 <= delay <= min(30.0, 0.5 * 2 ** attempt)


def test_the_servers_retry_after_wins_but_is_capped():
    policy = Backoff(base_s=0.5, cap_s=30.0, retry_after_cap_s=60.0)
    assert policy.delay(0, retry_after=7.0) == 7.0
    assert policy.delay(5, retry_after=3600.0) == 60.0
    # Jittered: a thousand clients failing together spread out.
    rng = random.Random(1)
    assert len({round(policy.delay(3, rng=rng), 6) for _ in range(100)}) > 90


def test_the_statuses_worth_another_try():
    assert [s for s in (0, 200, 400, 401, 404, 408, 409, 413, 429, 500, 502, 503) if is_retryable_status(s)] == \
        [0, 408, 409, 429, 500, 502, 503]
