from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.ranking import best_per_key


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
