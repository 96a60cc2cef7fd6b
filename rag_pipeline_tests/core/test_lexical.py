import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.lexical import (COMMON_SHARE, UNLISTED_SHARE, any_of, candidate_terms, term_weights,
                                       tsquery_term)

words = st.lists(st.text(alphabet="abcde'\\.", min_size=1, max_size=6), min_size=1, max_size=8)


@given(words, st.dictionaries(st.text(alphabet="abcde", min_size=1, max_size=3), st.floats(0.0001, 1.0)))
def test_a_rarer_word_never_weighs_less(lexemes, shares):
    weights = term_weights(lexemes, shares, unlisted=0.0005)
    assert list(weights) == list(dict.fromkeys(lexemes))          # each word once, in order
    for a in weights:
        for b in weights:
            share_a, share_b = shares.get(a, 0.0005), shares.get(b, 0.0005)
            if share_a < share_b:
                assert weights[a] >= weights[b]
    assert all(w >= 0 for w in weights.values())


def test_the_word_that_names_the_answer_outweighs_the_common_ones():
    shares = {"system": 0.06, "check": 0.09, "report": 0.02}
    weights = term_weights(["system", "check", "admin.e302", "report"], shares, unlisted=0.004)
    assert weights["admin.e302"] == pytest.approx(math.log(1 / UNLISTED_SHARE))
    assert weights["admin.e302"] > weights["system"] + weights["check"]
    # Candidates come from the rare words; a question of common words only keeps them all.
    assert "admin.e302" in candidate_terms(weights, shares)
    common = {"django": 0.5, "model": 0.3}
    assert candidate_terms(term_weights(["django", "model"], common, 0.01), common) == ["django", "model"]
    assert all(shares.get(w, 0) <= COMMON_SHARE for w in candidate_terms(weights, shares))


def test_terms_are_quoted_as_tsquery_text():
    assert tsquery_term("o'neil") == "'o''neil'"
    assert tsquery_term("a\\b") == "'a\\\\b'"
    assert any_of(["x", "5.2.3"]) == "'x' | '5.2.3'"


def test_a_question_of_hundreds_of_rare_words_selects_only_the_rarest_few():
    from rag_pipeline.core.lexical import MAX_TERMS, candidate_terms

    words = [f"w{i:03d}" for i in range(280)]
    shares = {w: 0.00001 * (i + 1) for i, w in enumerate(words)}      # w000 the rarest
    weights = term_weights(words, shares, unlisted=0.0)
    chosen = candidate_terms(weights, shares)
    assert len(chosen) == MAX_TERMS
    assert chosen == words[:MAX_TERMS]                                  # the rarest, in question order
