"""How the changed pages of a sensor tick are cut into batch runs, and how a shared cost is split.

A run costs seconds and a page milliseconds, so a run covers many pages; the bounds keep one run's
embedding work (and what a failed run has to redo) to a size that finishes in minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

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


# A run of fewer pages costs more to start (seconds) than spreading it over the cores saves.
MIN_SPREAD_PAGES = 100


def plan_batches(items: Sequence[WorkItem], max_pages: int, max_tokens: int,
                 spread: int = 1) -> list[list[WorkItem]]:
    """Consecutive batches in the given order: as few as the bounds allow (at most `max_pages`
    pages and `max_tokens` estimated tokens each), but at least `spread` when each still gets
    MIN_SPREAD_PAGES pages, so that runs at once share the cores; balanced by estimated tokens,
    so that they also end together. A single page over the token bound gets a batch of its own."""
    if max_pages < 1 or max_tokens < 1 or spread < 1:
        raise ValueError("batch bounds must be positive")
    if not items:
        return []
    total = sum(i.tokens for i in items)
    wanted = _shares(len(items), total, max_pages, max_tokens, spread)
    batches = _cut(items, max_pages, max_tokens, wanted, total)
    if len(batches) > wanted:
        # The bounds cut more batches than shares, and the last one got what was left (pages
        # heavier than average first: 972, 1,000 and 28): share again among that many, unless
        # the smaller shares cut still more batches.
        again = _cut(items, max_pages, max_tokens, len(batches), total)
        if len(again) <= len(batches):
            return again
    return batches


def _shares(pages: int, tokens: int, max_pages: int, max_tokens: int, spread: int) -> int:
    """How many batches the bounds need, and the spread asks for."""
    return max(-(-pages // max_pages), -(-tokens // max_tokens), min(spread, pages // MIN_SPREAD_PAGES), 1)


def _cut(items: Sequence[WorkItem], max_pages: int, max_tokens: int, wanted: int, total: int) -> list[list[WorkItem]]:
    # The share of each batch; pages without text (tombstones, estimates of 0) count one token.
    share = max(total, len(items)) / wanted
    batches: list[list[WorkItem]] = []
    current: list[WorkItem] = []
    tokens = 0
    for item in items:
        full = len(current) >= max_pages or tokens + item.tokens > max_tokens
        fair = len(batches) < wanted - 1 and tokens + max(item.tokens, 1) / 2 > share
        if current and (full or fair):
            batches.append(current)
            current, tokens = [], 0
        current.append(item)
        tokens += max(item.tokens, 1)
    batches.append(current)
    return batches


# A slice of a batch is staged while the slice before it is being embedded. About one full
# embedding request of text (OpenAI takes 300,000 tokens a request; the embed texts run ~20% over
# the pages' own, with their breadcrumbs and overlaps): smaller slices overlap sooner but cut
# more, partly filled requests.
SLICE_TOKENS = 240_000
SLICE_PAGES = 400


def slices(items: Sequence[T], tokens_of: Callable[[T], int], max_tokens: int = SLICE_TOKENS,
           max_pages: int = SLICE_PAGES) -> list[list[T]]:
    """Consecutive slices of at most `max_pages` items and `max_tokens` estimated tokens; a slice
    always takes its first item, however large."""
    if max_tokens < 1 or max_pages < 1:
        raise ValueError("slice bounds must be positive")
    out: list[list[T]] = []
    tokens = 0
    for item in items:
        n = tokens_of(item)
        if not out or len(out[-1]) >= max_pages or tokens + n > max_tokens:
            out.append([])
            tokens = 0
        out[-1].append(item)
        tokens += n
    return out


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
