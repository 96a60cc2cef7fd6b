"""Crawler health as check outcomes with descriptions a person can act on. Pure: the callers
read the crawler's stats and the pushes table and turn these into Dagster check results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rag_pipeline.crawl.base import CrawlerHealth

CRAWLER_NOT_PAUSED = "crawler_not_paused"
CRAWLER_QUEUE_NOT_GROWING = "crawler_queue_not_growing"
PUSHES_DELIVERED = "pushes_delivered"
NO_PAGE_OVERDUE = "no_page_overdue"
CHECK_NAMES = (CRAWLER_NOT_PAUSED, CRAWLER_QUEUE_NOT_GROWING, PUSHES_DELIVERED, NO_PAGE_OVERDUE)
# The waiting queue counts as growing when it rose on each of this many readings in a row.
GROWING_READINGS = 4


class Undelivered(Protocol):
    """Pushes the crawler took whose delivery is overdue (what `store.pushes.undelivered` returns)."""
    count: int
    examples: list[tuple[int, str, str]]       # (push_id, url, rid)


@dataclass(frozen=True)
class Outcome:
    check_name: str
    passed: bool
    description: str
    warn: bool = False             # severity WARN rather than ERROR
    metadata: dict = field(default_factory=dict)


def evaluate(crawler: str, health: CrawlerHealth, undelivered: Undelivered,
             failed: list[tuple[int, str, str]], *, waiting_history: list[int], waiting_max: int,
             delivery_timeout_s: float, overdue: tuple[int, list[str]] = (0, [])) -> list[Outcome]:
    out: list[Outcome] = []
    if health.status == "paused":
        out.append(Outcome(CRAWLER_NOT_PAUSED, False,
                           f"The {crawler} crawler is PAUSED: nothing pushed will be crawled or delivered. "
                           "Crawlbase pauses a crawler when its monitoring probes to our webhook keep "
                           "failing: check that the receiver answers 200 (rag-pipeline webhook, /healthz), "
                           "then unpause the crawler (dashboard or POST /crawler/TOKEN/NAME/unpause).",
                           metadata={"waiting": health.waiting, "retrying": health.retrying}))
    elif health.status == "unknown":
        out.append(Outcome(CRAWLER_NOT_PAUSED, False,
                           f"Cannot read the {crawler} crawler's stats: {health.error}. Check "
                           "CRAWLBASE_TOKEN, CRAWLER_NAME and CRAWLBASE_API_URL.", warn=True))
    else:
        out.append(Outcome(CRAWLER_NOT_PAUSED, True, f"The {crawler} crawler is active.",
                           metadata={"waiting": health.waiting, "retrying": health.retrying}))

    readings = (waiting_history + [health.waiting])[-(GROWING_READINGS + 1):]
    growing = len(readings) > GROWING_READINGS and all(b > a for a, b in zip(readings, readings[1:]))
    if health.waiting > waiting_max:
        out.append(Outcome(CRAWLER_QUEUE_NOT_GROWING, False,
                           f"{health.waiting} pages wait in the {crawler} crawler's queue (limit "
                           f"{waiting_max}, CRAWLER_WAITING_MAX): pushes outrun its concurrency. Lower "
                           "RECRAWL_BATCH_SIZE or lengthen cadences, or raise the crawler's concurrency.",
                           metadata={"waiting": health.waiting, "readings": readings}))
    elif growing:
        out.append(Outcome(CRAWLER_QUEUE_NOT_GROWING, False,
                           f"The {crawler} crawler's waiting queue grew on each of the last "
                           f"{GROWING_READINGS} readings ({' → '.join(map(str, readings))}): it is not "
                           "keeping up with the pushes.", warn=True, metadata={"readings": readings}))
    else:
        out.append(Outcome(CRAWLER_QUEUE_NOT_GROWING, True,
                           f"{health.waiting} pages waiting, {health.retrying} to retry.",
                           metadata={"readings": readings}))

    if undelivered.count:
        examples = ", ".join(f"push {pid} {url} (rid {rid})" for pid, url, rid in undelivered.examples)
        out.append(Outcome(PUSHES_DELIVERED, False,
                           f"{undelivered.count} push(es) accepted by the {crawler} crawler more than "
                           f"{int(delivery_timeout_s)} s ago have no delivery yet, e.g. {examples}. "
                           "Is the crawler paused, or is the receiver refusing deliveries?",
                           metadata={"undelivered": undelivered.count}))
    elif failed:
        examples = "; ".join(f"push {pid} {url}: {err}" for pid, url, err in failed)
        out.append(Outcome(PUSHES_DELIVERED, False,
                           f"Recent pushes were refused by the crawler: {examples}. They are retried "
                           "after 5 minutes.", warn=True, metadata={"failed_examples": len(failed)}))
    else:
        out.append(Outcome(PUSHES_DELIVERED, True,
                           f"Every push older than {int(delivery_timeout_s)} s has its delivery."))

    count, examples = overdue
    if count:
        out.append(Outcome(NO_PAGE_OVERDUE, False,
                           f"{count} live page(s) not crawled for over twice their recrawl_every (plus "
                           f"10 min), e.g. {', '.join(examples)}. Is recrawl_sensor running, and are "
                           "pushes delivered?", metadata={"overdue": count}))
    else:
        out.append(Outcome(NO_PAGE_OVERDUE, True, "Every live page was crawled within twice its recrawl_every."))
    return out
