"""How much each word of a question counts in lexical search: the rarer among the passages, the
more (inverse document frequency). PostgreSQL's own ranks count every matched word alike, so a
question's common words ("system", "check") drown the one that names the answer ("admin.E302")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: A word in more than this share of passages finds candidates only when the question has no rarer one.
COMMON_SHARE = 0.1
#: What a word the statistics do not list as common is taken to be in, at most.
UNLISTED_SHARE = 0.001
#: Words of one question that select candidates, the rarest first: each is ORed into the scan, so
#: a pasted page of 280 rare words made a 29 s scan; the rarest few name the answer anyway.
MAX_TERMS = 24


def term_weights(lexemes: Sequence[str], shares: Mapping[str, float], unlisted: float) -> dict[str, float]:
    """lexeme → ln(1 / share of passages holding it); ``shares`` are the common lexemes'
    (PostgreSQL's most_common_elem_freqs), ``unlisted`` the share assumed for any other."""
    floor = min(unlisted, UNLISTED_SHARE) if unlisted > 0 else UNLISTED_SHARE
    return {lexeme: math.log(1.0 / min(1.0, max(shares.get(lexeme, floor), 1e-9))) for lexeme in dict.fromkeys(lexemes)}


def candidate_terms(weights: Mapping[str, float], shares: Mapping[str, float],
                    limit: int = MAX_TERMS) -> list[str]:
    """The words that select candidates: all but the common ones, unless only common ones remain;
    at most `limit`, the rarest (heaviest) first, in the question's order."""
    rare = [lexeme for lexeme in weights if shares.get(lexeme, 0.0) <= COMMON_SHARE] or list(weights)
    if len(rare) <= limit:
        return rare
    kept = set(sorted(rare, key=lambda lexeme: (-weights[lexeme], lexeme))[:limit])
    return [lexeme for lexeme in rare if lexeme in kept]


def tsquery_term(lexeme: str) -> str:
    """One lexeme as tsquery text, as it stands (already normalized): quoted, quotes and
    backslashes escaped."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def any_of(lexemes: Sequence[str]) -> str:
    return " | ".join(tsquery_term(lexeme) for lexeme in lexemes)
