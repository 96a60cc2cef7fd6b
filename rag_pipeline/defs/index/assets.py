"""The index of a page, as three assets on a partition set of pages (key: normalized URL): the
catch-all's `pages`, `chunks`, `embeddings` here, and each declared site's (or site shard's), keys
prefixed by it, built by the same `page_assets` from the site component.

Materialized by hand from the UI (one page, or a backfill in ranges of up to RANGE_PAGES pages a
run; one page's failure leaves the others done). `chunks` and `embeddings` are one op (either may be
selected alone): a range run cuts and embeds as a batch run does, a slice cut while the one before
it is embedded, where two steps would cut the whole range before embedding any of it. Delivery
batches report these assets' partitions from `index_batch` (batch_apply.py) with the same metadata.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import dagster as dg

from rag_pipeline import compat
from rag_pipeline.core.chunking import CHUNKER_VERSION, chunker_signature
from rag_pipeline.defs.index import range_runs, set_checks
from rag_pipeline.defs.index.events import EventWriter
from rag_pipeline.defs.index.metadata import chunk_metadata, failure_metadata, source_metadata, switch_metadata
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.ingest import batch_apply
from rag_pipeline.ingest.batch_apply import Failed, RetryPolicy, Skipped, Staged, Switched
from rag_pipeline.ingest.failures import classify
from rag_pipeline.settings import SettingsError, load_settings
from rag_pipeline.store import spaces

# The pool of every op that calls the embedding model (deploy/dagster.yaml sets its limit).
EMBEDDING_POOL = "embedding_api"

GROUP = "index"
# The assets' keys, for the modules that select or report them: the definitions themselves are
# only `defs`' below (the loader would take an imported copy for a second asset).
PAGES, CHUNKS, EMBEDDINGS = dg.AssetKey("pages"), dg.AssetKey("chunks"), dg.AssetKey("embeddings")
# The whole index (index_asset.py): the index-wide checks live on it, not on the catch-all's assets.
INDEX = dg.AssetKey("index")


# A backfill from the UI (or a launched partition range) runs up to this many pages a run, as
# contiguous ranges of the `pages` partitions, not a run a page. Dagster cuts runs by this policy
# at definition time, so it is a constant here: BATCH_MAX_PAGES's default, so that a range pays a
# run's fixed cost (a worker's start, ~8 s on 2 cores, and its events) over as many pages as a batch.
RANGE_PAGES = 2000
ranged_backfill = dg.BackfillPolicy.multi_run(max_partitions_per_run=RANGE_PAGES)


@contextmanager
def _failures_a_retry_cannot_fix() -> Iterator[None]:
    """A failure of the whole step that a later run would meet again fails it without a retry."""
    try:
        yield
    except Exception as exc:
        failure = classify(exc)
        if failure.retryable:
            raise
        raise dg.Failure(description=failure.reason, allow_retries=False) from exc


def pages_failed(failed: list[Failed], total: int, switched: int) -> dg.Failure:
    """The red run of pages that failed among others that went on: each named, with its reason."""
    shown = "; ".join(f"{f.page_url}: {f.failure.reason[:200]}" for f in failed[:5])
    more = f" (+{len(failed) - 5} more)" if len(failed) > 5 else ""
    return dg.Failure(
        description=f"{len(failed)} of {total} page(s) failed, the others went on: {shown}{more}",
        metadata={"pages_failed": len(failed), "pages_done": switched},
        # A retry (the rechunk job's policy) helps only when some page failed for a passing reason.
        allow_retries=any(f.failure.retryable for f in failed),
    )


def _collect(events, describe) -> tuple[dict[str, dict], list[Failed]]:
    """A step's events, page by page: the metadata of each page done (`describe`), and the failures."""
    done: dict[str, dict] = {}
    failed: list[Failed] = []
    for event in events:
        if isinstance(event, Failed):
            failed.append(event)
        else:
            done[event.page_url] = describe(event)
    return done, failed


@dataclass
class Outcome:
    """One asset's pages in a run: done (with their metadata), failed, or left (why)."""

    key: dg.AssetKey
    done: dict[str, dict] = field(default_factory=dict)
    failed: list[Failed] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def reported(self) -> dict[str, dict]:
        return {**{url: range_runs.skipped_metadata(why) for url, why in self.skipped.items()}, **self.done}


def _results(context: dg.AssetExecutionContext, outcomes: list[Outcome]) -> list[dg.MaterializeResult]:
    """Each page of each asset on its own partition, with its own metadata. When some failed, the
    run fails (the other pages are done and recorded as materialized, the failed ones observed with
    `status: failed`), so a partition never shows a materialization of work that failed. A page the
    run left to another batch says so (`skipped`: range_runs.py)."""
    failed = [f for outcome in outcomes for f in outcome.failed]
    if not failed:
        for outcome in outcomes:   # one call for the range, not one a page
            compat.add_partitions_metadata(context, outcome.reported(), outcome.key)
        return [dg.MaterializeResult(asset_key=outcome.key) for outcome in outcomes]
    writer = EventWriter(context.op_execution_context)
    for outcome in outcomes:
        for url, metadata in outcome.reported().items():
            writer.add(dg.AssetMaterialization(asset_key=outcome.key, partition=url, metadata=metadata))
        for event in outcome.failed:
            context.log.warning(f"{event.page_url}: {event.step} failed: {event.failure.reason}")
            writer.add(dg.AssetObservation(asset_key=outcome.key, partition=event.page_url,
                                           metadata=failure_metadata(event)))
    writer.flush()
    pages = {f.page_url for f in failed}
    raise pages_failed(failed, len(pages | {u for o in outcomes for u in o.done}), len(outcomes[-1].done))


PAGES_MEANS = ("The newest crawled content of each page, normalized: the source every chunk is cut from. Kept in "
               "full so that a new chunker re-cuts pages without recrawling them. Its check: pages_match_their_source.")
CHUNKS_MEANS = ("Each page cut into passages at headings and paragraph breaks, each small enough to embed; staged as a "
                "new generation, which search sees only once `embeddings` swaps it in. Its check: "
                "no_chunk_of_a_tombstoned_page.")
EMBEDDINGS_MEANS = ("What search sees of each page: its chunks with a vector each in the active embedding space. Only "
                    "text never embedded before is sent to the model; a page switches in one transaction. Its check: "
                    "every_chunk_in_the_active_space.")


#: What a partition key is, and where the address that opens is.
KEYS = ("A partition is a page: its key is the page's identity, the normalized URL spelled https:// whatever "
        "scheme serves it, so that a site moving from http to https keeps its pages and their history; each "
        "crawl's `crawled_url` is the address as served, the one that opens.")


def _described(means: str) -> str:
    return f"{means} {KEYS} {set_checks.INDEX_WIDE}"


def page_assets(prefix: list[str], partitions_def: dg.DynamicPartitionsDefinition, group: str, *,
                embedder_kind: str, upstream: dg.AssetKey | None = None) -> list[dg.AssetsDefinition]:
    """`pages` → `chunks` → `embeddings` of one partition set: the catch-all's (no prefix, today's
    keys), or a site's or a site shard's (keys prefixed by it, `upstream` its discovery asset). Each
    asset's description names its own check and where the index-wide ones are (set_checks.py)."""
    page_set = set_checks.set_of_prefix(prefix)

    @dg.asset(
        key_prefix=prefix,
        name="pages",
        description=_described(PAGES_MEANS),
        partitions_def=partitions_def,
        group_name=group,
        backfill_policy=ranged_backfill,
        kinds={"postgres"},
        deps=[upstream] if upstream is not None else None,
    )
    def pages(context: dg.AssetExecutionContext, postgres: PostgresResource,
              settings: SettingsResource) -> dg.MaterializeResult:
        current = settings.get()
        outcome = Outcome(context.asset_key)
        with postgres.connect() as conn, _failures_a_retry_cannot_fix():
            outcome.done, outcome.failed = _collect(
                batch_apply.take_sources(conn, context.partition_keys, current.webhook_max_page_bytes,
                                         RetryPolicy.from_settings(current)),
                lambda event: source_metadata(event.result))
            set_checks.log_evaluations(context.op_execution_context, conn, current, [page_set], ["pages"])
        return _results(context, [outcome])[0]

    chunks_key, embeddings_key = dg.AssetKey([*prefix, "chunks"]), dg.AssetKey([*prefix, "embeddings"])

    @dg.multi_asset(
        name="__".join([*prefix, "chunks_and_embeddings"]),
        specs=[
            dg.AssetSpec(chunks_key, description=_described(CHUNKS_MEANS), deps=[pages], group_name=group,
                         partitions_def=partitions_def, code_version=CHUNKER_VERSION, kinds={"postgres"},
                         skippable=True),
            dg.AssetSpec(embeddings_key, description=_described(EMBEDDINGS_MEANS), deps=[chunks_key],
                         group_name=group, partitions_def=partitions_def,
                         kinds={"postgres", "pgvector", embedder_kind}, skippable=True),
        ],
        can_subset=True,
        backfill_policy=ranged_backfill,
        pool=EMBEDDING_POOL,
        # No step retries: the embedder already retries blips (429/5xx, with backoff), and a page that
        # failed has its delivery tried again by delivery_sensor (RUN_RETRY_*), which outlasts an outage.
    )
    def chunks_and_embeddings(
        context: dg.AssetExecutionContext, postgres: PostgresResource, embedder: EmbedderResource,
        settings: SettingsResource,
    ):
        """Both in one step when both are selected (a backfill, a page run): a slice of pages is cut
        while the one before it is embedded, as in a batch run. Either alone works on its own."""
        selected = context.selected_asset_keys
        current = settings.get()
        retry = RetryPolicy.from_settings(current)
        run_id = context.run.run_id
        with postgres.connect() as conn, _failures_a_retry_cannot_fix():
            if chunks_key in selected:
                # Sized to the model the pages will be embedded with: the active space's.
                budget = embedder.chunk_budget(spaces.active(conn))
                lease = range_runs.take(conn, context.partition_keys, run_id, current.batch_lease_s,
                                        signature=chunker_signature(*budget))
                range_runs.note_rechunk(context.op_execution_context, conn, current, budget, lease.held)
            else:   # `embeddings` alone: the pages no batch holds, with chunks staged
                lease = range_runs.take(conn, context.partition_keys, run_id, current.batch_lease_s)
            chunks = Outcome(chunks_key, skipped=dict(lease.skipped))
            switched = Outcome(embeddings_key, skipped=dict(lease.skipped))
            seen: dict = {}
            try:
                if embeddings_key not in selected:
                    events = batch_apply.stage_pages(conn, lease.held, embedder.chunk_budget, retry)
                elif chunks_key not in selected:
                    events = batch_apply.switch_pages(conn, lease.held, embedder.for_space, run_id, retry)
                else:
                    events = batch_apply.apply_range(conn, lease.held, lease_key=lease.key, retry=retry, run_id=run_id,
                                                     embedder_for=embedder.for_space, chunk_budget=embedder.chunk_budget)
                for event in events:
                    if isinstance(event, Staged):
                        chunks.done[event.page_url] = chunk_metadata(event.result, event.budget)
                    elif isinstance(event, Switched):
                        switched.done[event.page_url] = switch_metadata(conn, event.result, embedder, seen, context.log)
                    elif isinstance(event, Failed):
                        (chunks if event.step == "chunks" else switched).failed.append(event)
                    elif isinstance(event, Skipped):
                        chunks.skipped[event.page_url] = switched.skipped[event.page_url] = event.reason
            finally:
                range_runs.release(conn, lease, lease.held)
            set_checks.log_evaluations(context.op_execution_context, conn, current, [page_set],
                                       [key.path[-1] for key in (chunks_key, embeddings_key) if key in selected])
        yield from _results(context, [o for o in (chunks, switched) if o.key in selected])

    return [pages, chunks_and_embeddings]


def _embedder_kind() -> str:
    from rag_pipeline.embedders.factory import provider_kind

    try:
        return provider_kind(load_settings())
    except SettingsError:   # a bad setting is reported where it is used, not by a failing code location
        return "embeddings"


def embedder_kind() -> str:
    """The configured embedder's kind, read when the code location loads (restart it after a
    change), never when a module is imported."""
    return _embedder_kind()


@dg.definitions
def defs() -> dg.Definitions:
    # The catch-all's assets: pages of no declared site, under the keys they always had.
    return dg.Definitions(assets=page_assets([], pages_partitions, GROUP, embedder_kind=embedder_kind()),
                          asset_checks=[set_checks.set_checks(None, None)])
