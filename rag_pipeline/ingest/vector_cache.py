"""Vectors are content-addressed per space: embed only the texts a space has no vector for, cache
them before any switch (safe on every outcome), and keep what a failed call did pay for."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg

from rag_pipeline.embedders.base import EmbedResult, Embedder, EmbeddingError, PartialEmbeddingError, PoisonedInputError
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import deliveries, pages, spaces

log = logging.getLogger(__name__)

#: The embedder of a space: given the active space (None for an empty index), the embedder whose
#: vectors live there (or, for None, the configured one, which makes the first space).
EmbedderFor = Callable[[spaces.Space | None], Embedder]


@dataclass(frozen=True)
class Spent:
    tokens: int = 0
    requests: int = 0
    truncated: int = 0


def embed_missing(conn: psycopg.Connection, page: pages.Page, unique: dict[bytes, chunk_store.StagedChunk],
                   space: spaces.Space, embedder: Embedder) -> tuple[list[chunk_store.StagedChunk], Spent]:
    """Embed and cache the texts ``space`` has no vector for yet; returns them and their cost."""
    # Vectors are content-addressed, so caching them before the switch is safe on any outcome.
    cached = chunk_store.cached_hashes(conn, space, list(unique))
    missing = [c for h, c in unique.items() if h not in cached]
    if not missing:
        return missing, Spent()
    try:
        result = embedder.embed([c.embed_text for c in missing], [c.token_count for c in missing])
    except PartialEmbeddingError as exc:
        # Keep what was paid for; the page itself stays on its old version.
        keep_paid(conn, space, [(c.embed_hash, c.token_count) for c in missing], exc)
        if isinstance(exc, PoisonedInputError):
            record_failure(conn, page, f"embedding refused chunk(s) {exc.indices}: {exc.reason}")
        else:
            record_failure(conn, page, f"embedding failed: {exc}")
        raise
    except EmbeddingError as exc:
        record_failure(conn, page, f"embedding failed: {exc}")
        raise
    with conn.transaction():
        chunk_store.cache_vectors(
            conn, space,
            [(c.embed_hash, v, c.token_count) for c, v in zip(missing, result.vectors, strict=True)],
        )
    return missing, Spent(result.tokens, result.requests, result.truncated)


def keep_paid(conn: psycopg.Connection, space: spaces.Space, texts: list[tuple[bytes, int]],
              exc: PartialEmbeddingError) -> None:
    """Cache the vectors a failed call did get (``texts``: its inputs' (embed_hash, tokens), in order)."""
    good = exc.good_vectors()
    with conn.transaction():
        chunk_store.cache_vectors(conn, space, [(texts[i][0], v, texts[i][1]) for i, v in good.items()])


def cache_uncached(conn: psycopg.Connection, space: spaces.Space, embedder_of: Callable[[], Embedder | None],
                   texts: Mapping[bytes, tuple[str, int]]) -> tuple[int, EmbedResult | None]:
    """Embed and cache those of ``texts`` (embed_hash → (text, tokens)) that ``space`` has no vector
    of; no transaction is open while the model works. The embedder is asked for only when there is
    something to embed (None: none can embed for this space). Returns (texts embedded, the cost)."""
    cached = chunk_store.cached_hashes(conn, space, list(texts))
    todo = [(h, text, tokens) for h, (text, tokens) in texts.items() if h not in cached]
    embedder = embedder_of() if todo else None
    if embedder is None:
        return 0, None
    try:
        result = embedder.embed([text for _, text, _ in todo])   # stored counts may predate this chunker
    except PartialEmbeddingError as exc:
        keep_paid(conn, space, [(h, tokens) for h, _, tokens in todo], exc)
        raise
    with conn.transaction():
        chunk_store.cache_vectors(conn, space, [(h, v, tokens) for (h, _, tokens), v
                                                in zip(todo, result.vectors, strict=True)])
    return len(todo), result


def embed_for_builds(conn: psycopg.Connection, page_url: str, unique: dict[bytes, chunk_store.StagedChunk],
                      embedder_for: EmbedderFor) -> None:
    """While a model switch builds another space, a page switch writes that space too: its new
    texts are embedded for it here, before the switch. If that fails (the other model is out of
    reach from here), the switch goes on and the texts wait on the space's backlog for the build."""
    texts = {h: (c.embed_text, c.token_count) for h, c in unique.items()}
    def embedder_of(other: spaces.Space) -> Embedder | None:
        embedder = embedder_for(other)
        # A run pinned to one model (a fixed embedder) cannot embed for another.
        return embedder if (embedder.model, embedder.dimensions) == (other.model, other.dimensions) else None

    # Read after this pass's embedding: a flip that landed meanwhile leaves nothing to build.
    building = [s for s in spaces.maintained(conn) if s.status == "building"]
    for other in building:
        try:
            cache_uncached(conn, other, lambda: embedder_of(other), texts)
        except Exception as exc:  # noqa: BLE001 - the build catches up on what this could not do
            log.warning("%s: not embedded for space %s (%s) being built, left for its build: %s",
                        page_url, other.space_id, other.model, exc)


def record_failure(conn: psycopg.Connection, page: pages.Page, error: str) -> None:
    """Say on the delivery why its content is not searchable yet (the old version still is)."""
    if page.source_delivery_id is None:
        return
    with conn.transaction():
        deliveries.note_failed(conn, page.source_delivery_id, error)
