from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.ranking import LEXICAL_POWER, best_per_key, fuse_rrf, fuse_scores


@given(st.lists(st.sampled_from("abcdef"), max_size=60), st.integers(1, 4), st.integers(1, 12))
def test_best_per_key_keeps_the_best_in_order_and_never_more_than_asked(keys, per_key, k):
    ranked = list(enumerate(keys))   # (rank, key), best first
    out = best_per_key(ranked, key=lambda item: item[1], per_key=per_key, k=k)
    assert [r for r, _ in out] == sorted(r for r, _ in out)                   # still best first
    assert all(n <= per_key for n in Counter(key for _, key in out).values())
    feasible = sum(min(n, per_key) for n in Counter(keys).values())
    assert len(out) == min(k, feasible)
    # Nothing better was left out unless its key was full: the result is a greedy prefix.
    last = out[-1][0] if out else -1
    for rank, key in ranked[:last + 1]:
        if (rank, key) not in out:
            assert Counter(kk for r, kk in out if r < rank)[key] == per_key


def test_best_per_key_refuses_a_limit_below_one():
    with pytest.raises(ValueError):
        best_per_key([], key=str, per_key=0, k=3)


keys = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=2), unique=True, max_size=12)


@given(keys, keys, st.floats(0.1, 5), st.floats(0.1, 5), st.integers(1, 100))
def test_rrf_sums_each_lists_share_and_ranks_by_it(a, b, wa, wb, k):
    first = [(key, -n) for n, key in enumerate(a)]     # all distinct scores: rank = position
    second = [(key, -n) for n, key in enumerate(b)]
    fused = fuse_rrf([first, second], [wa, wb], k)
    assert {key for key, _ in fused} == set(a) | set(b)
    for key, score in fused:
        expected = (wa / (k + a.index(key) + 1) if key in a else 0) + (wb / (k + b.index(key) + 1) if key in b else 0)
        assert score == pytest.approx(expected)
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    if a and a[0] in b and b[0] == a[0]:
        assert fused[0][0] == a[0]   # first in both lists: first


@given(keys, keys)
def test_a_list_that_ties_everything_leaves_the_other_lists_order(a, b):
    flat = [(key, 0.5) for key in a]                   # cannot tell its items apart
    ordered = [(key, -n) for n, key in enumerate(b)]
    fused = [key for key, _ in fuse_rrf([flat, ordered], [1.0, 1.0])]
    in_both = [key for key in b if key in a]
    assert [key for key in fused if key in in_both] == in_both


def test_rrf_refuses_mismatched_weights():
    with pytest.raises(ValueError):
        fuse_rrf([[("a", 1.0)]], [1.0, 2.0])


def test_score_fusion_keeps_a_wide_lead_that_rank_fusion_loses():
    # "exact": first by words by far, past the vector list's top three; "middling": second in both.
    pool = [("near", 0.80, 2.0), ("middling", 0.79, 4.0), ("exact", 0.70, 20.0), ("far", 0.60, None)]
    fused = fuse_scores(pool, 1.0, 1.0)
    assert [key for key, _ in fused][:2] == ["exact", "near"]
    rrf = fuse_rrf([[("near", 0.8), ("middling", 0.79), ("far", 0.6)], [("exact", 20.0), ("middling", 4.0)]],
                   [1.0, 1.0], 60)
    assert rrf[0][0] == "middling"      # ranks alone: second in both beats first by far in one
    scores = dict(fused)
    assert scores["exact"] == pytest.approx((0.5 + 1.0) / 2)          # sim (0.7-0.6)/(0.8-0.6), words 1
    assert scores["far"] == 0.0 and scores["near"] == pytest.approx((1.0 + (2 / 20) ** LEXICAL_POWER) / 2)


def test_score_fusion_weights_and_edges():
    pool = [("a", 0.9, None), ("b", 0.5, 10.0)]
    assert [k for k, _ in fuse_scores(pool, 1.0, 0.0)] == ["a", "b"]    # meaning alone
    assert [k for k, _ in fuse_scores(pool, 0.0, 1.0)] == ["b", "a"]    # words alone
    assert fuse_scores([("x", 0.5, None), ("y", 0.5, None)], 1.0, 1.0) == [("x", 0.5), ("y", 0.5)]
    assert fuse_scores([], 1.0, 1.0) == []
    with pytest.raises(ValueError):
        fuse_scores(pool, 0.0, 0.0)
    with pytest.raises(ValueError):
        fuse_scores(pool, -1.0, 1.0)
