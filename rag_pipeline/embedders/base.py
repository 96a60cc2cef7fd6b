"""The embedder contract shared by the OpenAI client, the offline local model and the test embedder.

Every provider returns L2-normalised vectors in input order, plus the cost figures
(tokens, requests, retries) that the run metadata and the token ledger record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class EmbeddingError(RuntimeError):
    """Embedding failed; nothing in the call's result may be trusted unless a subclass says so."""


class PartialEmbeddingError(EmbeddingError):
    """The call embedded (and was billed for) part of its inputs before it failed.

    ``vectors[i]`` is None for each input without a vector. Callers store the good ones before
    failing: a retry must never pay for a text twice.
    """

    def __init__(self, message: str, *, vectors: list[list[float] | None] | None = None, tokens: int = 0,
                 requests: int = 0, retries: int = 0) -> None:
        #: Partial results, in input order; None where there is no vector.
        self.vectors: list[list[float] | None] = vectors if vectors is not None else []
        self.tokens = tokens
        self.requests = requests
        self.retries = retries
        super().__init__(message)

    def good_vectors(self) -> dict[int, list[float]]:
        """The vectors that were embedded, by input index, ready to be stored."""
        return {i: v for i, v in enumerate(self.vectors) if v is not None}


class IncompleteEmbeddingError(PartialEmbeddingError):
    """The API went away part-way through a call (its retries spent): the rest waits for a retry."""


class PoisonedInputError(PartialEmbeddingError):
    """Some inputs were rejected by the server while the others were embedded.

    Raised only after every other input went through, so the caller can store the good
    vectors (``vectors[i]`` is None exactly for ``i`` in ``indices``) and report the bad
    inputs instead of failing the whole page on one of them.
    """

    def __init__(
        self,
        indices: list[int],
        reason: str,
        *,
        reasons: dict[int, str] | None = None,
        vectors: list[list[float] | None] | None = None,
        tokens: int = 0,
        requests: int = 0,
        retries: int = 0,
    ) -> None:
        self.indices: list[int] = sorted(indices)
        #: The server's reason for the first bad input (see ``reasons`` for each one).
        self.reason: str = reason
        self.reasons: dict[int, str] = dict(reasons) if reasons else {i: reason for i in indices}
        shown = ", ".join(str(i) for i in self.indices[:20])
        more = f" (+{len(self.indices) - 20} more)" if len(self.indices) > 20 else ""
        super().__init__(
            f"{len(self.indices)} input(s) rejected by the embedding server "
            f"at index {shown}{more}: {reason}",
            vectors=vectors, tokens=tokens, requests=requests, retries=retries,
        )


@dataclass
class EmbedResult:
    """Vectors in input order plus what they cost, for run metadata and the token ledger.

    ``tokens`` is what the provider processed (billed usage for OpenAI, wordpieces fed to
    the model for the local one, cl100k tokens for the hash embedder); ``requests`` counts
    every call to the backend, including failed and retried ones; ``retries`` is how many
    of those were re-sends after a transient failure. ``truncated`` counts inputs the
    provider had to cut to fit its window (only the local model ever does; see LocalEmbedder).
    """

    vectors: list[list[float]]
    tokens: int
    requests: int
    retries: int
    truncated: int = 0


@runtime_checkable
class Embedder(Protocol):
    """An embedding space and a way to put texts into it.

    ``model`` names the space (vectors from different models are never compared), and
    ``dimensions`` is fixed before the first call so that tables and indexes can be sized.
    """

    model: str
    dimensions: int

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        """Embed ``texts``; vectors come back in input order, L2-normalised. Empty list: no work.
        ``token_counts``: each text's cl100k count where the caller has it (the chunker counted
        every chunk it made), so the texts are not tokenized a second time."""
        ...
