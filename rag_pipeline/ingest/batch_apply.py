"""A batch of changed pages applied in one pass, each page as a page run applies it.

A Dagster run costs seconds and a page milliseconds, so one run applies many pages; and a statement
costs more than a page's share of a set statement, so each step takes the whole batch at once
(`indexing.take_newest_deliveries`, `stage_many`, `switch_many`: one switch transaction for all the
pages of a slice, each page still switched once). A step that fails as a whole is done again page
by page, so one page's failure is recorded on its own delivery (retried later or not, by
`failures.classify`) without stopping or rolling back the others. The embedding is shared too: the
texts every page of a slice needs are sent together, in full requests, and a poisoned input fails
only the pages that contain it.

After the sources, a batch goes slice by slice (`batch_sizing.slices`: about one full request of
text each), and a slice is chunked and staged while the one before it is being embedded, in a
thread that waits on the embedding API. Each slice is switched in its own transaction once its
vectors are cached, before the next slice's texts are looked up, so a text two slices share is
embedded once.

`apply_batch` yields what happened step by step, so the caller (the Dagster op, or the plain loop
of the throughput benchmark) reports each page as soon as it is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.core.chunk_budget import ChunkBudget
from rag_pipeline.core.batch_sizing import CHARS_PER_TOKEN, SLICE_PAGES, SLICE_TOKENS, WorkItem, slices
from rag_pipeline.core.urls import page_id
from rag_pipeline.crawl import template_learning
from rag_pipeline.ingest import indexing, shared_embedding
# The events and the retry policy, named through this module by its callers too.
from rag_pipeline.ingest.batch_events import Event, Failed, RetryPolicy, Skipped, Sourced, Staged, Switched
from rag_pipeline.ingest.failures import PageFailure, classify
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import db, deliveries, pages, spaces

__all__ = ["PAGE_LOCK_CLASS", "Event", "Failed", "RetryPolicy", "Skipped", "Sourced", "Staged", "Switched",
           "apply_batch", "apply_range", "stage_pages", "switch_pages", "take_sources"]

log = logging.getLogger(__name__)

# Namespace of the per-page advisory locks (any constant unlike the other advisory keys).
PAGE_LOCK_CLASS = 0x5241_4703


@dataclass
class _Page:
    item: WorkItem
    source: indexing.SourceResult | None = None
    staged: list[chunk_store.StagedChunk] | None = None
    stage_hash: str | None = None      # the source hash `staged` was cut from
    failed: bool = False


def apply_batch(conn: psycopg.Connection, items: Sequence[WorkItem], *, batch_key: str | None,
                embedder_for: indexing.EmbedderFor, chunk_budget, max_page_bytes: int,
                retry: RetryPolicy, run_id: str | None = None, rechunk: bool = False) -> Iterator[Event]:
    """Apply the newest queued delivery of each page in `items` (`rechunk`: re-cut each page's
    stored text with the current chunker instead; no delivery, no crawl).

    ``batch_key`` names the lease the sensor took on these pages (None: no lease, a batch started
    by hand); a page whose lease another batch holds now is skipped. ``chunk_budget(space)`` gives
    (max, overlap) tokens for the active space. The per-page advisory locks are released on return.

    Each step handles a whole slice (the sources: the whole batch) in a few statements; when a step
    fails as a whole, it is done again page by page, so that only the page at fault fails.
    """
    db.require_autocommit(conn, "a batch")   # its steps commit as they go, and a thread writes beside it
    try:
        work: list[_Page] = []
        for page in _lock_pages(conn, items, batch_key):
            if isinstance(page, Skipped):
                yield page
            else:
                work.append(page)
        active = spaces.active(conn)
        budget = ChunkBudget(*chunk_budget(active))
        if not rechunk:
            yield from _take_sources(conn, work, max_page_bytes, retry)
            _learn_young_sites(conn, [p.item.page_url for p in work if not p.failed])
        switched = yield from _cut_and_switch(conn, work, budget, embedder_for, active, run_id, retry)
        # A re-chunk has no delivery to count failed tries on: its page keeps the lease until it runs
        # out (BATCH_LEASE_S), which spaces out the retries of a page that keeps failing.
        _release(conn, switched + ([] if rechunk else [p.item.page_url for p in work if p.failed]), batch_key)
    finally:
        _unlock_all(conn)


def _cut_and_switch(conn, work: list[_Page], budget: ChunkBudget, embedder_for, active, run_id,
                    retry) -> Iterator[Event]:
    """Slice by slice, each slice cut while the one before it is embedded; returns the pages switched.
    Stopped part-way (an error, a closed generator, the run cancelled), an embedding call still under
    way is not waited for (its thread is a daemon, and never touches `conn`); it caches what it paid
    for on a connection of its own, if the process lives that long."""
    ahead: _Embedding | None = None
    switched = []
    # Slice k+1 is cut while slice k is embedded in a thread: the chunker and the API overlap.
    halted: PageFailure | None = None   # for the pages of the slices after a failed call
    for part in slices([p for p in work if not p.failed], _tokens_of, SLICE_TOKENS, SLICE_PAGES):
        if halted is None:
            yield from _stage_all(conn, part, budget, retry)
        if ahead is not None:
            yield from _switch_slice(conn, ahead, embedder_for, run_id, retry, switched)
            if ahead.halted is not None:   # never sent, so tried again whatever failed that call
                halted = PageFailure(f"not sent: an earlier slice's embedding call failed: "
                                     f"{ahead.halted.reason}", retryable=True)
            ahead = None
        if halted is not None:
            # The embedding call of a slice failed as a whole (the API away past the embedder's
            # retries): the pages left wait for their retry too, rather than each slice
            # spending the embedder's whole retry schedule on an API that is down.
            for page in part:
                if not page.failed:
                    yield _fail(conn, page, "embeddings", halted, retry)
            continue
        ahead = _embed_ahead(conn, [p for p in part if not p.failed], embedder_for, active, retry)
        yield from ahead.refused
    if ahead is not None:
        yield from _switch_slice(conn, ahead, embedder_for, run_id, retry, switched)
    return switched


def _learn_young_sites(conn, urls: list[str]) -> None:
    """A young site's template learned before its pages are cut (crawl/template_learning.py): never
    a reason to fail the batch, which cuts with the template it has."""
    if not urls:
        return
    try:
        template_learning.learn_young_sites(conn, urls)
    except Exception as exc:  # noqa: BLE001 - the batch goes on; the next one tries again
        log.warning("learning the templates of this batch's sites failed: %s", exc)


def _tokens_of(page: _Page) -> int:
    """A slice's size: the page's text as sourced, or the sensor's estimate (a re-chunk)."""
    return -(-page.source.chars // CHARS_PER_TOKEN) if page.source else page.item.tokens


def _lock_pages(conn, items, batch_key) -> Iterator[_Page | Skipped]:
    """Each page under a session advisory lock for the whole batch: two batches never work on one
    page at once, whatever run concurrency is set (the page row lock orders the writes anyway)."""
    urls = [i.page_url for i in items]
    held = pages.leased_to(conn, urls, batch_key) if batch_key else None
    got = pages.try_lock_many(conn, PAGE_LOCK_CLASS, [u for u in urls if held is None or u in held])
    busy = []
    for item in items:
        if held is not None and item.page_url not in held:
            yield Skipped(item.page_url, "its lease ended and another batch may hold the page")
        elif item.page_url not in got:
            # A run whose lease ran out still works on it: hand the page back for a later batch.
            busy.append(item.page_url)
            yield Skipped(item.page_url, "another run is applying this page")
        else:
            yield _Page(item)
    _release(conn, busy, batch_key)


def _unlock_all(conn) -> None:
    try:
        pages.unlock_all(conn)
    except psycopg.Error as exc:  # a broken connection holds no locks any more
        log.warning("could not release page locks: %s", exc)


def _release(conn, page_urls: list[str], batch_key: str | None) -> None:
    if batch_key is None or not page_urls:
        return
    with conn.transaction():
        pages.release_many(conn, page_urls, batch_key)


def _take_sources(conn, work: list[_Page], max_page_bytes, retry) -> Iterator[Sourced | Failed]:
    """The `pages` step for the batch: in one transaction, or page by page if that fails."""
    if not work:
        return
    try:
        results = indexing.take_newest_deliveries(conn, [p.item.page_url for p in work], max_page_bytes)
    except Exception as exc:  # noqa: BLE001 - done again page by page: only the page at fault fails
        log.warning("taking %d sources at once failed (%s): page by page", len(work), exc)
        for page in work:
            yield from _take_source(conn, page, max_page_bytes, retry)
        return
    for page in work:
        result = results[page.item.page_url]
        if isinstance(result, Exception):
            yield _fail(conn, page, "pages", classify(result), retry)
        else:
            page.source = result
            yield Sourced(page.item.page_url, result)


def _stage_all(conn, work: list[_Page], budget: ChunkBudget, retry) -> Iterator[Staged | Failed]:
    """The `chunks` step for the batch: in one transaction, or page by page if that fails."""
    if not work:
        return
    try:
        results = indexing.stage_many(conn, [p.item.page_url for p in work], *budget)
    except Exception as exc:  # noqa: BLE001
        log.warning("staging %d pages at once failed (%s): page by page", len(work), exc)
        for page in work:
            yield from _stage(conn, page, budget, retry)
        return
    for page in work:
        result = results[page.item.page_url]
        if isinstance(result, Exception):
            yield _fail(conn, page, "chunks", classify(result), retry)
            continue
        staged, page.staged = result
        page.stage_hash = staged.source_hash
        yield Staged(page.item.page_url, staged, budget)


def take_sources(conn: psycopg.Connection, urls: Sequence[str], max_page_bytes: int,
                 retry: RetryPolicy) -> Iterator[Sourced | Failed]:
    """The `pages` step of a run over many partitions (a UI backfill): each page's newest queued
    delivery made its source, a page's failure recorded on its delivery and the others going on."""
    yield from _take_sources(conn, [_Page(WorkItem(url, None, 0)) for url in urls], max_page_bytes, retry)


def apply_range(conn: psycopg.Connection, urls: Sequence[str], *, lease_key: str, embedder_for: indexing.EmbedderFor,
                chunk_budget, retry: RetryPolicy, run_id: str | None = None) -> Iterator[Event]:
    """The `chunks` and `embeddings` steps of a run over many partitions, as a batch takes them: each
    page's stored text cut anew and switched in, slice by slice, a slice cut while the one before it
    is embedded. ``lease_key`` is the run's lease on the pages (range_runs.py); a page's failure is
    recorded on the delivery its source came from, if that crawl is not applied yet."""
    db.require_autocommit(conn, "a range")
    try:
        pending = _pending_many(conn, urls)
        work: list[_Page] = []
        for page in _lock_pages(conn, [pending[url].item for url in urls], lease_key):
            if isinstance(page, Skipped):
                yield page
            else:
                work.append(pending[page.item.page_url])
        active = spaces.active(conn)
        yield from _cut_and_switch(conn, work, ChunkBudget(*chunk_budget(active)), embedder_for, active, run_id, retry)
    finally:
        _unlock_all(conn)


def stage_pages(conn: psycopg.Connection, urls: Sequence[str], chunk_budget, retry: RetryPolicy) -> Iterator[Event]:
    """The `chunks` step alone over many partitions: each page's stored text cut anew."""
    yield from _stage_all(conn, list(_pending_many(conn, urls).values()), ChunkBudget(*chunk_budget(spaces.active(conn))), retry)


def switch_pages(conn: psycopg.Connection, urls: Sequence[str], embedder_for: indexing.EmbedderFor,
                 run_id: str | None, retry: RetryPolicy) -> Iterator[Switched | Failed]:
    """A range's `embeddings` step: what its staged chunks lack embedded together, each page switched alone."""
    work = list(_pending_many(conn, urls).values())
    staged = chunk_store.staged_many(conn, [(page_id(p.item.page_url), p.stage_hash) for p in work if p.stage_hash])
    for page in work:
        page.staged = staged.get(page_id(page.item.page_url), [])
    yield from _embed_and_switch(conn, work, embedder_for, spaces.active(conn), run_id, retry)


def _pending_many(conn, urls: Sequence[str]) -> dict[str, _Page]:
    """Each page as a later step of its run finds it: its source hash, and the delivery its source
    came from while that crawl is not applied yet (a failure is recorded there; none: a re-chunk)."""
    rows = pages.get_many(conn, urls)
    found = {}
    for url in urls:
        page = rows.get(url)
        chars = len(page.source_text or "") if page else 0
        found[url] = _Page(WorkItem(url, None, 0, chars), stage_hash=page.source_hash if page else None)
        if page and page.source_delivery_id and page.source_delivery_id > (page.applied_delivery_id or 0):
            found[url].source = indexing.SourceResult("updated", page.source_hash, page.source_delivery_id, chars, 0)
    return found


def _take_source(conn, page: _Page, max_page_bytes, retry) -> Iterator[Sourced | Failed]:
    url = page.item.page_url
    try:
        page.source = indexing.take_newest_delivery(conn, url, max_page_bytes)
    except Exception as exc:  # noqa: BLE001 - one page's failure is recorded, the batch goes on
        yield _fail(conn, page, "pages", classify(exc), retry)
        return
    yield Sourced(url, page.source)


def _stage(conn, page: _Page, budget: ChunkBudget, retry) -> Iterator[Staged | Failed]:
    url = page.item.page_url
    try:
        staged = indexing.stage_chunks(conn, url, *budget)
        page.staged = (chunk_store.staged(conn, page_id(url), staged.source_hash)
                       if staged.source_hash else [])
        page.stage_hash = staged.source_hash
    except Exception as exc:  # noqa: BLE001
        yield _fail(conn, page, "chunks", classify(exc), retry)
        return
    yield Staged(url, staged, budget)


def _embed_and_switch(conn, live: list[_Page], embedder_for, active, run_id, retry) -> Iterator[Switched | Failed]:
    """Embed what the pages lack, then switch them (the `embeddings` step of a backfill run)."""
    order = _embed_ahead(conn, live, embedder_for, active, retry)
    yield from order.refused
    yield from _switch_slice(conn, order, embedder_for, run_id, retry, [])


@dataclass
class _Embedding:
    """A slice's pages, and the embedding call they share (`shared_embedding`)."""

    pages: list[_Page]
    sent: shared_embedding.Sent | None = None
    refused: list[Failed] = field(default_factory=list)   # failed before any request (the space, the cache)
    halted: PageFailure | None = None   # the call failed as a whole: why
    staged: dict[str, list[chunk_store.StagedChunk]] = field(init=False)

    def __post_init__(self) -> None:
        self.staged = {p.item.page_url: p.staged or [] for p in self.pages}


def _embed_ahead(conn, live: list[_Page], embedder_for, active, retry) -> _Embedding:
    """Send what the pages lack without waiting for the answer; `_switch_slice` takes it."""
    order = _Embedding(live)
    try:
        order.sent = shared_embedding.send(conn, order.staged, embedder_for, active)
    except Exception as exc:  # noqa: BLE001 - the embedder or the database away: every page waits for a retry
        failure = classify(exc)
        order.refused = [_fail(conn, page, "embeddings", failure, retry) for page in live]
    return order


def _switch_slice(conn, order: _Embedding, embedder_for, run_id, retry, switched: list[str]) -> Iterator[Switched | Failed]:
    prepaid, failures = yield from _embedded(conn, order, retry)
    todo = [p for p in order.pages if not p.failed and p.item.page_url not in failures]
    if not todo:
        return
    try:
        results = indexing.switch_many(
            conn, {p.item.page_url: (p.stage_hash, p.staged or []) for p in todo}, embedder_for, run_id, prepaid)
    except Exception as exc:  # noqa: BLE001 - done again page by page: only the page at fault fails
        if not isinstance(exc, indexing.OneByOne):
            log.warning("switching %d pages at once failed (%s): page by page", len(todo), exc)
        for page in todo:
            event = _switch(conn, page, embedder_for, prepaid.get(page.item.page_url, indexing.Prepaid()),
                            run_id, retry)
            if isinstance(event, Switched):
                switched.append(event.page_url)
            yield event
        return
    for page in todo:
        switched.append(page.item.page_url)
        yield Switched(page.item.page_url, results[page.item.page_url])


def _embedded(conn, order: _Embedding, retry):
    """The slice's answer, cached; each page's prepaid share, and the pages that failed here."""
    failures: set[str] = set()
    if order.sent is None:
        return {}, failures
    try:
        received = shared_embedding.receive(conn, order.sent, order.staged)
    except Exception as exc:  # noqa: BLE001 - the API or the database away: every page waits for a retry
        failure = order.halted = classify(exc)
        for page in order.pages:
            failures.add(page.item.page_url)
            yield _fail(conn, page, "embeddings", failure, retry)
        return {}, failures
    for page in order.pages:
        reason = received.refused.get(page.item.page_url)
        if reason is not None:
            failures.add(page.item.page_url)
            yield _fail(conn, page, "embeddings", PageFailure(
                f"the embedding server refused a chunk of this page: {reason}", retryable=False), retry)
    return received.prepaid, failures


def _switch(conn, page: _Page, embedder_for, prepaid: indexing.Prepaid, run_id, retry) -> Event:
    url = page.item.page_url
    try:
        result = indexing.embed_and_switch(conn, url, embedder_for, run_id, prepaid)
        return Switched(url, result)
    except Exception as exc:  # noqa: BLE001
        page.failed = True
        return _fail(conn, page, "embeddings", classify(exc), retry)


def _fail(conn, page: _Page, step: str, failure: PageFailure, retry: RetryPolicy) -> Failed:
    """Record the failure on the delivery the page was applying, and schedule its retry."""
    page.failed = True
    if not page.item.delivery_id and not (page.source and page.source.delivery_id):
        log.warning("%s: %s failed: %s", page.item.page_url, step, failure.reason)
        return Failed(page.item.page_url, step, failure, None)   # a re-chunk: no delivery to record on
    delivery_id = page.source.delivery_id if page.source and page.source.delivery_id else page.item.delivery_id
    attempts = page.item.attempts if delivery_id == page.item.delivery_id else deliveries.attempts_of(conn, delivery_id)
    try:
        with conn.transaction():
            deliveries.record_run_failure(conn, delivery_id, attempts, f"{step}: {failure.reason}",
                                          retryable=failure.retryable, max_attempts=retry.max_attempts,
                                          backoff_s=retry.backoff_s, max_backoff_s=retry.max_backoff_s)
    except psycopg.Error as exc:
        # The database itself is away: the lease runs out and the page is batched again.
        log.warning("%s: could not record its failure (%s)", page.item.page_url, exc)
    return Failed(page.item.page_url, step, failure, delivery_id)
