"""When a space's HNSW index should make way for a bulk load, and when it comes back. Pure.

Inserting into a table with an HNSW index costs 3-8 ms a row at 10k-100k rows (384 dims, 2 cores);
without it ~0.04 ms, and building the index afterwards (~0.5 ms a row) over every row costs less
than inserting a backlog of ~0.3x the rows indexed through it
(pgvector's own advice for bulk loads). So the index is dropped while the rows waiting to be
written outnumber what a rebuild would cost (`defer`), and built again, concurrently, once the
backlog has drained (`rebuild`). The GIN index of lexical search follows the same rule: kept up
row by row it costs ~2.3x its build afterwards. A trickle of recrawls is far below the threshold:
the indexes stay. Figures: bench/hnsw_threshold.py, bench/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["IndexPolicy", "CHARS_PER_VECTOR", "backlog_rows", "chars_per_vector", "rechunk_backlog"]

# A queued page's text becomes about one vector per this many characters (chunks of ~400 tokens
# of ~4 characters, plus their overlap) before anything is indexed: the backlog is estimated from
# the queued text's size. Once pages are indexed, their own ratio is used (``chars_per_vector``):
# the offline model's chunks of 160 tokens are ~4 times as many per character.
CHARS_PER_VECTOR = 1_600
# Indexed chunks a measured ratio needs before it replaces the default.
MIN_MEASURED_CHUNKS = 50


@dataclass(frozen=True)
class IndexPolicy:
    ratio: float        # defer when the backlog is at least this share of the rows already indexed,
    floor: int          # and at least this many rows

    def defer(self, indexed_rows: int, backlog_rows: int) -> bool:
        return backlog_rows >= max(self.floor, self.ratio * indexed_rows)

    def rebuild(self, backlog_rows: int) -> bool:
        """Build again once what is left to write is a trickle (half the floor: no flapping
        between a drop and a build around one threshold)."""
        return backlog_rows < self.floor / 2


def chars_per_vector(source_chars: int, chunks: int) -> int:
    """Source characters per vector, as measured on indexed pages (their stored text, their live
    chunks); the default until enough is indexed to measure."""
    if chunks < MIN_MEASURED_CHUNKS or source_chars <= 0:
        return CHARS_PER_VECTOR
    return max(1, source_chars // chunks)


def backlog_rows(queued_chars: int, per_vector: int = CHARS_PER_VECTOR) -> int:
    return queued_chars // per_vector


def rechunk_backlog(planned_pages: int, rows_written: int, outdated_pages: int) -> int:
    """The vector rows a re-chunk under way has left to write: its plan's rows, in the share of
    its pages still cut otherwise. A re-chunk that rewrites few rows (an index keeps its text)
    stays below the policy's threshold however many pages it re-cuts."""
    if planned_pages <= 0 or outdated_pages <= 0:
        return 0
    return round(rows_written * min(outdated_pages, planned_pages) / planned_pages)
