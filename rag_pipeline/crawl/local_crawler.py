"""The local crawler: for running without a Crawlbase account (and what `make run` uses).

A push queues the URL and answers a rid at once, like Crawlbase. Worker threads fetch it through
the network guard (`guarded_http`: every hop's address checked, redirects followed by hand, one
deadline a fetch), with a User-Agent and at most `per_host` requests per host at a time, then
convert HTML to markdown and deliver it to our receiver exactly as Crawlbase would. The work lives
in this process, so whoever pushes must `drain()` before exiting (the push job and the CLI do), then
collect `delivery_failures()`: a delivery the receiver refused fails its push.

It obeys each origin's robots.txt for its User-Agent (`robots_cache`, unless `obey_robots` is off):
a hop it disallows is never requested, and fetches of one origin start at least its Crawl-delay
apart. A push robots.txt as read disallows (the page, or a hop of its redirects) is reported apart
(`robots_refusals`, with the rule and the TTL it stands for), not as a failure: the push path takes
its page out of the queue until robots.txt is read again. An unreachable robots.txt fails the push
as a refused hop does (an outage, tried again in minutes).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict, defaultdict
from urllib.parse import urlsplit

import httpx

from rag_pipeline.core.addresses import Network, host_refusal
from rag_pipeline.crawl.base import CrawlerHealth, PushError, Pushed, RobotsRefusal, callback_headers
from rag_pipeline.crawl.fetching import FETCH_DEADLINE_S, DeliveryFailed, deliver, fetch_markdown
from rag_pipeline.crawl.guarded_http import Disallowed, Refused, guarded_client
from rag_pipeline.crawl.robots_cache import MAX_ORIGINS, RobotsCache, origin_of

log = logging.getLogger(__name__)

# Failed deliveries kept for `delivery_failures` (one crawler serves many push runs): a run that
# stopped waiting never collects its late ones, so the oldest beyond this are forgotten.
MAX_KEPT_FAILURES = 10_000


class LocalCrawler:
    name = "local"

    def __init__(self, *, callback_url: str, user_agent: str, webhook_token: str | None = None, timeout_s: float = 30.0,
                 per_host: int = 2, workers: int = 8, delivery_retries: int = 5,
                 delivery_backoff_s: float = 0.5, allowed_networks: tuple[Network, ...] = (),
                 fetch_deadline_s: float = FETCH_DEADLINE_S, obey_robots: bool = True,
                 robots_ttl_s: float = 3600.0):
        self.callback_url = callback_url
        self.user_agent = user_agent
        self.per_host = per_host
        self.delivery_retries = delivery_retries
        self.delivery_backoff_s = delivery_backoff_s
        self.allowed_networks = allowed_networks
        self.fetch_deadline_s = fetch_deadline_s
        self.robots_ttl_s = robots_ttl_s
        self._fetch_client = guarded_client(
            allowed=allowed_networks, user_agent=user_agent, timeout_s=timeout_s,
            headers={"Accept": "text/html, text/markdown;q=0.9, */*;q=0.5"},
        )
        # robots.txt comes through the same guarded client: the guard applies to it as to a page.
        self._robots = RobotsCache(self._fetch_client, agent=user_agent, ttl_s=robots_ttl_s,
                                   deadline_s=fetch_deadline_s) if obey_robots else None
        self._next_start: dict[str, float] = {}   # origin → when its next fetch may start (Crawl-delay)
        self._pace_lock = threading.Lock()
        self._closing = threading.Event()
        # The receiver's token rides in a header, not in the callback URL.
        self._deliver_client = httpx.Client(timeout=timeout_s,
                                            headers={"X-Webhook-Token": webhook_token} if webhook_token else None)
        self._jobs: queue.Queue = queue.Queue()
        self._hosts: dict[str, threading.Semaphore] = defaultdict(lambda: threading.Semaphore(per_host))
        self._hosts_lock = threading.Lock()
        self._pending = 0
        self._waiting: set[str] = set()      # rids pushed, not fetched or given up on yet
        self._idle = threading.Condition()
        self.delivered = 0
        self.failed = 0
        self._failures: OrderedDict[str, str] = OrderedDict()   # rid → why its delivery failed
        self._disallowed: OrderedDict[str, tuple[str, str]] = OrderedDict()  # rid → (rule, the URL it disallows)
        self._workers = workers
        self._threads: list[threading.Thread] = []   # started by the first push: a health read needs none

    def push(self, url: str, *, push_id: int | None = None) -> Pushed:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https"):
            raise PushError(f"cannot crawl {url!r}: only http(s)", status=400)
        # A host that is an address (or names this machine) is refused before any queueing; a
        # name is checked when each hop connects.
        refused = host_refusal(parts.hostname or "", self.allowed_networks)
        if refused:
            raise PushError(f"refused {url}: {refused}", status=403)
        rid = uuid.uuid4().hex
        with self._idle:
            if not self._threads:
                self._threads = [threading.Thread(target=self._work, name=f"local-crawler-{i}", daemon=True)
                                 for i in range(self._workers)]
                for thread in self._threads:
                    thread.start()
            self._pending += 1
            self._waiting.add(rid)
        self._jobs.put((rid, url, callback_headers(url, push_id)))
        return Pushed(rid)

    def _host(self, url: str) -> threading.Semaphore:
        with self._hosts_lock:
            return self._hosts[urlsplit(url).netloc.lower()]

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            rid, url, extra = job
            try:
                with self._idle:
                    if rid not in self._waiting:     # given up on by drain(): its push failed
                        continue
                with self._host(url):
                    self._pace(url)
                    fetched = fetch_markdown(self._fetch_client, url, deadline_s=self.fetch_deadline_s,
                                             check=self._check)
                deliver(self._deliver_client, self.callback_url, rid, fetched, extra,
                        retries=self.delivery_retries, backoff_s=self.delivery_backoff_s)
                self.delivered += 1
            except Disallowed as exc:
                if self._robots is not None and self._robots.disallows_by_rule(exc.url or url):
                    log.info("local crawler: not fetched: %s (%s)", exc, url)
                    self._refused_by_robots(rid, str(exc), exc.url or url)
                else:   # robots.txt unreachable: an outage, not a rule
                    log.warning("local crawler: %s", exc)
                    self._failed(rid, str(exc))
            except Refused as exc:
                # Nothing of a refused hop is delivered: the push fails with the reason.
                log.warning("local crawler: %s", exc)
                self._failed(rid, str(exc))
            except DeliveryFailed as exc:
                log.warning("local crawler: %s (%s)", exc, url)
                self._failed(rid, str(exc))
            except Exception as exc:  # a worker must survive any one page
                log.exception("local crawler: unexpected error on %s", url)
                self._failed(rid, f"{type(exc).__name__}: {exc}")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._waiting.discard(rid)
                    self._idle.notify_all()

    def _pace(self, url: str) -> None:
        """Wait until `url`'s origin may be fetched again: starts Crawl-delay apart across all
        workers. A slot is booked under the lock and waited for outside it."""
        if self._check(url):
            return       # a disallowed page is never requested, so it books no slot
        try:
            delay = self._robots.crawl_delay(url) if self._robots is not None else None
        except Refused:
            return       # the guard refuses the page itself, with its own reason
        if not delay:
            return
        origin = origin_of(url)
        with self._pace_lock:
            now = time.monotonic()
            start = max(now, self._next_start.get(origin, now))
            self._next_start[origin] = start + delay
            if len(self._next_start) > MAX_ORIGINS:     # origins whose slot has passed wait for nothing
                self._next_start = {o: t for o, t in self._next_start.items() if t > now}
        self._closing.wait(start - now)

    def _check(self, url: str) -> str | None:
        """Why robots.txt forbids this hop, for `guarded_http.fetch`; None lets it through."""
        if self._robots is None:
            return None
        # robots.txt redirected to a refused address disallows its origin; an origin the guard
        # refuses itself is let through here, to be refused as it connects with the guard's reason.
        return self._robots.why_disallowed(url)

    def _failed(self, rid: str, reason: str) -> None:
        with self._idle:
            if rid in self._failures:       # given up on by drain() while it was being fetched
                return
            self.failed += 1
            self._failures[rid] = reason
            while len(self._failures) > MAX_KEPT_FAILURES:
                self._failures.popitem(last=False)

    def _refused_by_robots(self, rid: str, rule: str, hop: str) -> None:
        with self._idle:
            if rid in self._failures:       # given up on by drain() while it was being checked
                return
            self._disallowed[rid] = (rule, hop)
            while len(self._disallowed) > MAX_KEPT_FAILURES:
                self._disallowed.popitem(last=False)

    def robots_refusals(self, rids) -> dict[str, RobotsRefusal]:
        """rid → the rule, for the pushes among `rids` robots.txt kept from being fetched (each
        reported once); the verdict stands for the robots.txt TTL."""
        with self._idle:
            found = {rid: self._disallowed.pop(rid) for rid in rids if rid in self._disallowed}
        return {rid: RobotsRefusal(rule, self.robots_ttl_s, hop) for rid, (rule, hop) in found.items()}

    def delivery_failures(self, rids) -> dict[str, str]:
        """rid → reason for the deliveries among `rids` that failed (each reported once)."""
        with self._idle:
            return {rid: self._failures.pop(rid) for rid in rids if rid in self._failures}

    def health(self) -> CrawlerHealth:
        with self._idle:
            waiting = self._pending
        return CrawlerHealth("active", waiting=waiting,
                             detail={"delivered": self.delivered, "failed": self.failed})

    def drain(self, timeout_s: float) -> int:
        """Wait for the fetches. Those not delivered within ``timeout_s`` are given up on: their
        pushes fail through `delivery_failures` and their pages fall due again, since this process
        is about to stop and would drop them (one already under way may still deliver: harmless)."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)
            for rid in self._waiting:
                self._failures[rid] = f"not delivered within {timeout_s:g} s of the push; given up"
                self.failed += 1
            self._waiting.clear()
            return self._pending

    def close(self) -> None:
        self._closing.set()
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        self._fetch_client.close()
        self._deliver_client.close()
