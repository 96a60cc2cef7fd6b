"""`index_batch`: one run applies many changed pages, and reports each on its own partition.

Why an op and not the assets themselves: a run can target one partition or a contiguous range of
them, never a set of scattered keys (a range over dynamic partitions covers every key between its
ends), and `MaterializeResult` has no partition. An op may report `AssetMaterialization`s of the
`pages`, `chunks` and `embeddings` assets for any partition: each is stored as a materialization of
that partition, with the batch run's id and the page's own metadata, as a page run would write it
(3 event rows a page instead of a run's ~22 and its process). The assets stay defined, so a single
page is still materialized by hand from the UI, and lineage stays pages → chunks → embeddings.
"""


import uuid
from collections import Counter
from contextlib import contextmanager
from typing import Optional

import dagster as dg

from rag_pipeline.core.batch_sizing import WorkItem, plan_batches
from rag_pipeline.defs.index import set_checks
from rag_pipeline.defs.index.assets import EMBEDDING_POOL, pages_failed
from rag_pipeline.defs.index.events import EventWriter
from rag_pipeline.defs.index.metadata import chunk_metadata, failure_metadata, source_metadata, switch_metadata
from rag_pipeline.defs.index.partitions import step_key
from rag_pipeline.defs.index.reconciler import BATCH_TAG, Heartbeat
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.ingest.batch_apply import Failed, RetryPolicy, Skipped, Sourced, Staged, Switched, apply_batch
from rag_pipeline.store import batch_leases
from rag_pipeline.store import pages as pages_store

PAGES_TAG = "rag/pages"
_pools_known: set[str] = set()


def ensure_pool_limit(instance: dg.DagsterInstance, pool: str = EMBEDDING_POOL) -> None:
    """Give the pool its row at the instance's default limit before any run of it is queued.
    With `granularity: run` the queue enforces the limit, and on its first pass over a new
    instance it reads the pools with limits before it makes that row: every queued run would be
    launched at once. Once per process: a no-op where the row exists."""
    storage = instance.event_log_storage
    if pool not in _pools_known and storage.supports_global_concurrency_limits:
        if pool not in storage.get_concurrency_keys():   # a limit set by hand is kept
            storage.initialize_concurrency_limit_to_default(pool)
        _pools_known.add(pool)


class BatchConfig(dg.Config):
    """The pages of one batch: the newest queued delivery of each, and its failed tries so far."""

    batch_key: Optional[str] = None  # the sensor's lease on these pages; unset for a batch started by hand
    page_urls: list[str]
    delivery_ids: list[int]
    attempts: list[int]
    # Re-cut the pages' stored text with the current chunker (rechunk_sensor) instead of applying
    # deliveries: no crawl, and only chunk texts never embedded are sent to the model.
    rechunk: bool = False

    def items(self) -> list[WorkItem]:
        if not len(self.page_urls) == len(self.delivery_ids) == len(self.attempts):
            raise dg.Failure("page_urls, delivery_ids and attempts must have one entry per page")
        return [WorkItem(u, d, a) for u, d, a in zip(self.page_urls, self.delivery_ids, self.attempts)]


def request_batches(conn, work: list[WorkItem], settings, *, rechunk: bool = False,
                    tags: Optional[dict] = None, spread: Optional[int] = None,
                    max_batches: Optional[int] = None) -> list[dg.RunRequest]:
    """Lease `work` to batches within BATCH_MAX_PAGES / BATCH_MAX_TOKENS (spread over at least
    `spread` batches, BATCH_SPREAD by default; at most `max_batches`, the rest left unleased) and
    request an `index_batch` run for each. A run_key per lease: a batch whose run was lost is
    requested again, under a new key, once the reconciler (or its lease running out) frees its pages."""
    requests = []
    batches = plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens, spread or settings.batch_spread)
    for batch in batches[:max_batches]:
        key = uuid.uuid4().hex[:16]
        with conn.transaction():
            leased = set(pages_store.lease(conn, [i.page_url for i in batch], key, settings.batch_lease_s))
            if leased:
                batch_leases.open_batch(conn, key)
        items = [i for i in batch if i.page_url in leased]
        if items:
            requests.append(dg.RunRequest(
                job_name="index_batch", run_key=f"{'rechunk' if rechunk else 'batch'}-{key}",
                run_config=batch_run_config(key, items, rechunk=rechunk),
                tags={BATCH_TAG: key, PAGES_TAG: str(len(items)), **(tags or {})}))
    return requests


def pages_of(request: dg.RunRequest) -> list[str]:
    """The pages an `index_batch` run request covers."""
    return list(request.run_config["ops"]["index_pages"]["config"]["page_urls"])


def batch_run_config(batch_key: str, items: list[WorkItem], *, rechunk: bool = False) -> dg.RunConfig:
    return dg.RunConfig(ops={"index_pages": BatchConfig(
        batch_key=batch_key, page_urls=[i.page_url for i in items],
        delivery_ids=[i.delivery_id for i in items], attempts=[i.attempts for i in items], rechunk=rechunk)})


@dg.op(
    out={},
    # At most `default_limit` batches embed at once (deploy/dagster.yaml): they share the API's rate.
    pool=EMBEDDING_POOL,
    tags={"kind": "postgres"},
)
def index_pages(context: dg.OpExecutionContext, config: BatchConfig, postgres: PostgresResource,
                embedder: EmbedderResource, settings: SettingsResource):
    """Apply each page's newest crawl as a page run would (source → chunks → vectors, one switch per
    page), the embedding requests shared across pages; a page's failure fails that page alone."""
    items = config.items()
    current = settings.get()
    counts: Counter = Counter()
    failed: list[Failed] = []
    noted: dict = {}   # the spaces seen in this run, and whether their note was logged
    writer = EventWriter(context)
    with postgres.connect() as conn, _beating(context, conn, postgres, config.batch_key, current):
        # Each page is reported on its own site's (or shard's) assets.
        located = pages_store.locations(conn, [i.page_url for i in items])
        events = apply_batch(
            conn, items, batch_key=config.batch_key, embedder_for=embedder.for_space,
            chunk_budget=embedder.chunk_budget, max_page_bytes=current.webhook_max_page_bytes,
            retry=RetryPolicy.from_settings(current), run_id=context.run_id, rechunk=config.rechunk,
        )
        try:
            for event in events:
                counts[type(event).__name__] += 1
                _report(context, conn, embedder, writer, event, failed, noted, located)
        finally:
            writer.flush()   # what was done is reported, also when the run dies of an error
        set_checks.log_evaluations(context, conn, current, located.values())
    switched = counts["Switched"]
    context.log.info(f"{len(items)} page(s): {switched} switched, {len(failed)} failed, "
                     f"{counts['Skipped']} skipped")
    if failed:
        # Each page's failure is recorded on its delivery (and retried, if a retry can help);
        # failing the run shows the batch red in the UI with the pages that need a look.
        raise pages_failed(failed, len(items), switched)


@contextmanager
def _beating(context, conn, postgres, batch_key: Optional[str], settings):
    """The batch's heartbeat while the op works (a batch started by hand has none); the batch is
    ended when the op finishes its pages, and left to the failure sensor or the reconciler when
    it raises."""
    if batch_key is None:
        yield
        return
    with conn.transaction():
        if not batch_leases.start(conn, batch_key, context.run_id):
            context.log.warning(f"batch {batch_key} was given up before this run started (its run looked "
                                "lost); its pages are skipped here and applied by a newer batch")
    with Heartbeat(postgres.url(), batch_key, settings.batch_heartbeat_s):
        yield
    with conn.transaction():
        batch_leases.end(conn, batch_key, "applied")


def _report(context, conn, embedder, writer: EventWriter, event, failed: list, noted: dict,
            located: dict) -> None:
    """One step of one page, as the UI shows it: a materialization on the page's partition, or an
    observation with `status: failed` on the asset whose step failed."""
    site, shard = located.get(event.page_url, (None, None))
    if isinstance(event, Sourced):
        writer.add(dg.AssetMaterialization(asset_key=step_key("pages", site, shard), partition=event.page_url,
                                           metadata=source_metadata(event.result)))
    elif isinstance(event, Staged):
        writer.add(dg.AssetMaterialization(
            asset_key=step_key("chunks", site, shard), partition=event.page_url,
            metadata=chunk_metadata(event.result, event.budget)))
    elif isinstance(event, Switched):
        writer.add(dg.AssetMaterialization(asset_key=step_key("embeddings", site, shard), partition=event.page_url,
                                           metadata=switch_metadata(conn, event.result, embedder, noted, context.log)))
    elif isinstance(event, Failed):
        failed.append(event)
        context.log.warning(f"{event.page_url}: {event.step} failed "
                            f"({'retried later' if event.failure.retryable else 'not retried'}): "
                            f"{event.failure.reason}")
        writer.add(dg.AssetObservation(asset_key=step_key(event.step, site, shard), partition=event.page_url,
                                       metadata=failure_metadata(event)))
    elif isinstance(event, Skipped):
        context.log.info(f"{event.page_url}: skipped, {event.reason}")


@dg.job(
    tags={"rag/kind": "batch"},
    description="Apply a batch of changed pages (requested by delivery_sensor): each page on its own "
                "partition of pages → chunks → embeddings, embedding requests shared across pages.",
)
def index_batch():
    index_pages()
