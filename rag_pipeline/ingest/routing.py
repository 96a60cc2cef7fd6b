"""Routing: what the delivery sensor does with each new delivery, in receipt order.

Cheap outcomes are settled right here (unchanged, tombstone, skipped, superseded); only a
new or changed page becomes work for a run. Everything for one page happens under its row
lock, so routing and a run's switch never interleave.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psycopg

from rag_pipeline.core.addresses import Network, host_refusal
from rag_pipeline.core.batch_sizing import WorkItem
from rag_pipeline.core.bodies import BodyError, decode_stored
from rag_pipeline.core.site_spec import locate, site_boilerplate
from rag_pipeline.core.delivery import Verdict, classify
from rag_pipeline.core.text import BoilerplateRule, content_hash, normalize_markdown
from rag_pipeline.ingest import hash_gate
from rag_pipeline.ingest.routing_writes import RoutingWrites
from rag_pipeline.ingest.rules import configured_boilerplate_rules
from rag_pipeline.core.urls import InvalidURL, normalize_url, page_id
from rag_pipeline.settings import load_settings
from rag_pipeline.store import aliases, deliveries, pages, pushes, site_templates, sites

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """A delivery routing settled without a run: what its page's partition records of the crawl."""

    page_url: str
    delivery_id: int
    outcome: str                    # unchanged, deleted, skipped, superseded, failed
    original_status: int | None
    crawler_status: int | None
    redirected_from: str | None = None
    crawled_url: str | None = None   # as delivered, scheme kept: the address that opens


@dataclass
class RoutingResult:
    queued: list[WorkItem] = field(default_factory=list)   # new or changed: for a batch run
    outcomes: Counter = field(default_factory=Counter)
    settled: list[Settled] = field(default_factory=list)
    #: Redirects recorded this time: target page → (the URL that redirects to it, the delivery).
    redirects: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Stopped at its deadline with deliveries possibly left: they wait for the next call.
    cut_short: bool = False

    @property
    def routed(self) -> int:
        return sum(self.outcomes.values())

    def add(self, other: RoutingResult) -> None:
        self.queued.extend(other.queued)
        self.outcomes.update(other.outcomes)
        self.settled.extend(other.settled)
        self.redirects.update(other.redirects)


# Deliveries routed per transaction. A transaction holds the row locks of what it routed until it
# commits, and the receiver's INSERT of a repeated rid (the crawler retrying) waits on the row it
# repeats: small transactions keep that wait short; large ones share their reads among more
# deliveries (`_Known`).
ROUTE_CHUNK = 100


def route_batch(conn: psycopg.Connection, limit: int, max_page_bytes: int,
                chunk: int | None = None, *, rules: list[BoilerplateRule] | None = None,
                until: float | None = None, allowed_networks: tuple[Network, ...] | None = None,
                accept_unsolicited: bool | None = None) -> RoutingResult:
    """Route up to `limit` unrouted deliveries, `chunk` per transaction, with
    `rules` (unset: this process's BOILERPLATE_RULES) and the network guard's `allowed_networks`
    (unset: this process's CRAWLER_ALLOW_NETWORKS), and whether a delivery answering no push of
    ours is indexed (`accept_unsolicited`, unset: WEBHOOK_ACCEPT_UNSOLICITED). No chunk starts after `until` (a
    time.monotonic() deadline), but one always runs: a caller with a time limit still advances."""
    result = RoutingResult()
    chunk = chunk or ROUTE_CHUNK
    rules = rules if rules is not None else configured_boilerplate_rules()
    if allowed_networks is None or accept_unsolicited is None:
        process = load_settings()
        allowed_networks = process.allowed_networks() if allowed_networks is None else allowed_networks
        accept_unsolicited = process.webhook_accept_unsolicited if accept_unsolicited is None else accept_unsolicited
    trust = _Trust(allowed_networks, accept_unsolicited)
    scopes = sites.declared_scopes(conn)   # where a page first seen here belongs
    rules_of = _site_rules(conn, rules)     # a site's own boilerplate rules, added to the deployment's
    # Each site's learned template, for the hash gate past it (read once a call: a learning lands
    # on the next tick).
    context = _Context(rules_of, max_page_bytes, trust, scopes, site_templates.current(conn))
    while result.routed < limit:
        want = min(chunk, limit - result.routed)
        try:
            with conn.transaction():
                part = RoutingResult()
                claimed = _route_chunk(conn, want, part, context, careful=False)
        except (BodyError, InvalidURL, psycopg.DataError):
            # A delivery in the chunk is bad: the chunk again, each delivery under a savepoint of
            # its own, so that only the bad one fails.
            with conn.transaction():
                part = RoutingResult()
                claimed = _route_chunk(conn, want, part, context, careful=True)
        result.add(part)
        if claimed < want:
            break
        if until is not None and time.monotonic() >= until and result.routed < limit:
            result.cut_short = True
            break
    return result


@dataclass(frozen=True)
class _Context:
    rules_of: Callable[[str | None], list[BoilerplateRule]]
    max_page_bytes: int
    trust: _Trust
    scopes: list
    templates: dict


def _route_chunk(conn, want: int, result: RoutingResult, context: _Context, *, careful: bool) -> int:
    """Route up to `want` deliveries in the caller's transaction; returns how many were claimed.
    `careful`: each under a savepoint, a bad one failed alone; otherwise no savepoints (a
    round trip less, twice, per delivery) and a bad one raises."""
    claimed = deliveries.claim_unrouted(conn, want)
    known = _Known.read(conn, claimed)
    held = RoutingWrites(conn)   # fast: the chunk's writes, a set at a time
    for delivery in claimed:
        asked = _asked_pages_of(delivery)
        if not careful:
            if held.waiting_on(asked):   # a page routed earlier in the chunk: read it as written
                held.flush()
            outcome = _route_one(conn, delivery, result, context, known, held)
            held.touch(asked)
        else:
            try:
                with conn.transaction():
                    own, its = RoutingWrites(conn), RoutingResult()
                    outcome = _route_one(conn, delivery, its, context, known, own)
                    own.flush()   # inside its savepoint: what PostgreSQL refuses fails this one only
                result.queued.extend(its.queued)
                result.redirects.update(its.redirects)
            except (BodyError, InvalidURL) as exc:
                # A stored body the receiver accepted should decode; if not, say so and move on.
                outcome = "failed"
                deliveries.mark(conn, delivery.id, "failed", error=str(exc))
            except psycopg.DataError as exc:
                # Data PostgreSQL refuses (SQLSTATE class 22, or a NUL psycopg will not send): its
                # savepoint is rolled back, and routing it again would fail the same way. Failed
                # with no retry scheduled; the other deliveries of the tick go on.
                outcome = "failed"
                deliveries.mark(conn, delivery.id, "failed", error=data_error_reason(exc))
                log.warning("delivery %s not routed: %s", delivery.id, exc)
        if outcome not in ("queued", "refused", "unsolicited"):   # no page of ours to tell
            _settled(result, delivery, outcome)
        result.outcomes[outcome] += 1
    held.flush()
    return len(claimed)


class _Known:
    """What routing a chunk of deliveries reads, read for the whole chunk in a few statements: the
    pushes they answer, their pages (locked, in URL order), which pages are aliases or have a
    queued delivery. Each page's entries serve its first delivery only: a later delivery of the
    same page in the chunk reads the page as the first one left it."""

    def __init__(self, fresh: set[str], pushed, in_flight, pages_by_url, aliased, queued) -> None:
        self._fresh = fresh   # the pages whose entries still hold
        self._pushed, self._in_flight, self._pages = pushed, in_flight, pages_by_url
        self._aliased, self._queued = aliased, queued

    @classmethod
    def read(cls, conn, claimed) -> _Known:
        urls = sorted({url for delivery in claimed for url in _asked_pages_of(delivery)})
        return cls(set(urls), pushes.pushed_many(conn, [d.rid for d in claimed]), pushes.in_flight_many(conn, urls),
                   pages.get_many(conn, urls, for_update=True), aliases.aliases_among(conn, urls),
                   deliveries.queued_among(conn, urls))

    def pushed(self, rid: str):
        return self._pushed.get(rid, (None, None))

    def in_flight(self, conn, asked: list[str]):
        if not all(url in self._fresh for url in asked):
            return pushes.in_flight(conn, asked)
        found = [self._in_flight[url] for url in asked if url in self._in_flight]
        return max(found, key=lambda push: push[1]) if found else (None, None)

    def page(self, conn, url: str):
        return self._pages.get(url) if url in self._fresh else pages.get(conn, url, for_update=True)

    def may_be_alias(self, url: str) -> bool:
        return url not in self._fresh or url in self._aliased

    def has_queued(self, conn, url: str) -> bool:
        return url in self._queued if url in self._fresh else deliveries.has_queued(conn, url)

    def forget(self, url: str) -> None:
        """The page's delivery was routed (or failed): what was read of it may be stale now."""
        self._fresh.discard(url)


def _asked_pages_of(delivery) -> list[str]:
    try:
        return _asked_pages(delivery, normalize_url(delivery.url))
    except InvalidURL:
        return []


def _settled(result: RoutingResult, delivery, outcome: str) -> None:
    try:
        page_url = normalize_url(delivery.url)
    except InvalidURL:
        return   # no page to tell it to
    redirect = result.redirects.get(page_url)
    result.settled.append(Settled(page_url, delivery.id, outcome, delivery.original_status, delivery.crawler_status,
                                  redirect[0] if redirect and redirect[1] == delivery.id else None, delivery.url))


def data_error_reason(exc: psycopg.DataError) -> str:
    """Why PostgreSQL refused a delivery's data, for its `error` column."""
    code = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
    return (f"the delivery's data cannot be stored: {str(exc).strip()}{code}; "
            "not retried: a retry would fail the same way")


def _site_rules(conn, rules: list[BoilerplateRule]):
    """site → the rules its pages are normalized with: the deployment's, then the site's own."""
    own: dict[str, list[BoilerplateRule]] = {}
    for name, declared in sites.boilerplate(conn).items():
        try:
            own[name] = site_boilerplate(declared)
        except ValueError as exc:   # validated when declared; a row from another release may not parse
            log.warning("site %s: its boilerplate rules are ignored: %s", name, exc)
    return lambda site: rules + own[site] if site in own else rules


@dataclass(frozen=True)
class _Trust:
    allowed_networks: tuple
    accept_unsolicited: bool


def _route_one(conn, delivery, result: RoutingResult, context: _Context, known: _Known,
               writes: RoutingWrites) -> str:
    try:
        return _route(conn, delivery, context, result, known, writes)
    finally:
        for url in _asked_pages_of(delivery):
            known.forget(url)


def _route(conn, delivery, context: _Context, result: RoutingResult, known: _Known, writes: RoutingWrites) -> str:
    rules_of, max_page_bytes, trust, scopes = context.rules_of, context.max_page_bytes, context.trust, context.scopes
    page_url = normalize_url(delivery.url)
    # The network guard's rule, on what was delivered: an internal address is never indexed.
    refused = host_refusal(urlsplit(delivery.url).hostname or "", trust.allowed_networks)
    if refused:
        writes.mark(delivery.id, "refused", page_url=page_url, error=f"not indexed: {refused}")
        return "refused"
    # A delivery answers a push: its rid must be one of ours, and our push row (not a header)
    # says which URL was asked for.
    pushed_url, pushed_at = known.pushed(delivery.rid)
    if pushed_at is None:   # its push may still be in flight: its rid not recorded yet
        pushed_url, pushed_at = known.in_flight(conn, _asked_pages(delivery, page_url))
    if pushed_at is None and not trust.accept_unsolicited:
        writes.mark(delivery.id, "unsolicited", page_url=page_url,
                        error=f"rid {delivery.rid[:64]!r} answers no push of ours: stored, never indexed "
                              "(WEBHOOK_ACCEPT_UNSOLICITED lets such deliveries in)")
        return "unsolicited"
    pid = page_id(page_url)
    verdict = classify(delivery.crawler_status, delivery.original_status)
    page = known.page(conn, page_url)

    # Receipt order: a delivery older than what the page already shows (or has queued) is history.
    if page is not None and (page.applied_delivery_id or 0) > delivery.id:
        writes.mark(delivery.id, "superseded", page_url=page_url)
        return "superseded"
    # Crawl order: the crawler may deliver an older crawl late (a retried webhook). Its crawl time
    # is our push's, found by its rid; a delivery we did not push counts from its receipt.
    crawled_at = pushed_at or delivery.received_at
    if page is not None and page.newest_crawl_at is not None and crawled_at < page.newest_crawl_at:
        writes.mark(delivery.id, "superseded", page_url=page_url, crawled_at=crawled_at,
                        error=f"a crawl made at {crawled_at.isoformat()}, older than one already routed for "
                              f"this page ({page.newest_crawl_at.isoformat()})")
        return "superseded"

    if verdict is Verdict.SKIP:
        writes.mark(
            delivery.id, "skipped", page_url=page_url,
            error=f"crawler status {delivery.crawler_status}, site status {delivery.original_status}",
        )
        return "skipped"

    site, shard = (page.site, None) if page is not None else locate(page_url, scopes)
    foreign = _foreign_redirect(conn, pushed_url or delivery.pushed_url, page_url, page)
    if foreign:
        writes.mark(delivery.id, "refused", page_url=page_url, error=foreign)
        return "refused"
    if page is None:   # first seen here: placed in the declared site whose scope holds it, if any
        pushed = pushed_url or delivery.pushed_url
        writes.ensure_page(pid, page_url, delivery.url, site, shard,
                           "redirect" if pushed and pushed != delivery.url else "delivery")
    redirected_from = _note_redirect(conn, delivery, page_url, pushed_url, known, writes)
    if redirected_from:
        result.redirects[page_url] = (redirected_from, delivery.id)

    if verdict is Verdict.TOMBSTONE:
        writes.flush()
        pages.tombstone(conn, pid, page_url, delivery.id, delivery.original_status)
        writes.note_crawl(pid, page_url, crawled_at, pages.GONE)
        writes.supersede_older(page_url, delivery.id)
        writes.mark(delivery.id, "deleted", page_url=page_url, crawled_at=crawled_at)
        return "deleted"

    decoded = decode_stored(delivery.body, delivery.body_encoding, max_page_bytes)
    text = normalize_markdown(decoded.text, rules_of(site), url=page_url)
    digest = content_hash(text)
    if (page is not None and page.deleted_at is None and page.indexed_hash is not None
            and not known.has_queued(conn, page_url)):
        crawl = hash_gate.Crawl(delivery, page, pid, page_url, text, digest, crawled_at)
        if hash_gate.settle(writes, crawl, context.templates, site):
            return "unchanged"

    writes.note_crawl(pid, page_url, crawled_at, digest)
    note = "body had invalid UTF-8, replaced with U+FFFD" if decoded.replaced_invalid_utf8 else None
    writes.mark(delivery.id, "queued", page_url=page_url, error=note, text=text, text_hash=digest,
                    crawled_at=crawled_at)
    result.queued.append(WorkItem(page_url, delivery.id))
    return "queued"


def _asked_pages(delivery, page_url: str) -> list[str]:
    """The pages a delivery says it answers: its own, and its pushed-url header's."""
    asked = [page_url]
    if delivery.pushed_url:
        try:
            asked.append(normalize_url(delivery.pushed_url.replace("%7C", "|")))
        except InvalidURL:
            pass
    return asked


def _foreign_redirect(conn, pushed: str | None, page_url: str, page) -> str | None:
    """Why a redirect may not land here: onto a live page of another site (or, between pages of
    no declared site, of another host), whose text a crawl of some other URL must not replace."""
    if not pushed or page is None or page.deleted_at is not None or page.indexed_hash is None:
        return None
    try:
        origin = normalize_url(pushed.replace("%7C", "|"))
    except InvalidURL:
        return None
    if origin == page_url:
        return None
    origin_site = pages.site_of(conn, origin)
    if origin_site is None and page.site is None:
        if urlsplit(origin).netloc == urlsplit(page_url).netloc:
            return None
    elif origin_site == page.site:
        return None
    return (f"refused: the crawl of {origin} redirected onto {page_url}, a live page of another "
            f"{'site' if origin_site or page.site else 'host'}: not indexed")


def _note_redirect(conn, delivery, page_url: str, pushed_url: str | None, known: _Known,
                   writes: RoutingWrites) -> str | None:
    """The page is indexed under the delivered URL. When that is not the URL we pushed (the site
    redirected), the pushed URL becomes an alias of it: recrawled no more, nothing indexed twice.
    A URL delivered as itself again is a page again. Returns the alias recorded, if any."""
    if known.may_be_alias(page_url):
        writes.flush()
        aliases.clear(conn, page_url)
    pushed = pushed_url or delivery.pushed_url     # our push row is the authority; a header only without one
    if not pushed:
        return None
    try:
        pushed_page = normalize_url(pushed.replace("%7C", "|"))
    except InvalidURL:
        log.warning("delivery %s: ignoring unreadable pushed URL %r", delivery.id, pushed)
        return None
    if pushed_page == page_url:
        return None
    writes.flush()
    aliases.record(conn, pushed_page, page_url, delivery.url, delivery.id)
    return pushed_page
