"""The three steps of a page run: take the newest delivery as source, stage chunks, embed and switch.

Each step reads and writes Postgres only, so a step can be retried or re-run from the UI;
the switch at the end of `embed_and_switch` is the only moment search sees anything change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg

from rag_pipeline.core.bodies import decode_stored
from rag_pipeline.core.chunking import Window, chunk_markdown, chunker_signature
from rag_pipeline.core.template_strip import chunk_source
from rag_pipeline.core.text import content_hash, embed_hash, normalize_markdown
from rag_pipeline.ingest.rules import configured_boilerplate_rules
from rag_pipeline.core.urls import chunk_id, page_id
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.ingest import first_space, vector_cache
from rag_pipeline.ingest.vector_cache import EmbedderFor
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import deliveries, pages, site_templates, spaces

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
    # The address the crawler fetched (http:// stays http://): the partition key is the page's
    # normalized identity, which is https:// whatever the scheme, so http and https are one page.
    crawled_url: str | None = None


def take_newest_delivery(conn: psycopg.Connection, page_url: str, max_page_bytes: int) -> SourceResult:
    """Make the newest queued delivery of this page its source text; older queued ones are superseded."""
    return _raised(take_newest_deliveries(conn, [page_url], max_page_bytes)[page_url])


def take_newest_deliveries(conn: psycopg.Connection, page_urls: Sequence[str],
                           max_page_bytes: int) -> dict[str, SourceResult | Exception]:
    """`take_newest_delivery` for many pages: a read, a locking read and two writes for the whole
    set, in one transaction. A page that cannot be taken gets its exception as its result; the
    others are taken. Returns each page's result."""
    urls = list(dict.fromkeys(page_urls))
    newest = deliveries.newest_queued_many(conn, urls)
    results: dict[str, SourceResult | Exception] = {}
    texts: dict[str, tuple[str, str]] = {}
    for url, delivery in newest.items():
        if delivery.normalized_text is not None:   # routing decoded, normalized and hashed it already
            # Queued before 015: no hash kept.
            texts[url] = (delivery.normalized_text, delivery.normalized_hash or content_hash(delivery.normalized_text))
            continue
        try:                                       # queued before 009: only the body was kept
            decoded = decode_stored(delivery.body, delivery.body_encoding, max_page_bytes)
            text = normalize_markdown(decoded.text, configured_boilerplate_rules(), url=url)
            texts[url] = (text, content_hash(text))
        except Exception as exc:  # noqa: BLE001 - this page fails, the others are taken
            results[url] = exc
    with conn.transaction():
        rows = pages.get_many(conn, urls, for_update=True)
        updates, applied = [], []
        for url in urls:
            page = rows.get(url)
            if url in results:
                continue
            if page is None:
                results[url] = PageNotFound(f"no page row for {url}: was it ever delivered?")
                continue
            delivery = newest.get(url)
            if delivery is not None and delivery.id > (page.applied_delivery_id or 0):
                text, digest = texts[url]
                updates.append((page.page_id, text, digest, delivery.id, delivery.original_status))
                applied.append((url, delivery.id))
                results[url] = SourceResult("updated", digest, delivery.id, len(text), 0, delivery.url)
            elif page.source_hash is None:
                results[url] = SourceResult("tombstoned" if page.deleted_at else "empty", None,
                                            page.applied_delivery_id, 0, 0)
            else:
                results[url] = SourceResult("current", page.source_hash, page.source_delivery_id,
                                            len(page.source_text or ""), 0)
        pages.set_sources(conn, updates)
        superseded = deliveries.supersede_older_many(conn, applied)
    for url, n in superseded.items():
        result = results[url]
        results[url] = replace(result, superseded=n)
    return results


def _raised(result):
    if isinstance(result, Exception):
        raise result
    return result


@dataclass(frozen=True)
class StageResult:
    source_hash: str | None
    chunks: int
    tokens: int


def stage_chunks(conn: psycopg.Connection, page_url: str, max_tokens: int, overlap_tokens: int,
                 window: Window | None = None) -> StageResult:
    """Chunk the stored source text (never the crawler: re-chunking needs no recrawl)."""
    return _raised(stage_many(conn, [page_url], max_tokens, overlap_tokens, window)[page_url])[0]


def stage_many(conn: psycopg.Connection, page_urls: Sequence[str], max_tokens: int, overlap_tokens: int,
               window: Window | None = None) -> dict[str, tuple[StageResult, list[chunk_store.StagedChunk]] | Exception]:
    """`stage_chunks` for many pages: one read of their texts, the chunker in memory, one delete
    and one COPY. A page that cannot be chunked gets its exception as its result; the others are
    staged. Returns each page's result and the chunks staged for it."""
    urls = list(dict.fromkeys(page_urls))
    rows = pages.get_many(conn, urls)
    # Cut without the site's template (core/template_strip.py): it stays out of embeddings and
    # passages, and the stored source keeps it.
    templates = site_templates.current(conn, {page.site for page in rows.values()})
    signature = chunker_signature(max_tokens, overlap_tokens, window)
    results: dict[str, tuple[StageResult, list[chunk_store.StagedChunk]] | Exception] = {}
    generations: dict = {}
    discard = []
    for url in urls:
        page = rows.get(url)
        if page is None:
            results[url] = PageNotFound(f"no page row for {url}")
            continue
        # A tombstone clears source_hash; a later 200 sets it again (and the switch revives the page).
        if page.source_hash is None or page.source_text is None:
            discard.append(page.page_id)
            results[url] = (StageResult(None, 0, 0), [])
            continue
        try:
            template = templates.get(page.site, (None, None))[0]
            pieces = chunk_markdown(chunk_source(page.source_text, template, url), max_tokens=max_tokens,
                                    overlap_tokens=overlap_tokens, window=window)
        except Exception as exc:  # noqa: BLE001 - this page fails, the others are staged
            results[url] = exc
            continue
        staged = [
            chunk_store.StagedChunk(
                chunk_id=chunk_id(url, c.index), chunk_index=c.index, content=c.content,
                embed_text=c.embed_text, embed_hash=embed_hash(c.embed_text),
                token_count=c.token_count, chunker_version=signature,
            )
            for c in pieces
        ]
        generations[page.page_id] = (page.source_hash, staged)
        results[url] = (StageResult(page.source_hash, len(staged), sum(c.token_count for c in staged)), staged)
    with conn.transaction():
        chunk_store.discard_staged(conn, discard)
        chunk_store.stage(conn, generations)
    return results


@dataclass(frozen=True)
class SwitchResult:
    status: str                 # "switched", "unchanged", "superseded", "tombstoned", "nothing staged"
    chunks_total: int = 0
    chunks_embedded: int = 0
    tokens_embedded: int = 0
    tokens_reused: int = 0
    requests: int = 0           # whole requests, for the ledger (they add up to the bill)
    truncated: int = 0          # inputs the model had to cut to fit its window
    source_hash: str | None = None
    space_id: int | None = None
    request_share: float = 0.0  # its share of the requests it shared with other pages (by tokens)


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
    return (spaces.ensure_active(conn, embedder.model, embedder.dimensions, lambda: first_space.with_index(conn)),
            embedder)


@dataclass(frozen=True)
class Prepaid:
    """What a batch already embedded for this page in requests shared across pages: the texts
    this page brought first (`hashes`), and its share of their cost, for its ledger row."""

    hashes: frozenset[bytes] = frozenset()
    tokens: int = 0
    requests: int = 0
    truncated: int = 0
    request_share: float = 0.0


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
        missing, spent = vector_cache.embed_missing(conn, page, unique, space, embedder)
        chunks_embedded += len(missing)
        tokens_embedded, requests, truncated = (
            tokens_embedded + spent.tokens, requests + spent.requests, truncated + spent.truncated)
        vector_cache.embed_for_builds(conn, page_url, unique, embedder_for)
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
                switched = _switch(conn, page_url, page, locked, staged, space, building, run_id,
                                   chunks_embedded, tokens_embedded, tokens_reused, requests, truncated)
                # Its own requests whole, and its share of those it shared with the batch.
                return replace(switched, request_share=prepaid.request_share + requests - prepaid.requests)
        log.info("%s: the active embedding space changed during the run (now %s); embedding for it",
                 page_url, f"{now_active.model}, {now_active.dimensions} dims" if now_active else "none")
        space, embedder = _space_for(conn, embedder_for, now_active)
    raise RuntimeError(
        f"the active embedding space of {page_url} changed {_MAX_PASSES} times during one run; "
        "nothing was switched, and a later run will index the page"
    )


class OneByOne(RuntimeError):
    """The set switch does not apply now (a space is being built, or the active space changed):
    the pages are switched one by one, each on its own terms."""


def switch_many(conn: psycopg.Connection, staged: Mapping[str, tuple[str, Sequence[chunk_store.StagedChunk]]],
                embedder_for: EmbedderFor, run_id: str | None,
                prepaid: Mapping[str, Prepaid]) -> dict[str, SwitchResult]:
    """`embed_and_switch` for many pages whose texts the active space already holds (the batch
    embedded them, shared): each page's one switch, all in one transaction, a statement per step
    for the whole set. `staged`: page URL → (the source hash its chunks were cut from, the chunks).

    All or nothing: a page that would go live without its vectors, or with no chunks for its
    text, raises (IncompleteGeneration, RuntimeError), and OneByOne when a space is being built;
    the caller rolls back and switches page by page, where a failure is the page's alone."""
    space, _embedder = _space_for(conn, embedder_for, spaces.active(conn))
    results: dict[str, SwitchResult] = {}
    with conn.transaction():
        chunk_store.hold_off_space_flip(conn)   # as in one page's switch: a flip waits, or has committed
        written = spaces.maintained(conn)
        if [s.space_id for s in written] != [space.space_id]:
            raise OneByOne("a space is being built, or the active space changed: switching page by page")
        locked = pages.get_many(conn, staged, for_update=True)
        generations, marks, applied, ledger = {}, [], [], []
        for url, (source_hash, chunks) in staged.items():
            page = locked.get(url)
            if page is None:
                raise PageNotFound(f"no page row for {url}")
            if page.source_hash is None:
                results[url] = SwitchResult("tombstoned" if page.deleted_at else "nothing staged")
                continue
            if page.source_hash != source_hash:
                # A newer delivery (content or tombstone) got in meanwhile: its own run applies it.
                results[url] = SwitchResult("superseded", source_hash=source_hash, space_id=space.space_id)
                continue
            if not chunks:
                if page.indexed_hash == page.source_hash:
                    results[url] = SwitchResult("unchanged", source_hash=source_hash, space_id=space.space_id)
                    continue
                if (page.source_text or "").strip():
                    raise RuntimeError(f"no staged chunks of {url} for source {source_hash[:12]}")
            generations[page.page_id] = source_hash
            paid = prepaid.get(url, Prepaid())
            brought = paid.hashes & {c.embed_hash for c in chunks}
            reused = sum(c.token_count for c in chunks if c.embed_hash not in brought)
            changed = page.indexed_hash != page.source_hash
            crawled = (page.source_delivery_id or 0) > (page.applied_delivery_id or 0)
            marks.append((page.page_id, chunks[0].chunker_version if chunks else page.chunker_version,
                          crawled or changed, changed))
            if crawled and page.source_delivery_id is not None:
                applied.append((url, page.source_delivery_id))
            results[url] = SwitchResult(
                "switched", chunks_total=len(chunks), chunks_embedded=len(brought), tokens_embedded=paid.tokens,
                tokens_reused=reused, requests=paid.requests, truncated=paid.truncated, source_hash=source_hash,
                request_share=paid.request_share,
                space_id=space.space_id)
        live = chunk_store.swap_in_many(conn, generations, space)
        pages.mark_switched(conn, marks)
        deliveries.mark_embedded_many(conn, applied)
        deliveries.supersede_older_many(conn, applied)
        for url, result in results.items():
            if result.status == "switched":
                result = results[url] = replace(result, chunks_total=live[locked[url].page_id])
                ledger.append((url, result.chunks_total, result.chunks_embedded, result.tokens_embedded,
                               result.tokens_reused, result.requests))
        chunk_store.record_ledger(conn, space, run_id, ledger)
    return results


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
    pages.mark_switched(conn, [(pid, signature, crawled or changed, changed)])
    if crawled and locked.source_delivery_id is not None:
        deliveries.mark_embedded_many(conn, [(page_url, locked.source_delivery_id)])
        deliveries.supersede_older_many(conn, [(page_url, locked.source_delivery_id)])
    chunk_store.record_ledger(conn, space, run_id, [
        (page_url, live, chunks_embedded, tokens_embedded, tokens_reused, requests)])
    return SwitchResult(
        "switched", chunks_total=live, chunks_embedded=chunks_embedded, tokens_embedded=tokens_embedded,
        tokens_reused=tokens_reused, requests=requests, truncated=truncated, source_hash=page.source_hash,
        space_id=space.space_id, request_share=requests,
    )
