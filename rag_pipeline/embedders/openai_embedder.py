"""OpenAI (or any OpenAI-compatible server) embeddings, with the batching and retries done here.

One POST to /embeddings over httpx, without the official SDK: every batch run makes an embedder,
and `import openai` cost ~0.8 s of each run's start-up for what is one JSON request. One place
decides what is retried, how long to wait, and what gets counted: every request and retry goes
into the run's metadata and the token ledger. Vectors come back base64-encoded (as the SDK asks
for them), and a server that answers with lists of floats instead is read too. Inputs are
validated before anything is sent (an input over the model's window is an error, never silently
truncated), packed into token-aware batches, and a batch rejected with a 400 is bisected so one
bad input does not cost the others.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import os
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from rag_pipeline.core.retrying import Backoff
from rag_pipeline.core.tokens import MAX_EMBED_INPUT_TOKENS, count_tokens
from rag_pipeline.embedders.base import EmbeddingError, EmbedResult, IncompleteEmbeddingError, PoisonedInputError
from rag_pipeline.openai_calls import (CallFailed, ConnectionFailed, RequestTimedOut, Retrying, StatusError, Tries,
                                       error_field, error_reason)

log = logging.getLogger(__name__)

#: Native output size of OpenAI's embedding models.
KNOWN_DIMENSIONS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
#: OpenAI's per-request limits for /v1/embeddings.
OPENAI_MAX_INPUTS_PER_REQUEST = 2048
OPENAI_MAX_TOKENS_PER_REQUEST = 300_000
OPENAI_BASE_URL = "https://api.openai.com/v1"
# Bisection's circuit breaker: this many inputs rejected alone and none accepted.
_REJECTIONS_BEFORE_GIVING_UP = 8


def _supports_dimensions(model: str) -> bool:
    """Only the v3 models accept the `dimensions` parameter (ada-002 rejects it)."""
    return model.startswith("text-embedding-3")


class _InputRejected(Exception):
    """A 400 that may be caused by the inputs of the request (so bisecting can find them)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _CallState(Tries):
    vectors: list[list[float] | None] = field(default_factory=list)
    tokens: int = 0
    rejected: dict[int, str] = field(default_factory=dict)


class OpenAIEmbedder:
    """Embeddings from /v1/embeddings, batched, retried and counted here."""

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        dimensions: int | None = None,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 6,
        max_inputs_per_request: int = OPENAI_MAX_INPUTS_PER_REQUEST,
        max_tokens_per_request: int = OPENAI_MAX_TOKENS_PER_REQUEST,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not api_key:
            raise EmbeddingError("the OpenAI embedder needs an API key (OPENAI_API_KEY)")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_inputs_per_request < 1 or max_tokens_per_request < 1:
            raise ValueError("max_inputs_per_request and max_tokens_per_request must be >= 1")
        native = KNOWN_DIMENSIONS.get(model)
        if dimensions is not None:
            if dimensions < 1:
                raise ValueError(f"dimensions must be >= 1, got {dimensions}")
            if native is not None and dimensions > native:
                raise EmbeddingError(f"{model} has {native} dimensions; cannot ask for {dimensions}")
            if native is not None and not _supports_dimensions(model) and dimensions != native:
                raise EmbeddingError(f"{model} does not support `dimensions`; it always returns {native}")
        elif native is None:
            raise EmbeddingError(
                f"unknown embedding model {model!r}: set its output size explicitly "
                "(EMBEDDING_DIMENSIONS) so the vector tables can be sized"
            )
        self.model: str = model
        self.dimensions: int = dimensions if dimensions is not None else native  # type: ignore[assignment]
        # Sent only when asked for, and only to models that accept it.
        self._send_dimensions = dimensions is not None and _supports_dimensions(model)
        self.max_inputs_per_request = max_inputs_per_request
        self.max_tokens_per_request = max_tokens_per_request
        self.retrying = Retrying("embedding request", EmbeddingError, max_retries,
                                 Backoff(backoff_base_s, backoff_max_s, retry_after_max_s), log, sleep,
                                 rng or random.Random(), timeout_hint="EMBEDDING_TIMEOUT_S")
        headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json",
                   "User-Agent": "rag-pipeline"}
        # As the SDK does: a key of several organizations or projects bills the one named here.
        for header, variable in (("OpenAI-Organization", "OPENAI_ORG_ID"), ("OpenAI-Project", "OPENAI_PROJECT_ID")):
            if os.environ.get(variable):
                headers[header] = os.environ[variable]
        # As the SDK does too: the system's certificate store (a private CA of a self-hosted server,
        # SSL_CERT_FILE), and redirects followed (an http:// URL its proxy sends to https://).
        self._client = httpx.Client(base_url=base_url or OPENAI_BASE_URL, timeout=timeout_s, headers=headers,
                                    verify=ssl.create_default_context(), follow_redirects=True)

    # -- public ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the HTTP connections (the resource closes its embedders when a run ends)."""
        self._client.close()

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        """Embed all texts, or raise: EmbeddingError (nothing usable) or PoisonedInputError (partial)."""
        if not texts:
            return EmbedResult(vectors=[], tokens=0, requests=0, retries=0)
        counts = self._validate(texts, token_counts)
        state = _CallState(vectors=[None] * len(texts))
        try:
            for batch in self.plan_batches(counts):
                self._embed_or_bisect(batch, texts, counts, state)
        except EmbeddingError as exc:
            if not any(v is not None for v in state.vectors):
                raise
            # Earlier requests of this call were answered (and billed): hand their vectors over.
            raise IncompleteEmbeddingError(
                f"{exc} (after {sum(v is not None for v in state.vectors)} of {len(texts)} inputs were embedded)",
                vectors=state.vectors, tokens=state.tokens, requests=state.requests, retries=state.retries,
            ) from exc
        if state.rejected:
            first = min(state.rejected)
            log.error(
                "embedding server rejected %d input(s) at %s: %s",
                len(state.rejected), sorted(state.rejected)[:20], state.rejected[first],
            )
            raise PoisonedInputError(
                sorted(state.rejected),
                state.rejected[first],
                reasons=state.rejected,
                vectors=state.vectors,
                tokens=state.tokens,
                requests=state.requests,
                retries=state.retries,
            )
        return EmbedResult(
            vectors=[v for v in state.vectors if v is not None],
            tokens=state.tokens,
            requests=state.requests,
            retries=state.retries,
        )

    def plan_batches(self, token_counts: list[int]) -> list[list[int]]:
        """Consecutive indices packed under both per-request limits (an oversized input goes alone)."""
        batches: list[list[int]] = []
        current: list[int] = []
        budget = 0
        for i, n in enumerate(token_counts):
            if current and (
                len(current) >= self.max_inputs_per_request or budget + n > self.max_tokens_per_request
            ):
                batches.append(current)
                current, budget = [], 0
            current.append(i)
            budget += n
        if current:
            batches.append(current)
        return batches

    # -- internals ---------------------------------------------------------------------

    def _validate(self, texts: list[str], known: list[int] | None = None) -> list[int]:
        """Refuse what the API would refuse, before any request (and before any cost); `known`
        counts stand in for counting again."""
        bad_type = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad_type:
            raise EmbeddingError(f"inputs must be strings; not at index {bad_type[:20]}")
        empty = [i for i, t in enumerate(texts) if not t]
        if empty:
            raise EmbeddingError(f"empty input at index {empty[:20]}: the embeddings API rejects empty strings")
        if known is not None and len(known) != len(texts):
            raise EmbeddingError(f"{len(known)} token counts for {len(texts)} inputs")
        counts = list(known) if known is not None else [count_tokens(t) for t in texts]
        too_long = [(i, n) for i, n in enumerate(counts) if n > MAX_EMBED_INPUT_TOKENS]
        if too_long:
            shown = ", ".join(f"#{i} ({n} tokens)" for i, n in too_long[:20])
            raise EmbeddingError(
                f"{len(too_long)} input(s) exceed {MAX_EMBED_INPUT_TOKENS} tokens: {shown}; "
                "they are never truncated here: the chunker must split them"
            )
        return counts

    def _embed_or_bisect(
        self, batch: list[int], texts: list[str], counts: list[int], state: _CallState
    ) -> None:
        try:
            vectors, tokens = self._request([texts[i] for i in batch], state)
        except _InputRejected as exc:
            if len(batch) == 1:
                state.rejected[batch[0]] = exc.reason
                if len(state.rejected) >= _REJECTIONS_BEFORE_GIVING_UP and not any(state.vectors):
                    # Every input fails alone: the request, not the inputs, is wrong. Stop
                    # before bisecting spends ~2 requests per input to prove it.
                    raise EmbeddingError(
                        f"the embedding server rejects every input ({len(state.rejected)} tried alone, "
                        f"none accepted): {exc.reason}"
                    ) from exc
                return
            log.warning("a batch of %d was rejected (%s); bisecting to find the bad input(s)", len(batch), exc.reason)
            mid = len(batch) // 2
            self._embed_or_bisect(batch[:mid], texts, counts, state)
            self._embed_or_bisect(batch[mid:], texts, counts, state)
            return
        for i, v in zip(batch, vectors):
            state.vectors[i] = v
        state.tokens += tokens if tokens is not None else sum(counts[i] for i in batch)

    def _request(self, inputs: list[str], state: _CallState) -> tuple[list[list[float]], int | None]:
        """One logical request with bounded retries; returns vectors in order and billed tokens."""
        body: dict[str, Any] = {"model": self.model, "input": inputs, "encoding_format": "base64"}
        if self._send_dimensions:
            body["dimensions"] = self.dimensions

        def refuse(exc: StatusError, reason: str) -> Exception | None:
            if exc.status_code != 400:
                return None
            # A 400 about a request parameter is our configuration, not an input.
            if exc.param and exc.param != "input":
                return EmbeddingError(f"embedding request refused (param {exc.param!r}): {reason}")
            return _InputRejected(reason)

        response = self.retrying.call(lambda: self._post(body), tries=state,
                                      refuse=refuse, detail=lambda t: f" ({t.requests} requests so far)")
        return self._parse(response, len(inputs))

    def _post(self, body: dict[str, Any]) -> Any:
        """One POST; its failures as the retry loop's, the error's own words kept."""
        try:
            response = self._client.post("embeddings", json=body)
        except httpx.TimeoutException as exc:
            raise RequestTimedOut() from exc
        except httpx.UnsupportedProtocol as exc:   # no retry mends the URL
            raise CallFailed(f"{exc}: check OPENAI_BASE_URL ({self._client.base_url})") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(str(exc) or type(exc).__name__) from exc
        except httpx.RequestError as exc:        # too many redirects, an undecodable body: final
            raise CallFailed(f"{type(exc).__name__}: {exc}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = response.text[:500]
        if response.is_error:
            raise StatusError(response.status_code, error_reason(answer, response.reason_phrase or "no reason given"),
                              code=error_field(answer, "code"), param=error_field(answer, "param"),
                              headers=response.headers)
        if not isinstance(answer, dict):
            raise CallFailed(f"the embedding server answered HTTP {response.status_code} without a JSON object: "
                             f"{str(answer)[:200]!r}")
        return answer

    def _parse(self, response: dict[str, Any], expected: int) -> tuple[list[list[float]], int | None]:
        data = response.get("data")
        data = data if isinstance(data, list) else []
        if len(data) != expected:
            raise EmbeddingError(f"embedding server returned {len(data)} vectors for {expected} inputs")
        by_index: dict[int, list[float]] = {}
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < expected or index in by_index:
                raise EmbeddingError(f"embedding server returned a bad or duplicate index {index!r}")
            vector = _vector(item.get("embedding"))
            if vector.ndim != 1 or len(vector) != self.dimensions:
                raise EmbeddingError(
                    f"embedding server returned {vector.size} dimensions, expected {self.dimensions} for {self.model}"
                )
            norm = math.sqrt(float(vector @ vector))
            if not math.isfinite(norm) or norm == 0.0:
                raise EmbeddingError("embedding server returned a zero or non-finite vector")
            by_index[index] = (vector / norm).tolist()
        usage = response.get("usage")
        total = usage.get("total_tokens") if isinstance(usage, dict) else None
        # Some compatible servers omit usage or report 0: then our own cl100k count stands in.
        tokens = total if isinstance(total, int) and total > 0 else None
        return [by_index[i] for i in range(expected)], tokens


def _vector(embedding: Any) -> np.ndarray:
    """base64 of little-endian float32s (what is asked for), or a list of numbers."""
    try:
        if isinstance(embedding, str):
            return np.frombuffer(base64.b64decode(embedding), dtype="<f4").astype(np.float64)
        # numpy: a Python loop over every float costs ~1 ms a page at bulk-load rates
        return np.asarray(embedding, dtype=np.float64)
    except (TypeError, ValueError, binascii.Error) as exc:
        raise EmbeddingError(f"embedding server returned a non-numeric vector: {exc}") from None
