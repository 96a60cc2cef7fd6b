"""What gets pushed to the crawler, as runs: the recrawl sensor's batches, seeds, recrawl-now.

The ops output Nothing: their results live in the pushes table and the run's metadata, and no
IO manager is involved."""

from datetime import datetime, timedelta

import dagster as dg

from rag_pipeline.crawl import adaptive
from rag_pipeline.crawl.cadence_rules import glob_to_like, load_rules, parse_seeds
from rag_pipeline.crawl.site_cadences import load_site_rules
from rag_pipeline.crawl.pushing import push_by_site, register_seeds
from rag_pipeline.defs.resources import CrawlerResource, PostgresResource, SettingsResource
from rag_pipeline.store import schedule


# A page recrawl_sensor claimed is due again after this if its push run never recorded the push;
# a cadence refresh leaves the next crawl of a page claimed this recently as it is.
CLAIM_LEASE = timedelta(minutes=10)


class PushConfig(dg.Config):
    urls: list[str]                     # normalized page URLs
    reason: str = "schedule"
    due_at: list[str] = []              # recrawl_sensor: when each URL was due (ISO 8601), in `urls` order


class SeedConfig(dg.Config):
    seeds: list[str] = []               # seed-file lines: URL [every=6h], `#` comments
    file: str | None = None             # or a seed file readable by the run


class RecrawlNowConfig(dg.Config):
    pattern: str                        # glob on the URL, e.g. https://docs.example.com/*
    limit: int = 10_000


def _push(context, postgres: PostgresResource, crawler: CrawlerResource, settings: SettingsResource,
          targets, reason: str):
    current = settings.get()
    rules = load_rules(current.cadence_file)
    with postgres.connect() as conn:
        report = push_by_site(
            conn, crawler.for_kind, targets, reason=reason, run_id=context.run_id,
            concurrency=current.crawler_push_concurrency, tombstone_recheck=rules.tombstone_recheck,
        )
    context.log.info(f"pushed {report.pushed}, failed {report.failed} ({reason})")
    if report.failed:
        context.log.warning("failed pushes:\n" + "\n".join(report.errors[:20]))
    return report


@dg.op(out=dg.Out(dg.Nothing),
       description="Push these pages to the crawler, record each push, move each next crawl.")
def push_pages(context: dg.OpExecutionContext, config: PushConfig, postgres: PostgresResource,
               crawler: CrawlerResource, settings: SettingsResource) -> dg.Output:
    due = {url: datetime.fromisoformat(at) for url, at in zip(config.urls, config.due_at)}
    with postgres.connect() as conn:
        targets = schedule.targets(conn, config.urls, due)
    report = _push(context, postgres, crawler, settings, targets, config.reason)
    return dg.Output(None, metadata=report.as_metadata())


@dg.op(out=dg.Out(dg.Nothing),
       description="Register seed URLs with their cadence, then push them.")
def seed_pages(context: dg.OpExecutionContext, config: SeedConfig, postgres: PostgresResource,
               crawler: CrawlerResource, settings: SettingsResource) -> dg.Output:
    lines = list(config.seeds)
    if config.file:
        with open(config.file, encoding="utf-8") as fh:
            lines += fh.read().splitlines()
    current = settings.get()
    seeds = parse_seeds("\n".join(lines), timedelta(seconds=current.recrawl_interval_s))
    with postgres.connect() as conn:
        targets, aliases = register_seeds(conn, seeds, load_site_rules(conn, current.cadence_file))
    report = _push(context, postgres, crawler, settings, targets, "seed")
    return dg.Output(None, metadata={**report.as_metadata(), "seeds": len(seeds),
                                              "aliases_skipped": len(aliases)})


@dg.op(out=dg.Out(dg.Nothing),
       description="Push now every page whose URL matches a glob pattern.")
def push_matching(context: dg.OpExecutionContext, config: RecrawlNowConfig, postgres: PostgresResource,
                  crawler: CrawlerResource, settings: SettingsResource) -> dg.Output:
    with postgres.connect() as conn:
        targets = schedule.matching(conn, glob_to_like(config.pattern), config.limit)
    report = _push(context, postgres, crawler, settings, targets, "manual")
    return dg.Output(None, metadata={**report.as_metadata(), "matched": len(targets)})


# Every push job is tagged rag/kind=push: deploy/dagster.yaml runs one such run at a time, since
# CRAWLER_PUSH_RATE is enforced per process and two push runs at once would double it.
@dg.job(name="push", description="Push pages to the crawler (the recrawl sensor's batches land here).",
        tags={"rag/kind": "push"})
def push_job():
    push_pages()


@dg.job(name="seed", description="Seed: register URLs with their cadence and push them (config: seeds or file).",
        tags={"rag/kind": "push"})
def seed_job():
    seed_pages()


@dg.job(name="recrawl_now", description="Recrawl now every page matching a URL glob (config: pattern).",
        tags={"rag/kind": "push"})
def recrawl_now_job():
    push_matching()


@dg.op(out=dg.Out(dg.Nothing),
       description="Derive every adaptable page's cadence again from its crawl observations and the "
                   "crawl budget; move each next crawl to its last crawl + its new interval.")
def refresh_cadences(context: dg.OpExecutionContext, postgres: PostgresResource,
                     settings: SettingsResource) -> dg.Output:
    current = settings.get()
    with postgres.connect() as conn:
        rules = load_site_rules(conn, current.cadence_file)
        with conn.transaction():
            refreshed = adaptive.refresh(conn, rules, current, CLAIM_LEASE)
    context.log.info(refreshed.summary())
    return dg.Output(None, metadata={
        "pages": refreshed.pages, "adaptive": refreshed.adaptive, "rewritten": refreshed.rewritten,
        "budget_per_day": refreshed.budget_per_day, "planned_per_day": round(refreshed.planned_per_day, 1),
        "note": refreshed.note,
    })


# A run, not work inside a recrawl_sensor tick: at 100,000 pages a refresh takes 18-31 s, and it grows
# with the pages while a tick must end within the daemon's 60 s; a tick that long would also hold
# up the pushes that are due.
@dg.job(name="cadence_refresh", tags={"rag/kind": "cadence_refresh"},
        description="Derive the adaptive cadences again (recrawl_sensor requests it every CADENCE_REFRESH_S).")
def cadence_refresh_job():
    refresh_cadences()


def push_run_config(urls: list[str], reason: str, due_at: list[datetime] | None = None) -> dict:
    config = {"urls": urls, "reason": reason}
    if due_at is not None:
        config["due_at"] = [at.isoformat() for at in due_at]
    return {"ops": {"push_pages": {"config": config}}}

