"""Crawler health as asset checks on `index`, the whole index: its freshness depends on the crawler."""

import dagster as dg

from rag_pipeline.crawl import crawler_health
from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.defs.resources import CrawlerResource, PostgresResource, SettingsResource
from rag_pipeline.store import pushes, schedule

_DESCRIPTIONS = {
    crawler_health.CRAWLER_NOT_PAUSED: "The crawler is not paused and its stats are readable.",
    crawler_health.CRAWLER_QUEUE_NOT_GROWING: "The crawler's waiting queue is below CRAWLER_WAITING_MAX and not growing.",
    crawler_health.PUSHES_DELIVERED: "Every push older than PUSH_DELIVERY_TIMEOUT_S has its delivery, and none was refused.",
    crawler_health.NO_PAGE_OVERDUE: "No live page is overdue past twice its recrawl_every (plus 10 min).",
}


def health_outcomes(postgres: PostgresResource, crawler: CrawlerResource, settings: SettingsResource,
                    waiting_history: list[int]) -> tuple[list[crawler_health.Outcome], int]:
    current = settings.get()
    client = crawler.get()
    state = client.health()
    with postgres.connect() as conn:
        undelivered = pushes.undelivered(conn, current.push_delivery_timeout_s)
        failed = pushes.failed_recently(conn, 3600)
        overdue = schedule.overdue(conn)
    outcomes = crawler_health.evaluate(
        client.name, state, undelivered, failed, waiting_history=waiting_history,
        waiting_max=current.crawler_waiting_max, delivery_timeout_s=current.push_delivery_timeout_s,
        overdue=overdue,
    )
    return outcomes, state.waiting


def _fields(outcome: crawler_health.Outcome) -> dict:
    """What the sensor's evaluation and the check's result both carry."""
    return {"asset_key": INDEX, "check_name": outcome.check_name, "passed": outcome.passed,
            "severity": dg.AssetCheckSeverity.WARN if outcome.warn else dg.AssetCheckSeverity.ERROR,
            "description": outcome.description,
            "metadata": {"description": outcome.description, **outcome.metadata}}


def to_evaluation(outcome: crawler_health.Outcome) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(**_fields(outcome))


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset=INDEX, description=_DESCRIPTIONS[name]) for name in crawler_health.CHECK_NAMES],
    description="Crawler health (also recorded every minute by crawler_health_sensor).",
)
def crawler_health_checks(postgres: PostgresResource, crawler: CrawlerResource, settings: SettingsResource):
    outcomes, _ = health_outcomes(postgres, crawler, settings, [])
    for o in outcomes:
        yield dg.AssetCheckResult(**_fields(o))
