"""How fast batches apply pages, measured on the newest batches, and what a plan's work will
take at that pace. Pure.

Batches run side by side (BATCH_SPREAD, the pool's limit), so the pace is the pages they switched
over the time at least one of them was running (the union of their spans), not the sum of each
run's own rate. A plan's time is bounded by both of its figures: its pages at the pages' pace and
its tokens at the tokens' pace, whichever takes longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Rates", "measure", "estimate_s"]

# Fewer pages than this measured say nothing about a pace: no estimate is given.
MIN_PAGES_MEASURED = 20


@dataclass(frozen=True)
class Rates:
    pages_per_s: float
    tokens_per_s: float     # 0 when the batches measured embedded nothing
    batches: int


def busy_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """The time covered by at least one of these (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def measure(batches: Sequence[tuple[float, float, int, int]]) -> Rates | None:
    """(started, ended, pages, tokens embedded) a batch → the pace, or None with too little measured."""
    pages = sum(b[2] for b in batches)
    busy = busy_seconds([(b[0], b[1]) for b in batches if b[1] >= b[0]])
    if pages < MIN_PAGES_MEASURED or busy <= 0:
        return None
    return Rates(pages / busy, sum(b[3] for b in batches) / busy, len(batches))


def estimate_s(rates: Rates | None, pages: int, tokens: int) -> float | None:
    if rates is None:
        return None
    by_pages = pages / rates.pages_per_s
    by_tokens = tokens / rates.tokens_per_s if rates.tokens_per_s > 0 else 0.0
    return max(by_pages, by_tokens)
