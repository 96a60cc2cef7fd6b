"""The three steps of a page run: take the newest delivery as source, stage chunks, embed and switch.

Each step reads and writes Postgres only, so a step can be retried or re-run from the UI;
the switch at the end of `embed_and_switch` is the only moment search sees anything change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg

from rag_pipeline.core.bodies import decode_stored
from rag_pipeline.core.chunking import chunk_markdown, chunker_signature
from rag_pipeline.core.text import content_hash, embed_hash, normalize_markdown
from rag_pipeline.ingest.rules import configured_boilerplate_rules
from rag_pipeline.core.urls import chunk_id, page_id
from rag_pipeline.embedders.base import (EmbedResult, Embedder, EmbeddingError, PartialEmbeddingError,
                                         PoisonedInputError)
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import deliveries, pages, spaces

log = logging.getLogger(__name__)


class PageNotFound(LookupError):
    pass


@dataclass(frozen=True)
class SourceResult:
    status: str                 # "updated", "current", "tombstoned"
    source_hash: str | None
    delivery_id: int | None
    chars: int
    superseded: int


def take_newest_delivery(conn: psycopg.Connection, page_url: str, max_page_bytes: int) -> SourceResult:
    """Make the newest queued delivery of this page its source text; older queued ones are superseded."""
    pid = page_id(page_url)
    newest = deliveries.newest_queued(conn, page_url)
    text = digest = None
    if newest is not None:
        if newest.normalized_text is not None:   # routing decoded, normalized and hashed it already
            text = newest.normalized_text
            digest = newest.normalized_hash or content_hash(text)    # queued before 015: no hash kept
        else:                                    # queued before 009: only the body was kept
            decoded = decode_stored(newest.body, newest.body_encoding, max_page_bytes)
            text = normalize_markdown(decoded.text, configured_boilerplate_rules(), url=page_url)
            digest = content_hash(text)
    with conn.transaction():
        page = pages.get(conn, page_url, for_update=True)
        if page is None:
            raise PageNotFound(f"no page row for {page_url}: was it ever delivered?")
        superseded = 0
        if newest is not None and newest.id > (page.applied_delivery_id or 0):
            pages.set_source(conn, pid, text, digest, newest.id, newest.original_status)
            superseded = deliveries.supersede_older(conn, page_url, newest.id)
            return SourceResult("updated", digest, newest.id, len(text), superseded)
        if page.source_hash is None:
            return SourceResult("tombstoned" if page.deleted_at else "empty", None,
                                page.applied_delivery_id, 0, superseded)
        return SourceResult("current", page.source_hash, page.source_delivery_id,
                            len(page.source_text or ""), superseded)


@dataclass(frozen=True)
class StageResult:
    source_hash: str | None
    chunks: int
    tokens: int


def stage_chunks(conn: psycopg.Connection, page_url: str, max_tokens: int, overlap_tokens: int) -> StageResult:
    """Chunk the stored source text (never the crawler: re-chunking needs no recrawl)."""
    pid = page_id(page_url)
    page = pages.get(conn, page_url)
    if page is None:
        raise PageNotFound(f"no page row for {page_url}")
    # A tombstone clears source_hash; a later 200 sets it again (and the switch revives the page).
    if page.source_hash is None or page.source_text is None:
        with conn.transaction():
            chunk_store.discard_staged(conn, pid)
        return StageResult(None, 0, 0)
    pieces = chunk_markdown(page.source_text, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
    signature = chunker_signature(max_tokens, overlap_tokens)
    staged = [
        chunk_store.StagedChunk(
            chunk_id=chunk_id(page_url, c.index), chunk_index=c.index, content=c.content,
            embed_text=c.embed_text, embed_hash=embed_hash(c.embed_text),
            token_count=c.token_count, chunker_version=signature,
        )
        for c in pieces
    ]
    with conn.transaction():
        chunk_store.stage(conn, pid, page.source_hash, staged)
    return StageResult(page.source_hash, len(staged), sum(c.token_count for c in staged))


@dataclass(frozen=True)
class SwitchResult:
    status: str                 # "switched", "unchanged", "superseded", "tombstoned", "nothing staged"
    chunks_total: int = 0
    chunks_embedded: int = 0
    tokens_embedded: int = 0
    tokens_reused: int = 0
    requests: int = 0
    truncated: int = 0          # inputs the model had to cut to fit its window
    source_hash: str | None = None
    space_id: int | None = None


#: The embedder of a space: given the active space (None for an empty index), the embedder whose
#: vectors live there (or, for None, the configured one, which makes the first space).
EmbedderFor = Callable[[spaces.Space | None], Embedder]

# `space activate` landing between a page's embedding and its switch costs one more pass; more in a
# row means someone is flipping models back and forth, and the run fails (to be retried) instead.
_MAX_PASSES = 3


def _as_chooser(embedder: Embedder | EmbedderFor) -> EmbedderFor:
    if hasattr(embedder, "embed"):
        fixed: Embedder = embedder  # type: ignore[assignment]
        return lambda _active: fixed
    return embedder  # type: ignore[return-value]


def _space_for(conn: psycopg.Connection, embedder_for: EmbedderFor,
               active: spaces.Space | None) -> tuple[spaces.Space, Embedder]:
    embedder = embedder_for(active)
    # Creates the first space of an empty index; refuses an embedder that is not the active model.
    return spaces.ensure_active(conn, embedder.model, embedder.dimensions), embedder


@dataclass(frozen=True)
class Prepaid:
    """What a batch already embedded for this page in requests shared across pages: the texts
    this page brought first (`hashes`), and its share of their cost, for its ledger row."""

    hashes: frozenset[bytes] = frozenset()
    tokens: int = 0
    requests: int = 0
    truncated: int = 0


def embed_and_switch(conn: psycopg.Connection, page_url: str, embedder: Embedder | EmbedderFor,
                     run_id: str | None = None, prepaid: Prepaid = Prepaid()) -> SwitchResult:
    """Embed only texts the active space has never seen, then swap the page in one transaction.

    ``embedder`` is either a function of the active space giving that space's embedder (how page
    runs follow the active space, and follow `space activate` even when it lands mid-run), or one
    fixed embedder, which must be the active space's model (SpaceMismatch otherwise).
    """
    embedder_for = _as_chooser(embedder)
    pid = page_id(page_url)
    page = pages.get(conn, page_url)
    if page is None:
        raise PageNotFound(f"no page row for {page_url}")
    if page.source_hash is None:
        return SwitchResult("tombstoned" if page.deleted_at else "nothing staged")
    space, embedder = _space_for(conn, embedder_for, spaces.active(conn))
    staged = chunk_store.staged(conn, pid, page.source_hash)
    if not staged:
        if page.indexed_hash == page.source_hash:
            return SwitchResult("unchanged", source_hash=page.source_hash, space_id=space.space_id)
        if (page.source_text or "").strip():
            # Never swap in an empty generation for a page that has text: that would erase it.
            raise RuntimeError(
                f"no staged chunks of {page_url} for source {page.source_hash[:12]}; "
                "materialize `chunks` for this partition before `embeddings`"
            )

    unique: dict[bytes, chunk_store.StagedChunk] = {c.embed_hash: c for c in staged}
    # What was paid for, over every pass (a pass for a space flipped away from stays cached there).
    brought = prepaid.hashes & unique.keys()
    chunks_embedded, tokens_embedded = len(brought), prepaid.tokens
    requests, truncated = prepaid.requests, prepaid.truncated
    for _ in range(_MAX_PASSES):
        missing, spent = _embed_missing(conn, page, unique, space, embedder)
        chunks_embedded += len(missing)
        tokens_embedded, requests, truncated = (
            tokens_embedded + spent.tokens, requests + spent.requests, truncated + spent.truncated)
        _embed_for_builds(conn, page_url, unique, embedder_for)
        with conn.transaction():
            # Before reading the active space: a flip either waits for this switch (and catches up
            # on its texts) or has committed, and then this pass's vectors are for a retired space.
            chunk_store.hold_off_space_flip(conn)
            locked = pages.get(conn, page_url, for_update=True)
            # A newer delivery (content or tombstone) got in while we embedded: its own run applies it.
            if locked is None or locked.source_hash != page.source_hash:
                return SwitchResult("superseded", source_hash=page.source_hash, space_id=space.space_id)
            written = spaces.maintained(conn)   # a space being built gets this page's vectors too
            now_active = next((s for s in written if s.status == "active"), None)
            if now_active is not None and now_active.space_id == space.space_id:
                missing_hashes = {c.embed_hash for c in missing} | brought
                tokens_reused = sum(c.token_count for c in staged if c.embed_hash not in missing_hashes)
                building = [s for s in written if s.status == "building"]
                return _switch(conn, page_url, page, locked, staged, space, building, run_id,
                               chunks_embedded, tokens_embedded, tokens_reused, requests, truncated)
        log.info("%s: the active embedding space changed during the run (now %s); embedding for it",
                 page_url, f"{now_active.model}, {now_active.dimensions} dims" if now_active else "none")
        space, embedder = _space_for(conn, embedder_for, now_active)
    raise RuntimeError(
        f"the active embedding space of {page_url} changed {_MAX_PASSES} times during one run; "
        "nothing was switched, and a later run will index the page"
    )


@dataclass(frozen=True)
class _Spent:
    tokens: int = 0
    requests: int = 0
    truncated: int = 0


def _embed_missing(conn: psycopg.Connection, page: pages.Page, unique: dict[bytes, chunk_store.StagedChunk],
                   space: spaces.Space, embedder: Embedder) -> tuple[list[chunk_store.StagedChunk], _Spent]:
    """Embed and cache the texts ``space`` has no vector for yet; returns them and their cost."""
    # Vectors are content-addressed, so caching them before the switch is safe on any outcome.
    cached = chunk_store.cached_hashes(conn, space, list(unique))
    missing = [c for h, c in unique.items() if h not in cached]
    if not missing:
        return missing, _Spent()
    try:
        result = embedder.embed([c.embed_text for c in missing])
    except PartialEmbeddingError as exc:
        # Keep what was paid for; the page itself stays on its old version.
        keep_paid(conn, space, [(c.embed_hash, c.token_count) for c in missing], exc)
        if isinstance(exc, PoisonedInputError):
            _record_failure(conn, page, f"embedding refused chunk(s) {exc.indices}: {exc.reason}")
        else:
            _record_failure(conn, page, f"embedding failed: {exc}")
        raise
    except EmbeddingError as exc:
        _record_failure(conn, page, f"embedding failed: {exc}")
        raise
    with conn.transaction():
        chunk_store.cache_vectors(
            conn, space,
            [(c.embed_hash, v, c.token_count) for c, v in zip(missing, result.vectors, strict=True)],
        )
    return missing, _Spent(result.tokens, result.requests, result.truncated)


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
    conn.commit()
    todo = [(h, text, tokens) for h, (text, tokens) in texts.items() if h not in cached]
    embedder = embedder_of() if todo else None
    if embedder is None:
        return 0, None
    try:
        result = embedder.embed([text for _, text, _ in todo])
    except PartialEmbeddingError as exc:
        keep_paid(conn, space, [(h, tokens) for h, _, tokens in todo], exc)
        raise
    with conn.transaction():
        chunk_store.cache_vectors(conn, space, [(h, v, tokens) for (h, _, tokens), v
                                                in zip(todo, result.vectors, strict=True)])
    return len(todo), result


def _embed_for_builds(conn: psycopg.Connection, page_url: str, unique: dict[bytes, chunk_store.StagedChunk],
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
            conn.rollback()
            log.warning("%s: not embedded for space %s (%s) being built, left for its build: %s",
                        page_url, other.space_id, other.model, exc)
    conn.commit()


def _switch(conn: psycopg.Connection, page_url: str, page: pages.Page, locked: pages.Page,
            staged: list[chunk_store.StagedChunk], space: spaces.Space, building: list[spaces.Space],
            run_id: str | None,
            chunks_embedded: int, tokens_embedded: int, tokens_reused: int, requests: int,
            truncated: int) -> SwitchResult:
    """The page's one switch (caller holds its row lock, in the transaction that commits it)."""
    pid = page_id(page_url)
    live = chunk_store.swap_in(conn, pid, page.source_hash, space, building)
    changed = locked.indexed_hash != locked.source_hash
    # A new crawl verifies the page; a re-chunk of the stored text does not.
    crawled = (locked.source_delivery_id or 0) > (locked.applied_delivery_id or 0)
    signature = staged[0].chunker_version if staged else locked.chunker_version
    pages.mark_switched(conn, pid, signature, verified=crawled or changed, changed=changed)
    if crawled and locked.source_delivery_id is not None:
        deliveries.mark(conn, locked.source_delivery_id, "embedded", page_url=page_url)
        deliveries.supersede_older(conn, page_url, locked.source_delivery_id)
    chunk_store.record_ledger(
        conn, run_id=run_id, page_url=page_url, space=space, chunks_total=live,
        chunks_embedded=chunks_embedded, tokens_embedded=tokens_embedded,
        tokens_reused=tokens_reused, requests=requests,
    )
    return SwitchResult(
        "switched", chunks_total=live, chunks_embedded=chunks_embedded, tokens_embedded=tokens_embedded,
        tokens_reused=tokens_reused, requests=requests, truncated=truncated, source_hash=page.source_hash,
        space_id=space.space_id,
    )


def _record_failure(conn: psycopg.Connection, page: pages.Page, error: str) -> None:
    """Say on the delivery why its content is not searchable yet (the old version still is)."""
    if page.source_delivery_id is None:
        return
    with conn.transaction():
        deliveries.note_failed(conn, page.source_delivery_id, error)
