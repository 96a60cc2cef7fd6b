"""What a batch yields, step by step, and when a failed page is tried again: the vocabulary the
batch runs, the backfill steps, their metadata and the benchmarks share with `batch_apply`."""

from __future__ import annotations

from dataclasses import dataclass

from rag_pipeline.core.chunk_budget import ChunkBudget
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.failures import PageFailure

__all__ = ["Event", "Failed", "RetryPolicy", "Skipped", "Sourced", "Staged", "Switched"]


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed page's delivery is tried again (RUN_RETRY_*)."""

    max_attempts: int
    backoff_s: float
    max_backoff_s: float = 300.0

    @classmethod
    def from_settings(cls, settings) -> RetryPolicy:
        return cls(settings.run_retry_max_attempts, settings.run_retry_backoff_s, settings.run_retry_backoff_max_s)


@dataclass(frozen=True)
class Sourced:
    page_url: str
    result: indexing.SourceResult


@dataclass(frozen=True)
class Staged:
    page_url: str
    result: indexing.StageResult
    budget: ChunkBudget


@dataclass(frozen=True)
class Switched:
    page_url: str
    result: indexing.SwitchResult


@dataclass(frozen=True)
class Failed:
    page_url: str
    step: str                 # "pages", "chunks" or "embeddings"
    failure: PageFailure
    delivery_id: int | None


@dataclass(frozen=True)
class Skipped:
    page_url: str
    reason: str               # another batch holds the page now


Event = Sourced | Staged | Switched | Failed | Skipped
