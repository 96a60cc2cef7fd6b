"""The budget allocation: spends the budget, respects the bounds, and beats any fixed split."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.recrawl_policy import DAY_S, allocate, implied_budget, intervals_at_price, staleness

H = 3600.0


def mean_staleness(rates, intervals):
    return float(np.mean([staleness(r, i) for r, i in zip(rates, intervals)]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=5 / H), min_size=2, max_size=30),
       st.floats(min_value=0.05, max_value=1.0))
def test_the_budget_is_spent_within_the_bounds_and_beats_the_uniform_split(rates, share):
    floors, ceilings = np.full(len(rates), 600.0), np.full(len(rates), 30 * DAY_S)
    budget = share * implied_budget(np.full(len(rates), 6 * H), 1.0)      # pushes/day
    plan = allocate(rates, floors, ceilings, budget)
    assert np.all(plan.intervals_s >= floors - 1e-6) and np.all(plan.intervals_s <= ceilings + 1e-6)
    # Never over the budget; under it only where a page too fast to keep fresh dropped to its
    # ceiling (the optimum jumps there) or when no page changes enough to use it (said).
    assert plan.pushes_per_day() <= budget * (1 + 1e-6)
    if not plan.note:
        uniform = np.clip(np.full(len(rates), len(rates) * DAY_S / budget), floors, ceilings)
        # Up to the bisection's precision: near a page's jump to its ceiling spending is steep, and
        # the allocation may leave ~0.1% of the budget unspent.
        assert mean_staleness(rates, plan.intervals_s) <= mean_staleness(rates, uniform) * (1 + 1e-3) + 1e-9


def test_a_page_that_never_changes_gets_its_ceiling_and_a_busy_one_more_pushes():
    rates = [0.0, 1 / DAY_S, 1 / H]
    plan = allocate(rates, [H] * 3, [30 * DAY_S] * 3, pushes_per_day=12)
    never, daily, hourly = plan.intervals_s
    assert never == 30 * DAY_S and hourly < daily < never


def test_a_budget_the_bounds_cannot_meet_is_said():
    low = allocate([1 / H, 1 / H], [H, H], [DAY_S, DAY_S], pushes_per_day=1)
    assert list(low.intervals_s) == [DAY_S, DAY_S] and "below what the rules' ceilings need" in low.note
    high = allocate([1 / H, 1 / H], [H, H], [DAY_S, DAY_S], pushes_per_day=1000)
    assert list(high.intervals_s) == [H, H] and "buys every page its floor" in high.note


def test_a_page_too_fast_to_keep_fresh_is_left_at_its_ceiling():
    rates = np.array([1 / DAY_S, 60 / H])           # the second changes every minute
    plan = allocate(rates, [600.0, 600.0], [7 * DAY_S, 7 * DAY_S], pushes_per_day=2)
    assert plan.intervals_s[1] == pytest.approx(7 * DAY_S, rel=1e-3)
    assert intervals_at_price(rates, [600.0] * 2, [7 * DAY_S] * 2, plan.price)[0] == pytest.approx(
        plan.intervals_s[0])


def test_staleness_follows_the_closed_form():
    assert staleness(0.0, H) == 0.0
    assert staleness(1 / H, H) == pytest.approx(1 - (1 - np.exp(-1)), rel=1e-9)
