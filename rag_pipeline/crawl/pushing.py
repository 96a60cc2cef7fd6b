"""The push path shared by the recrawl sensor's runs, the seed job, recrawl-now and the CLI:
record each push, push concurrently (the crawler client rate-limits), record the results, and
move each page's next crawl, in that order. A push the crawler did not fetch because robots.txt
disallows it is neither pushed nor failed: `disallowed`, and its page leaves the queue until
robots.txt is read again (`store.disallowed`)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import psycopg

from rag_pipeline.crawl.base import Crawler, PushError
from rag_pipeline.crawl.site_cadences import SiteRules
from rag_pipeline.core.site_spec import locate
from rag_pipeline.store import disallowed, pushes, schedule, sites

log = logging.getLogger(__name__)

FAILED_PUSH_RETRY = timedelta(minutes=5)


@dataclass
class PushReport:
    pushed: int = 0
    failed: int = 0
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    rids: dict[str, str] = field(default_factory=dict)      # page URL → rid
    undelivered_local: int = 0                              # local crawler: still fetching at the end
    urls: list[str] = field(default_factory=list)           # the URLs pushed, as crawled
    disallowed: int = 0                                     # not fetched: robots.txt disallows them
    disallowed_urls: list[str] = field(default_factory=list)   # "URL: rule" of each

    def add(self, other: "PushReport") -> None:
        self.pushed += other.pushed
        self.failed += other.failed
        self.attempts += other.attempts
        self.errors += other.errors
        self.rids.update(other.rids)
        self.undelivered_local += other.undelivered_local
        self.urls += other.urls
        self.disallowed += other.disallowed
        self.disallowed_urls += other.disallowed_urls

    def as_metadata(self, shown: int = 50) -> dict:
        more = f"\n… and {len(self.urls) - shown} more" if len(self.urls) > shown else ""
        return {"pushed": self.pushed, "failed": self.failed, "attempts": self.attempts,
                "pushed_urls": "\n".join(self.urls[:shown]) + more,
                "errors": "\n".join(self.errors[:20]), "still_fetching": self.undelivered_local,
                "disallowed_by_robots_txt": self.disallowed,
                "disallowed_urls": "\n".join(self.disallowed_urls[:20])}


def push_targets(conn: psycopg.Connection, crawler: Crawler, targets: list[schedule.Target], *,
                 reason: str, run_id: str | None = None, concurrency: int = 8,
                 tombstone_recheck: timedelta = timedelta(days=30), drain_timeout_s: float = 300.0,
                 progress: Callable[[int], None] | None = None) -> PushReport:
    report = PushReport()
    if not targets:
        return report
    with conn.transaction():
        ids = pushes.begin(conn, [(t.crawl_url, t.page_url) for t in targets], reason=reason,
                           crawler=crawler.name, run_id=run_id)

    def one(item: tuple[int, schedule.Target]) -> pushes.Outcome:
        push_id, target = item
        try:
            done = crawler.push(target.crawl_url, push_id=push_id)
            return pushes.Outcome(push_id, done.rid, done.attempts)
        except PushError as exc:
            return pushes.Outcome(push_id, None, exc.attempts, str(exc))
        except Exception as exc:  # noqa: BLE001 — recorded on the push row, never lost
            return pushes.Outcome(push_id, None, 1, f"{type(exc).__name__}: {exc}")

    outcomes: list[pushes.Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(targets)))) as pool:
        for outcome in pool.map(one, zip(ids, targets)):
            outcomes.append(outcome)
            if progress:
                progress(1)
    by_id = dict(zip(ids, targets))
    ok = [by_id[o.push_id].page_url for o in outcomes if o.rid]
    bad = [by_id[o.push_id].page_url for o in outcomes if not o.rid]
    with conn.transaction():
        pushes.finish(conn, outcomes)
        schedule.after_push(conn, ok, bad, tombstone_recheck=tombstone_recheck, retry_after=FAILED_PUSH_RETRY,
                            due_at={t.page_url: t.due_at for t in targets if t.due_at is not None})
    report.pushed, report.failed = len(ok), len(bad)
    report.attempts = sum(o.attempts for o in outcomes)
    report.errors = [f"{by_id[o.push_id].crawl_url}: {o.error}" for o in outcomes if not o.rid]
    report.rids = {by_id[o.push_id].page_url: o.rid for o in outcomes if o.rid}
    report.urls = [by_id[o.push_id].crawl_url for o in outcomes if o.rid]
    report.undelivered_local = crawler.drain(drain_timeout_s)
    crawl_urls = {t.page_url: t.crawl_url for t in targets}
    fail_undelivered(conn, crawler, report, crawl_urls)
    hold_disallowed(conn, crawler, report, crawl_urls)
    return report


def push_by_site(conn: psycopg.Connection, crawler_for: Callable[[str | None], Crawler],
                 targets: list[schedule.Target], **options) -> PushReport:
    """`push_targets`, each page through the crawler its site asks for (`crawler_for(None)`: the
    deployment's CRAWLER), one group a crawler; one report for all."""
    kinds = sites.crawlers(conn, [t.page_url for t in targets]) if targets else {}
    groups: dict[str | None, list[schedule.Target]] = {}
    for target in targets:
        groups.setdefault(kinds.get(target.page_url), []).append(target)
    report = PushReport()
    for kind, group in sorted(groups.items(), key=lambda item: item[0] or ""):
        report.add(push_targets(conn, crawler_for(kind), group, **options))
    return report


def fail_undelivered(conn: psycopg.Connection, crawler: Crawler, report: PushReport,
                     crawl_urls: dict[str, str]) -> None:
    """A push the crawler took but whose delivery it gave up on (the local crawler: refused by
    the receiver, or never reached it) failed after all: recorded `failed` with the reason, and
    its page due again like any failed push, instead of `pushed` with a delivery that never comes."""
    failures = crawler.delivery_failures(list(report.rids.values()))
    if not failures:
        return
    with conn.transaction():
        failed = pushes.fail_delivery(conn, failures)
        pages = {rid: page for page, rid in report.rids.items() if rid in failed}
        schedule.after_push(conn, [], list(pages.values()), tombstone_recheck=timedelta(0),  # none pushed
                            retry_after=FAILED_PUSH_RETRY)
    report.errors += _unpushed(report, pages, crawl_urls, failures)
    report.failed += len(pages)


def _unpushed(report: PushReport, pages: dict[str, str], crawl_urls: dict[str, str], why: dict[str, str]) -> list[str]:
    """Takes `pages` (rid: page) out of what the report counts as pushed; "url: why" for each."""
    lines = []
    for rid, page in pages.items():
        del report.rids[page]
        report.urls.remove(crawl_urls[page])
        lines.append(f"{crawl_urls[page]}: {why[rid]}")
    report.pushed -= len(pages)
    return lines


def hold_disallowed(conn: psycopg.Connection, crawler: Crawler, report: PushReport,
                    crawl_urls: dict[str, str]) -> None:
    """A push the crawler took but did not fetch because robots.txt disallows it (the local
    crawler): recorded `disallowed` with the rule, and its page marked and out of the queue for as
    long as that verdict stands, instead of `failed` and pushed again every few minutes."""
    refusals = crawler.robots_refusals(list(report.rids.values()))
    if not refusals:
        return
    with conn.transaction():
        marked = pushes.disallow(conn, {rid: r.rule for rid, r in refusals.items()})
        pages = {rid: page for page, rid in report.rids.items() if rid in marked}
        disallowed.refused(conn, {page: disallowed.Refusal(refusals[rid].rule, refusals[rid].url,
                                                           timedelta(seconds=refusals[rid].holds_s))
                                  for rid, page in pages.items()})
    report.disallowed_urls += _unpushed(report, pages, crawl_urls, {rid: r.rule for rid, r in refusals.items()})
    report.disallowed += len(pages)


def register_seeds(conn: psycopg.Connection, seeds, rules: SiteRules) -> tuple[list[schedule.Target], list[str]]:
    """Register seeds with their cadence (theirs, else their pattern's), in one transaction.
    Returns what to push and the seeds that are known aliases (not pushed: see their target)."""
    targets: list[schedule.Target] = []
    skipped: list[str] = []
    with conn.transaction():
        scopes = sites.declared_scopes(conn)   # a seed in a declared site's scope is that site's page
        for s in seeds:
            site, shard = locate(s.page_url, scopes)
            row = schedule.register(conn, s.url, s.page_url, s.every or rules.every_for(s.page_url, site),
                                    explicit=s.every is not None, site=site, shard=shard)
            if row.alias_of:
                skipped.append(f"{s.url} → {row.alias_of}")
            else:
                targets.append(schedule.Target(row.page_url, row.crawl_url))
    return targets, skipped
