"""How the changed pages of a sensor tick are cut into batch runs, and how a shared cost is split.

A run costs seconds and a page milliseconds, so a run covers many pages; the bounds keep one run's
embedding work (and what a failed run has to redo) to a size that finishes in minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# cl100k_base averages ~4 characters a token on English prose and markdown: enough for a bound.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class WorkItem:
    """The newest queued delivery of a page, and how many runs of it already failed."""

    page_url: str
    delivery_id: int
    attempts: int = 0
    text_chars: int = 0

    @property
    def tokens(self) -> int:
        return -(-self.text_chars // CHARS_PER_TOKEN)


def plan_batches(items: Sequence[WorkItem], max_pages: int, max_tokens: int) -> list[list[WorkItem]]:
    """Consecutive batches in the given order, each at most `max_pages` pages and `max_tokens`
    estimated tokens; a single page over the token bound gets a batch of its own."""
    if max_pages < 1 or max_tokens < 1:
        raise ValueError("batch bounds must be positive")
    batches: list[list[WorkItem]] = []
    current: list[WorkItem] = []
    tokens = 0
    for item in items:
        if current and (len(current) >= max_pages or tokens + item.tokens > max_tokens):
            batches.append(current)
            current, tokens = [], 0
        current.append(item)
        tokens += item.tokens
    if current:
        batches.append(current)
    return batches


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split an integer `total` in proportion to `weights` (largest remainder): the parts sum to
    `total` exactly, so per-page ledger rows add up to what the embedding requests really cost."""
    if total < 0 or any(w < 0 for w in weights):
        raise ValueError("total and weights must not be negative")
    if not weights:
        if total:
            raise ValueError("cannot apportion a non-zero total over no weights")
        return []
    whole = sum(weights)
    if whole == 0:
        weights, whole = [1] * len(weights), len(weights)
    shares = [total * w // whole for w in weights]
    remainders = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in remainders[: total - sum(shares)]:
        shares[i] += 1
    return shares
