"""Which failures of a page a later try could fix: the one rule page runs and batch runs share."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from rag_pipeline.embedders.base import PoisonedInputError
from rag_pipeline.store.spaces import SpaceMismatch


@dataclass(frozen=True)
class PageFailure:
    reason: str
    retryable: bool


def classify(exc: BaseException) -> PageFailure:
    """The same text refused by the model or by PostgreSQL, the same model mismatch: a later try
    would meet them again, so retrying costs money and changes nothing. Anything else (the API or
    the database away, a crash) may pass."""
    if isinstance(exc, (PoisonedInputError, SpaceMismatch)):
        return PageFailure(str(exc), retryable=False)
    if isinstance(exc, psycopg.DataError):
        # SQLSTATE class 22 (or psycopg refusing a NUL before sending): a property of the data.
        code = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
        return PageFailure(f"the page's data cannot be stored: {str(exc).strip()}{code}; not retried: "
                           "a retry would fail the same way", retryable=False)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return PageFailure(f"{type(exc).__name__}: {text}", retryable=True)
