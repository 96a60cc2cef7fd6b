"""The embedding the pages of a slice share: every text the active space lacks, sent in one
embedder call (it cuts full requests) from a thread of its own while the caller goes on. That
thread caches the vectors the moment they are paid for, on a connection of its own (the caller's
may be in a transaction then): a run killed before its switch has not paid for nothing. If that
connection cannot be had, the caller's caches them when it takes the answer. Then each page is
charged its share of the bill.

Nothing here records a page's failure: `batch_apply` does, from what `send` raises (nothing was
sent) and what `receive` raises (the call failed as a whole, or its vectors could not be cached)
or reports (inputs refused)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.core.batch_sizing import apportion
from rag_pipeline.embedders.base import EmbedResult, Embedder, PartialEmbeddingError, PoisonedInputError
from rag_pipeline.ingest import first_space, indexing
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import db, spaces

log = logging.getLogger(__name__)

@dataclass
class Sent:
    """A call under way, and what is known before it answers."""

    missing: list[chunk_store.StagedChunk] = field(default_factory=list)
    first_page: dict[bytes, str] = field(default_factory=dict)   # who pays for each text
    space: spaces.Space | None = None
    answer: Future | None = None
    uncached: list[tuple[bytes, list[float], int]] = field(default_factory=list)   # the thread could not cache


@dataclass
class Received:
    prepaid: dict[str, indexing.Prepaid] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)   # page URL → why an input of its was refused


def send(conn: psycopg.Connection, staged: Mapping[str, Sequence[chunk_store.StagedChunk]],
         embedder_for: indexing.EmbedderFor, active) -> Sent:
    """Send what the pages' chunks (page URL → staged chunks) lack, without waiting; raises if
    nothing could be sent (the embedder, the space or the cache)."""
    # The thread's cache write needs the space row committed, so no transaction may hold it.
    db.require_autocommit(conn, "sending a slice's embedding call")
    sent = Sent()
    texts: dict[bytes, chunk_store.StagedChunk] = {}
    for url, chunks in staged.items():
        for chunk in chunks:
            texts.setdefault(chunk.embed_hash, chunk)
            sent.first_page.setdefault(chunk.embed_hash, url)
    if not texts:
        return sent
    embedder = embedder_for(active)
    sent.space = spaces.ensure_active(conn, embedder.model, embedder.dimensions,
                                      lambda: first_space.with_index(conn))
    cached = chunk_store.cached_hashes(conn, sent.space, list(texts))
    sent.missing = [c for h, c in texts.items() if h not in cached]
    if sent.missing:
        sent.answer = _in_background(_embed_and_cache, embedder, sent, db.opener(conn))
    return sent


def _embed_and_cache(embedder: Embedder, sent: Sent, connect: Callable[[], psycopg.Connection]) -> EmbedResult:
    """The call, and its vectors cached (also what a call that failed part-way did pay for)."""
    missing, failed = sent.missing, None
    try:
        result = embedder.embed([c.embed_text for c in missing], [c.token_count for c in missing])
        paid = dict(enumerate(result.vectors))
    except PartialEmbeddingError as exc:
        failed, paid = exc, exc.good_vectors()
    rows = [(missing[i].embed_hash, v, missing[i].token_count) for i, v in paid.items()]
    if rows:
        try:
            with connect() as conn, conn.transaction():
                chunk_store.cache_vectors(conn, sent.space, rows)
        except psycopg.Error as exc:   # no connection to spare (max_connections, a pooler's limit)
            log.warning("%d vector(s) paid for not cached from the embedding thread (%s): the batch's own"
                        " connection caches them", len(rows), exc)
            sent.uncached = rows
    if failed is not None:
        raise failed
    return result


def receive(conn: psycopg.Connection, sent: Sent, staged: Mapping[str, Sequence[chunk_store.StagedChunk]]
            ) -> Received:
    """Wait for the answer, its vectors cached; raises if the call failed as a whole (what it did
    pay for is cached too) or its vectors could not be cached."""
    received = Received()
    if sent.answer is None:
        return received
    missing = sent.missing
    try:
        spent, bad = sent.answer.result(), {}
    except PoisonedInputError as exc:
        spent = exc
        bad = {missing[i].embed_hash: exc.reasons.get(i, exc.reason) for i in exc.indices}
    finally:
        if sent.uncached:   # set before the answer resolved
            with conn.transaction():
                chunk_store.cache_vectors(conn, sent.space, sent.uncached)
    for url, chunks in staged.items():
        reasons = sorted({bad[c.embed_hash] for c in chunks if c.embed_hash in bad})
        if reasons:
            received.refused[url] = reasons[0]
    # Each text's cost goes to the first page that needed it, so the ledger adds up to the bill.
    embedded = [c for c in missing if c.embed_hash not in bad]
    if not embedded:
        return received   # every input refused: no page to charge (the requests that refused them bill nothing)
    owners = [sent.first_page[c.embed_hash] for c in embedded]
    weights = [c.token_count for c in embedded]
    tokens = apportion(spent.tokens, weights)
    requests = apportion(spent.requests, weights)
    truncated = apportion(getattr(spent, "truncated", 0), weights)
    # The ledger takes whole requests (they add up to the bill); the page's own figure is its share.
    total_weight = sum(weights) or 1
    prepaid = received.prepaid
    for owner, chunk, t, r, tr, w in zip(owners, embedded, tokens, requests, truncated, weights):
        share = prepaid.get(owner, indexing.Prepaid())
        prepaid[owner] = indexing.Prepaid(share.hashes | {chunk.embed_hash}, share.tokens + t,
                                          share.requests + r, share.truncated + tr,
                                          share.request_share + spent.requests * w / total_weight)
    return received


def _in_background(call, *args) -> Future:
    """`call(*args)` in a daemon thread: a run that is cancelled or dies while the API is slow (or
    the embedder waits out a retry) exits at once, rather than when the call returns."""
    answer: Future = Future()

    def run() -> None:
        answer.set_running_or_notify_cancel()
        try:
            answer.set_result(call(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, raised there
            answer.set_exception(exc)

    threading.Thread(target=run, name="embedding", daemon=True).start()
    return answer
