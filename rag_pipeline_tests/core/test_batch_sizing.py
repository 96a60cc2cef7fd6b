"""Cutting a tick's changed pages into batches, and splitting a shared embedding bill."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.batch_sizing import (
    MIN_SPREAD_PAGES,
    WorkItem,
    _cut,
    _shares,
    apportion,
    plan_batches,
    slices,
)


def items(*chars: int) -> list[WorkItem]:
    return [WorkItem(f"https://a.example.com/{i}", i + 1, 0, c) for i, c in enumerate(chars)]


def test_batches_keep_order_and_respect_both_bounds():
    work = items(400, 400, 400, 400, 400)          # 100 tokens each
    assert [len(b) for b in plan_batches(work, max_pages=2, max_tokens=10_000)] == [2, 2, 1]
    assert [len(b) for b in plan_batches(work, max_pages=10, max_tokens=250)] == [2, 2, 1]
    assert [i.delivery_id for b in plan_batches(work, 2, 10_000) for i in b] == [1, 2, 3, 4, 5]


def test_a_page_over_the_token_bound_gets_a_batch_of_its_own():
    batches = plan_batches(items(40, 40_000, 40), max_pages=10, max_tokens=100)
    assert [[i.delivery_id for i in b] for b in batches] == [[1], [2], [3]]


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        plan_batches(items(1), max_pages=0, max_tokens=1)
    with pytest.raises(ValueError):
        plan_batches(items(1), max_pages=1, max_tokens=1, spread=0)


def test_batches_are_as_few_as_the_bounds_allow_and_balanced_by_tokens():
    # 10 pages of 100 tokens, then 10 of 900: a cut by count would put 1,000 tokens in the first
    # batch and 9,000 in the second; balanced by tokens (to within a page), both runs end together.
    work = items(*([400] * 10 + [3_600] * 10))
    batches = plan_batches(work, max_pages=20, max_tokens=6_000)
    assert len(batches) == 2
    assert [sum(i.tokens for i in b) for b in batches] == [4_600, 5_400]
    assert [i.delivery_id for b in batches for i in b] == list(range(1, 21))


def test_when_the_bounds_force_one_more_batch_all_of_them_share_the_pages():
    # 3.5M tokens in 2,000 pages, the heavier first: the token bound wants 2 batches, the first
    # fills its half of the tokens in 972 pages, the page bound cuts the second at 1,000, and a
    # greedy cut left a run of 28 pages, which costs a run's start for little.
    work = items(*([7_200] * 1_000 + [6_800] * 1_000))
    batches = plan_batches(work, max_pages=1_000, max_tokens=2_000_000, spread=2)
    assert len(batches) == 3
    sums = [sum(i.tokens for i in b) for b in batches]
    assert max(sums) - min(sums) <= 1_800 and min(len(b) for b in batches) > 600


def test_spread_gives_each_core_a_run_only_when_each_run_is_worth_its_start():
    many = items(*([400] * (2 * MIN_SPREAD_PAGES)))
    assert [len(b) for b in plan_batches(many, 10_000, 10**9, spread=2)] == [MIN_SPREAD_PAGES] * 2
    assert len(plan_batches(many, 10_000, 10**9, spread=1)) == 1
    few = items(*([400] * (2 * MIN_SPREAD_PAGES - 1)))
    assert len(plan_batches(few, 10_000, 10**9, spread=2)) == 1


@given(st.lists(st.integers(0, 40_000), min_size=1, max_size=300), st.integers(1, 50),
       st.integers(1_000, 50_000), st.integers(1, 4))
def test_batches_keep_every_page_once_in_order_within_the_bounds(chars, max_pages, max_tokens, spread):
    work = items(*chars)
    batches = plan_batches(work, max_pages, max_tokens, spread)
    assert [i.delivery_id for b in batches for i in b] == [i.delivery_id for i in work]
    assert all(b for b in batches)
    for b in batches:
        assert len(b) <= max_pages
        assert len(b) == 1 or sum(i.tokens for i in b) <= max_tokens


@pytest.mark.parametrize("seed", range(20))
def test_sharing_again_never_makes_more_runs_than_the_first_cut(seed):
    # A tick's worth of pages at the default bounds, one in twenty heavier than the token bound
    # (each a batch of its own): smaller shares could cut more batches than the first cut made.
    rng = random.Random(seed)
    work = items(*(rng.randint(400_000, 8_000_000) if rng.random() < 0.05 else rng.randint(1_200, 20_000)
                   for _ in range(rng.randint(50, 3_000))))
    total = sum(i.tokens for i in work)
    first = _cut(work, 1_000, 2_000_000, _shares(len(work), total, 1_000, 2_000_000, 2), total)
    batches = plan_batches(work, 1_000, 2_000_000, spread=2)
    assert len(batches) <= len(first)
    assert [i.delivery_id for b in batches for i in b] == [i.delivery_id for i in work]


@given(st.integers(0, 10_000), st.lists(st.integers(0, 5_000), min_size=1, max_size=40))
def test_apportion_sums_exactly_and_follows_the_weights(total, weights):
    shares = apportion(total, weights)
    assert sum(shares) == total and len(shares) == len(weights)
    whole = sum(weights) or len(weights)
    for share, weight in zip(shares, weights):
        exact = total * (weight if sum(weights) else 1) / whole
        assert abs(share - exact) < 1


def test_apportion_examples():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(1, [3, 1]) == [1, 0]
    assert apportion(0, [5, 5]) == [0, 0]
    with pytest.raises(ValueError):
        apportion(1, [])


def test_slices_keep_order_and_cut_at_either_bound():
    tokens = lambda item: item.tokens   # noqa: E731
    work = items(400, 400, 400, 400, 400)          # 100 tokens each
    assert [[i.delivery_id for i in s] for s in slices(work, tokens, 250, 10)] == [[1, 2], [3, 4], [5]]
    assert [len(s) for s in slices(work, tokens, 10_000, 3)] == [3, 2]
    assert [len(s) for s in slices(work, tokens, 10_000, 10)] == [5]
    assert slices([], tokens) == []


def test_a_page_over_the_slice_bound_is_a_slice_of_its_own():
    work = items(40, 40_000, 40, 40)
    assert [[i.delivery_id for i in s] for s in slices(work, lambda i: i.tokens, 100, 10)] == [[1], [2], [3, 4]]
    with pytest.raises(ValueError):
        slices(work, lambda i: i.tokens, 0, 10)
