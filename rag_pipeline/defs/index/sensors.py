"""delivery_sensor: turns stored crawler deliveries into batch runs, only for real changes."""

import time

import dagster as dg

from rag_pipeline.components.site_component import declared_sites
from rag_pipeline.core.location_holds import Holds
from rag_pipeline.defs.index.batch_runs import ensure_pool_limit, index_batch, pages_of, request_batches
from rag_pipeline.defs.index.bulk_index import index_upkeep, space_index
from rag_pipeline.defs.index.events import write_runless
from rag_pipeline.defs.index.index_asset import index_snapshot_sensor_every
from rag_pipeline.defs.index.metadata import crawl_events
from rag_pipeline.defs.index.reconciler import BATCH_TAG, free_batch, reconcile
from rag_pipeline.core.site_spec import partition_set
from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import at_load, location_settings
from rag_pipeline.ingest.rules import boilerplate_rules
from rag_pipeline.store import deliveries, pages


# A tick's evaluation must end within the daemon's 60 s (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS), or
# its run requests are lost with it. Routing costs ~4-9 ms a delivery, so the default 4,000 take
# 16-36 s, and a burst regularly reaches this: routing stops starting chunks after it, leaves the
# rest for the next tick, and the work it routed still goes into runs now (12-32 s ticks at 100k).
ROUTE_BUDGET_S = 25.0


def delivery_sensor_every(interval_s: int) -> dg.SensorDefinition:
    """delivery_sensor, ticking every `interval_s` (DELIVERY_INTERVAL_S; Dagster fixes a sensor's
    interval when the code location loads)."""
    return dg.sensor(
        name="delivery_sensor",
        # The HNSW upkeep is `main`'s alone (LOCATION_HOLDS): a site's location has no space_index.
        jobs=[index_batch, space_index] if location_settings().holds().holds_main() else [index_batch],
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Routes new deliveries in receipt order: unchanged pages are stamped verified, 404/410 "
            "tombstoned, crawler failures skipped; the new or changed pages go into batch runs "
            "(BATCH_MAX_PAGES and BATCH_MAX_TOKENS each), every page on its own partition. Each tick "
            "first reconciles: a batch whose run ended unfinished, was never launched, or whose "
            "worker stopped beating gives its pages back to a new batch. Around a bulk load it drops "
            "the active space's HNSW index and requests its rebuild (`space_index`) once drained."
        ),
    )(delivery_sensor)


def delivery_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                    settings: SettingsResource) -> dg.SensorResult:
    current = settings.get()
    ensure_pool_limit(context.instance)
    with postgres.connect() as conn:
        routed = route_batch(conn, current.sensor_batch_size, current.webhook_max_page_bytes,
                             rules=boilerplate_rules(current.boilerplate_rules),
                             until=time.monotonic() + ROUTE_BUDGET_S,
                             allowed_networks=current.allowed_networks(),
                             accept_unsolicited=current.webhook_accept_unsolicited)
        # Batches whose run will never finish them give their pages back (a try counted), before
        # the retries due are claimed and the free pages leased to new batches, in this same tick.
        recovered = reconcile(context.instance, conn, current)
        retried = deliveries.claim_due_retries(conn, current.sensor_batch_size)
        # Every queued page no live batch holds, whether routed now, due for a retry, or freed by
        # the reconciler or an ended lease: nothing depends on one tick succeeding.
        # With sites spread over code locations (LOCATION_HOLDS), only this location's pages:
        # its runs execute beside its code server.
        holds = location_holds(current)
        work = deliveries.queued_work(conn, current.sensor_batch_size, holds)
        requests = request_batches(conn, work, current)
        # Around a bulk load: the HNSW index makes way while a large backlog is written (`main`'s
        # duty alone: the index is one for every location).
        rebuild, upkeep = index_upkeep(context.instance, conn, current) if holds.holds_main() else (None, None)
        urls = sorted({url for r in requests for url in pages_of(r)})
        settled_urls = {s.page_url for s in routed.settled} | set(routed.redirects)
        located = pages.locations(conn, [*urls, *settled_urls]) if urls or settled_urls else {}
    if upkeep:
        context.log.info(upkeep)
    if rebuild is not None:
        requests = [*requests, rebuild]
    if recovered["freed_batches"]:
        context.log.warning(f"reconciler: {recovered['freed_pages']} page(s) of {recovered['freed_batches']} "
                            f"batch(es) freed, {recovered['runs_failed']} run(s) whose worker was gone marked failed")
    told = crawl_events(routed, located)
    if told:
        # Every crawl that needed no run is told on its page's partition (a 404-only page too).
        add_partitions(context.instance, sorted({e.partition for e in told}), located)
        write_runless(context.instance, told)
    if not routed.routed and not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason("no new deliveries"))
    # Added here, in one upsert per partition set, before any run of them starts. (A
    # dynamic_partitions_request would have the daemon look each key up on its own connection
    # first: ~10 ms a key, 40 s for the 4,000 pages of one tick of an initial load.)
    add_partitions(context.instance, urls, located)
    budget = (f"; routing stopped at the tick's {ROUTE_BUDGET_S:g} s budget, the rest waits for the next tick"
              if routed.cut_short else "")
    context.log.info("routed %s; %d page(s) in %d batch run(s), %d retried%s",
                     dict(routed.outcomes), len(urls), len(requests), retried, budget)
    # A tick that settled every delivery without a run (a recrawl of unchanged pages) says what
    # it did in the tick list, not "Sensor function returned an empty result".
    settled = None if requests else dg.SkipReason(
        "routed " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(routed.outcomes.items()))
        + "; no page needs a run" + budget)
    return dg.SensorResult(run_requests=requests, skip_reason=settled)


def location_holds(settings) -> Holds:
    """What this location serves (LOCATION_HOLDS), with the declared sites, so that `main` also
    takes the pages of a site no longer declared (~13 ms a tick to read them; none with `all`)."""
    holds = settings.holds()
    if holds.everything:
        return holds
    return holds.with_declared({spec.name: spec.shards for spec, _ in declared_sites()})


def add_partitions(instance: dg.DagsterInstance, urls: list[str], located: dict) -> None:
    """Each page's partition, added to its site's (or shard's, or the catch-all's) set."""
    by_set: dict[str, list[str]] = {}
    for url in urls:
        by_set.setdefault(partition_set(*located.get(url, (None, None))), []).append(url)
    for name, keys in sorted(by_set.items()):
        instance.add_dynamic_partitions(name, keys)


@dg.run_failure_sensor(
    monitored_jobs=[index_batch],
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "A batch run that ended without finishing its pages (a crash, a database outage) frees "
        "them at once, counting a failed try for each; failures of single pages are recorded by "
        "the batch itself. If this sensor cannot run, delivery_sensor's reconciler does the same "
        "on its next tick, and also for runs whose worker died."
    ),
)
def delivery_failure_sensor(context: dg.RunFailureSensorContext, postgres: PostgresResource,
                            settings: SettingsResource) -> None:
    key = context.dagster_run.tags.get(BATCH_TAG)
    if key is None:
        return  # launched by hand from the launchpad: no lease of ours
    reason = context.failure_event.message or "run failed"
    with postgres.connect() as conn:
        freed = free_batch(conn, key, f"its run {context.dagster_run.run_id} failed: {reason}", settings.get())
    if freed:
        context.log.warning(f"batch {key}: {len(freed)} unfinished page(s) freed for a retry")


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(sensors=[delivery_sensor_every(at_load("delivery_interval_s")), delivery_failure_sensor,
                                   index_snapshot_sensor_every(at_load("index_snapshot_every_s"))])
