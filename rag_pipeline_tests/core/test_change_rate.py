"""The change-rate estimator: exact where it can be, consistent, monotone, and steadied by its prior."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.change_rate import Observation, Prior, estimate, estimate_many, pattern_rate

HOUR = 3600.0
rates = st.floats(min_value=1 / (90 * 86400), max_value=10 / HOUR)
intervals = st.floats(min_value=60.0, max_value=30 * 86400.0)
observations = st.lists(st.builds(Observation, intervals, st.booleans()), max_size=40)


@given(prior=rates)
def test_without_observations_the_estimate_is_the_prior(prior):
    assert estimate([], Prior(prior)) == pytest.approx(prior, rel=1e-9)


@given(obs=observations, prior=rates, extra=intervals)
def test_a_change_never_lowers_the_estimate_and_no_change_never_raises_it(obs, prior, extra):
    base = estimate(obs, Prior(prior))
    assert estimate([*obs, Observation(extra, True)], Prior(prior)) >= base * (1 - 1e-9)
    assert estimate([*obs, Observation(extra, False)], Prior(prior)) <= base * (1 + 1e-9)


@given(obs=observations, prior=rates, scale=st.floats(min_value=0.01, max_value=100.0))
def test_the_estimate_has_no_preferred_time_unit(obs, prior, scale):
    scaled = [Observation(o.interval_s * scale, o.changed) for o in obs]
    assert estimate(scaled, Prior(prior / scale)) == pytest.approx(estimate(obs, Prior(prior)) / scale, rel=1e-6)


@given(prior=rates, changed=st.booleans())
def test_one_observation_at_the_expected_interval_moves_the_estimate_less_than_twofold(prior, changed):
    moved = estimate([Observation(1 / prior, changed)], Prior(prior))
    assert prior / 2 < moved < prior * 2


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(min_value=0.05 / HOUR, max_value=5 / HOUR), seed=st.integers(0, 2**32 - 1),
       spread=st.floats(min_value=0.2, max_value=3.0))
def test_irregular_crawls_of_a_poisson_page_recover_its_rate(rate, seed, spread):
    # 4,000 crawls at irregular intervals (log-normal around ~1/rate): a change count over the total
    # time would be biased low here; the estimator is not.
    rng = np.random.default_rng(seed)
    t = np.exp(rng.normal(math.log(1 / rate), spread, 4000))
    changed = rng.random(4000) < -np.expm1(-rate * t)
    found = estimate_many(t[None, :], changed[None, :], np.array([rate * 10]))[0]
    assert found == pytest.approx(rate, rel=0.1)
    naive = changed.sum() / t.sum()
    assert naive < found


def test_a_page_seen_changing_at_every_crawl_has_a_finite_estimate_that_keeps_rising():
    prior = Prior(1 / HOUR)
    estimates = [estimate([Observation(HOUR, True)] * n, prior) for n in (1, 5, 20, 80)]
    assert all(math.isfinite(e) for e in estimates)
    assert estimates == sorted(estimates) and estimates[-1] > 3 / HOUR
    static = [estimate([Observation(HOUR, False)] * n, prior) for n in (1, 5, 20, 80)]
    assert static == sorted(static, reverse=True) and 0 < static[-1] < prior.rate / 20


def test_rows_are_estimated_independently():
    t = np.array([[HOUR, HOUR, 0.0], [HOUR, np.nan, np.nan]])
    c = np.array([[True, False, True], [True, False, False]])
    both = estimate_many(t, c, np.array([1 / HOUR, 1 / HOUR]))
    assert both[0] == pytest.approx(estimate([Observation(HOUR, True), Observation(HOUR, False)], Prior(1 / HOUR)))
    assert both[1] == pytest.approx(estimate([Observation(HOUR, True)], Prior(1 / HOUR)))


def test_a_pattern_prior_is_the_geometric_mean_of_its_pages():
    assert pattern_rate([1 / HOUR, 1 / (100 * HOUR)], 1.0) == pytest.approx(1 / (10 * HOUR))
    assert pattern_rate([], 0.5) == 0.5
    with pytest.raises(ValueError, match="positive"):
        Prior(0.0)
