"""Each origin's robots.txt, fetched once per TTL through the network guard and shared by every
worker thread (RFC 9309: a 4xx means no rules, a 5xx or no answer means no crawling for now).

A file that could not be had (no answer, a 5xx, the deadline) is remembered for a short time
only, so a site's outage blocks it for minutes, not for the whole TTL. One the guard refuses is
remembered for the whole TTL, as a file would be: the guard's verdict does not change while the
process runs. A robots.txt that redirects to a refused address is unreachable, so nothing of its
origin is fetched (RFC 9309 2.3.1.4), never "no robots.txt", which would let every page through;
when the origin itself is refused, its pages are refused as they connect, with that reason.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import httpx

from rag_pipeline.core.robots import ALLOW_ALL, DISALLOW_ALL, MAX_ROBOTS_BYTES, Robots, parse_robots
from rag_pipeline.crawl.guarded_http import Fetch, FetchError, Refused, fetch

__all__ = ["RobotsCache", "origin_of", "MAX_ORIGINS", "UNREACHABLE_TTL_S"]

MAX_ORIGINS = 10_000
# How long an unreachable robots.txt blocks its origin before it is asked again.
UNREACHABLE_TTL_S = 300.0
# RFC 9309 2.3.1.2: follow at least five consecutive redirects.
ROBOTS_REDIRECTS = 5


def origin_of(url: str) -> str:
    """scheme://host[:port], the unit robots.txt speaks for (the default port left out)."""
    parts = httpx.URL(url)
    return f"{parts.scheme}://{parts.netloc.decode('ascii')}"


@dataclass(frozen=True)
class _Entry:
    robots: Robots
    expires: float
    unreachable: str | None = None   # why the file could not be had: everything is disallowed
    refused: Refused | None = None   # the guard refused it (`rules_for` raises it again)
    origin_refused: bool = False     # ...at the origin itself: its pages are refused as they connect


class RobotsCache:
    """robots.txt by origin, for one agent. An answer waits only while its origin's file is fetched."""

    def __init__(self, client: httpx.Client, *, agent: str, ttl_s: float, deadline_s: float,
                 clock: Callable[[], float] = time.monotonic, max_origins: int = MAX_ORIGINS):
        self.agent = agent
        self.ttl_s = ttl_s
        self.deadline_s = deadline_s
        self._client = client
        self._clock = clock
        self._max_origins = max_origins
        self._entries: OrderedDict[str, _Entry] = OrderedDict()   # least recently used first
        self._fetching: dict[str, Future[_Entry]] = {}
        self._lock = threading.Lock()

    def rules_for(self, url: str) -> Robots:
        """The origin's rules; `Refused` (remembered like an answer) when the guard refused its
        robots.txt, so that a reading can say why nothing of it was registered."""
        entry = self._entry(origin_of(url))
        if entry.refused is not None:
            raise Refused(str(entry.refused), url=entry.refused.url)
        return entry.robots

    def crawl_delay(self, url: str) -> float | None:
        return self.rules_for(url).crawl_delay(self.agent)

    def why_disallowed(self, url: str) -> str | None:
        """The reason this agent may not fetch `url`, worded for the push it fails; None if allowed."""
        origin = origin_of(url)
        entry = self._entry(origin)
        if entry.origin_refused:
            return None     # the hop is refused as it connects, with the guard's reason naming it
        reason = entry.robots.why_disallowed(url, self.agent)
        if reason and entry.refused is not None:
            return (f"robots.txt unreachable ({entry.unreachable}): "
                    f"nothing on {origin} is fetched while it points there")
        if reason and entry.unreachable:
            # RFC 9309 2.3.1.4 disallows everything then: say so, not "Disallow: /".
            return (f"robots.txt unreachable ({entry.unreachable}): "
                    f"nothing on {origin} is fetched until it answers")
        return reason

    def disallows_by_rule(self, url: str) -> bool:
        """Whether robots.txt as read disallows `url`: a verdict that stands until the file is read
        again (the TTL). An unreachable file's "nothing" is an outage, tried again in minutes."""
        entry = self._entry(origin_of(url))
        return entry.unreachable is None and not entry.robots.allowed(url, self.agent)

    def _entry(self, origin: str) -> _Entry:
        with self._lock:
            entry = self._fresh(origin)
            if entry is not None:
                return entry
            # One fetch per origin: whoever comes first fetches, the others wait for its answer.
            pending = self._fetching.get(origin)
            owner = pending is None
            if owner:
                pending = self._fetching[origin] = Future()
        if not owner:
            return pending.result()
        try:
            entry = self._fetch(origin)
        except BaseException as exc:
            with self._lock:
                del self._fetching[origin]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._fetching[origin]
            self._store(origin, entry)
        pending.set_result(entry)
        return entry

    def _fresh(self, origin: str) -> _Entry | None:
        entry = self._entries.get(origin)
        if entry is None or entry.expires <= self._clock():
            return None
        self._entries.move_to_end(origin)
        return entry

    def _store(self, origin: str, entry: _Entry) -> None:
        self._entries[origin] = entry
        self._entries.move_to_end(origin)
        while len(self._entries) > self._max_origins:
            self._entries.popitem(last=False)

    def _fetch(self, origin: str) -> _Entry:
        """The origin's rules by RFC 9309 2.3.1; one the guard refuses disallows everything."""
        try:
            with fetch(self._client, origin + "/robots.txt", deadline_s=self.deadline_s,
                       max_redirects=ROBOTS_REDIRECTS) as answer:
                if 200 <= answer.status < 300:
                    return _Entry(parse_robots(_head(answer)), self._clock() + self.ttl_s)
                status = answer.status
        except Refused as exc:
            # Disallow everything, for the whole TTL: a redirect the guard refuses is no
            # "no robots.txt" (that would let every page through).
            itself = exc.url is not None and origin_of(exc.url) == origin
            return _Entry(DISALLOW_ALL, self._clock() + self.ttl_s, str(exc), exc, itself)
        except FetchError as exc:
            return self._unreachable(str(exc))
        # 429 asks us to slow down, which says nothing of the rules: unreachable, as crawlers treat it.
        if 400 <= status < 500 and status != 429:
            return _Entry(ALLOW_ALL, self._clock() + self.ttl_s)
        return self._unreachable(f"answered {status}")

    def _unreachable(self, why: str) -> _Entry:
        return _Entry(DISALLOW_ALL, self._clock() + min(self.ttl_s, UNREACHABLE_TTL_S), why)


def _head(answer: Fetch) -> bytes:
    """The first MAX_ROBOTS_BYTES (plus one, so the parser knows it was cut): a larger file is
    read that far, never failed; inflation stops there too."""
    parts: list[bytes] = []
    size = 0
    for chunk in answer.chunks(sys.maxsize):
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_ROBOTS_BYTES:
            break
    return b"".join(parts)[: MAX_ROBOTS_BYTES + 1]
