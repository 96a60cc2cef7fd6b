"""Ranked results shaped for citing: at most N passages of one page, best first."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def best_per_key(ranked: Iterable[T], key: Callable[[T], str], per_key: int, k: int) -> list[T]:
    """The first ``k`` of ``ranked`` (best first) keeping at most ``per_key`` of each key: ten
    results are ten sources unless more passages of a page are asked for."""
    if per_key < 1 or k < 1:
        raise ValueError("per_key and k must be at least 1")
    taken: dict[str, int] = {}
    out: list[T] = []
    for item in ranked:
        name = key(item)
        if taken.get(name, 0) >= per_key:
            continue
        taken[name] = taken.get(name, 0) + 1
        out.append(item)
        if len(out) == k:
            break
    return out


def fuse_rrf(rankings: Sequence[Sequence[tuple[str, float]]], weights: Sequence[float],
             k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of rankings of (key, score), each best first: a key scores
    sum(weight / (k + rank)) over the rankings it is in, best first. Equal scores share a rank
    (that of the first of them), so a list that cannot tell its items apart moves none ahead of
    the others. Ranks, not the lists' own scores, so a cosine distance and a text rank need no
    common scale. Ties of fused score keep the order of first appearance, list by list."""
    if len(rankings) != len(weights):
        raise ValueError("one weight a ranking")
    if k < 1:
        raise ValueError("k must be at least 1")
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights):
        rank, previous = 0, None
        for position, (key, score) in enumerate(ranking, 1):
            if score != previous:
                rank, previous = position, score
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    order = {key: n for n, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))


#: The lexical share is (score / best score) ** LEXICAL_POWER: a passage that holds the question's
#: rare words (an error code, an option name) stands out from those that hold its common ones.
LEXICAL_POWER = 2.0


def fuse_scores(candidates: Sequence[tuple[str, float | None, float | None]], vector_weight: float,
                lexical_weight: float) -> list[tuple[str, float]]:
    """Score fusion over one pool of (key, cosine similarity or None, lexical score or None): each
    list's score brought to 0..1 within the pool (similarity min-max, as cosines crowd together;
    lexical by its best, raised to LEXICAL_POWER), then weighted, best first (ties by key).

    Unlike rank fusion, a passage first in one list by a wide margin keeps that margin: with ranks
    alone, one in the middle of both lists (2/80) beat one ranked first by words alone (1/61),
    and the same middling passage was shown for many different questions."""
    total = vector_weight + lexical_weight
    if vector_weight < 0 or lexical_weight < 0 or total <= 0:
        raise ValueError("weights must be non-negative, and one of them positive")
    sims = [s for _, s, _ in candidates if s is not None]
    low, high = (min(sims), max(sims)) if sims else (0.0, 0.0)
    best = max((t for _, _, t in candidates if t is not None and t > 0), default=0.0)
    fused = []
    for key, sim, text in candidates:
        v = (sim - low) / (high - low) if sim is not None and high > low else (1.0 if sim is not None else 0.0)
        t = (max(text, 0.0) / best) ** LEXICAL_POWER if text is not None and best > 0 else 0.0
        fused.append((key, (vector_weight * v + lexical_weight * t) / total))
    return sorted(fused, key=lambda item: (-item[1], item[0]))
