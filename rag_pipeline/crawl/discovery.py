"""Discovery: one reading of a site's robots.txt and sitemaps, turned into pages.

Every file is fetched through the network guard and parsed as it streams in (`core.sitemaps`), so
no file is ever held whole; what it lists is staged in batches and applied in one transaction at
the end (`store.sites.apply_reading`). Sitemaps are untrusted: a file that fails is a reason on the
reading, and a reading with any failure (or cut by a cap) is incomplete, so it adds and updates
pages but never marks the pages it did not see as gone. Each reading also judges the site's known
pages by robots.txt as it read it (`store.disallowed`): a page it disallows leaves the recrawl queue
until the next reading, whatever crawls it (Crawlbase reads no robots.txt; a seed may come from
`rag-pipeline seed`, which reads none either), and one it allows again is due now.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import psycopg

from rag_pipeline.core.addresses import Network, host_refusal
from rag_pipeline.core.links import links_in
from rag_pipeline.core.retrying import reading_retry_s
from rag_pipeline.core.robots import DISALLOW_ALL, Robots
from rag_pipeline.core.sitemap_notes import served_note
from rag_pipeline.core.sitemaps import MAX_UNCOMPRESSED_BYTES, Entry, SitemapError, SitemapParser
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.core.urls import InvalidURL, normalize_url, page_id
from rag_pipeline.crawl.guarded_http import FetchError, Refused, fetch
from rag_pipeline.store import disallowed as robots_verdicts
from rag_pipeline.store import sites as store

log = logging.getLogger(__name__)

# Staged per COPY: bounds what a reading holds in memory, whatever the sitemaps list.
STAGE_ROWS = 5_000
# Pages judged by robots.txt per keyset read, their verdicts written in one short transaction.
JUDGE_ROWS = 5_000
# A sitemap index may list indexes (the protocol says it must not; some sites do): this deep.
MAX_INDEX_DEPTH = 2
# The figures a reading reports, in the order the UI plots them.
FIGURES = ("files_read", "files_failed", "listed", "in_scope", "new", "gone", "lastmod_moved", "disallowed",
           "over_cap", "out_of_scope", "invalid", "refused_address", "over_file_limit", "adopted",
           "claimed_by_other_site", "seeds_registered", "link_pages_read", "links_found", "new_from_links",
           "links_left_out", "unlisted_total", "pages_disallowed", "allowed_again")
# URLs left out of a reading, by why: those of the sitemaps (link discovery's are `links_left_out`).
LEFT_OUT = ("disallowed", "out_of_scope", "invalid", "refused_address")


@dataclass
class ReadingResult:
    reading_id: int
    complete: bool
    counts: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)   # a few URLs of each change

    @property
    def summary(self) -> str:
        # "gone" is what the reading no longer lists: each such page is crawled once, and that crawl
        # decides (404/410 tombstones it, 200 keeps it unlisted): `site show` counts each state.
        names = {"gone": "no longer listed"}
        shown = ", ".join(f"{self.counts[k]} {names.get(k, k.replace('_', ' '))}"
                          for k in ("listed", "new", "gone", "lastmod_moved") if k in self.counts)
        state = "complete" if self.complete else f"incomplete ({len(self.errors)} problem(s))"
        return f"{state}: {shown}"


class _Reader:
    def __init__(self, conn, client, spec: SiteSpec, robots_for, agent, every_for, allowed, deadline_s,
                 reading: store.Reading):
        self.conn, self.client, self.spec = conn, client, spec
        self.robots_for, self.agent, self.every_for = robots_for, agent, every_for
        self.allowed, self.deadline_s, self.reading = allowed, deadline_s, reading
        self.counts: Counter = Counter({k: 0 for k in FIGURES})
        self.errors: list[str] = []
        self.cut_short = False
        self._batch: list[store.Listed] = []
        self._robots: dict[str, Robots] = {}
        self._unreadable: set[str] = set()     # origins whose robots.txt this reading could not read
        self._refused: dict[str, str | None] = {}

    def robots(self, url: str) -> Robots:
        """The origin's robots.txt; one that cannot be read allows nothing and makes the reading
        incomplete, so the pages already known stay as they are."""
        origin = _origin(url)
        if origin not in self._robots:
            try:
                robots = self.robots_for(origin + "/robots.txt")
            except Refused as exc:
                robots = DISALLOW_ALL
                self._unreadable.add(origin)
                self.problem(f"{origin}/robots.txt: {exc}")
            else:
                if robots is DISALLOW_ALL:
                    self._unreadable.add(origin)
                    self.problem(f"{origin}/robots.txt could not be read (RFC 9309: nothing may be crawled "
                                 "meanwhile): none of its URLs registered this time")
            self._robots[origin] = robots
        return self._robots[origin]

    def sitemap_urls(self) -> list[tuple[str, int]]:
        """The declared sitemaps, then the `Sitemap:` lines of each start host's robots.txt."""
        urls = list(self.spec.sitemaps)
        if self.spec.robots_sitemaps:
            for origin in self.spec.robots_origins():
                urls.extend(self.robots(origin).sitemaps)
        return [(u, 0) for u in dict.fromkeys(u.strip() for u in urls)]

    def read(self) -> None:
        queue = self.sitemap_urls()
        seen: set[str] = set()
        while queue:
            url, depth = queue.pop(0)
            if url in seen:
                continue
            seen.add(url)
            if self.counts["files_read"] + self.counts["files_failed"] >= self.spec.max_sitemap_files:
                self.problem(f"more than {self.spec.max_sitemap_files} sitemap files (max_sitemap_files): "
                             f"{len(queue) + 1} not read")
                return
            children = self.read_file(url)
            if children is None:
                continue
            if depth + 1 > MAX_INDEX_DEPTH and children:
                self.problem(f"{url}: a sitemap index nested deeper than {MAX_INDEX_DEPTH}: its "
                             f"{len(children)} sitemap(s) not read")
                continue
            queue.extend((child.loc, depth + 1) for child in children)
            if self.cut_short:
                return

    def read_file(self, url: str) -> list[Entry] | None:
        """One sitemap file: its pages staged; a sitemap index's children returned."""
        refused = host_refusal(urlsplit(url).hostname or "", self.allowed)
        if refused:
            return self.failed(url, f"refused: {refused}")
        parser = SitemapParser()
        children: list[Entry] = []
        content_type = ""
        try:
            with fetch(self.client, url, deadline_s=self.deadline_s) as answer:
                content_type = answer.content_type
                if answer.status != 200:
                    return self.failed(url, f"answered {answer.status}")
                for chunk in answer.chunks(MAX_UNCOMPRESSED_BYTES):
                    self.take(parser.feed(chunk), parser, children)
                    if self.cut_short:
                        break
            if not self.cut_short:
                self.take(parser.close(), parser, children)
        except SitemapError as exc:
            return self.failed(url, f"{exc}{served_note(str(exc), content_type)}")
        except FetchError as exc:
            return self.failed(url, str(exc))
        self.counts["files_read"] += 1
        if parser.over_limit:
            self.counts["over_file_limit"] += parser.over_limit
            self.problem(f"{url}: lists more than the protocol's 50,000 URLs: {parser.over_limit} not read")
        return children

    def take(self, entries: list[Entry], parser: SitemapParser, children: list[Entry]) -> None:
        if parser.kind == "sitemapindex":
            children.extend(entries)
            return
        for entry in entries:
            self.page(entry)
            if self.cut_short:
                return

    def page(self, entry: Entry) -> None:
        self.counts["listed"] += 1
        if self.counts["listed"] > self.spec.max_listed_urls:
            self.cut_short = True
            self.problem(f"the sitemaps list more than {self.spec.max_listed_urls} URLs (max_listed_urls): "
                         "the rest not read")
            return
        listed = self.listed(entry.loc, entry.lastmod)
        if listed is not None:
            self._batch.append(listed)
            if len(self._batch) >= STAGE_ROWS:
                self.flush()

    def listed(self, loc: str, lastmod) -> store.Listed | None:
        """A URL as a row to stage, or None with the reason it is left out counted."""
        try:
            url = normalize_url(loc)
        except InvalidURL:
            self.counts["invalid"] += 1
            return None
        host = urlsplit(loc).hostname or ""
        if host not in self._refused:          # a site lists thousands of URLs on a few hosts
            self._refused[host] = host_refusal(host, self.allowed)
        if self._refused[host]:
            self.counts["refused_address"] += 1
            return None
        if not self.spec.in_scope(url):
            self.counts["out_of_scope"] += 1
            return None
        if not self.robots(loc.strip()).allowed(loc.strip(), self.agent):
            self.counts["disallowed"] += 1
            return None
        return store.Listed(page_id(url), url, loc.strip(), lastmod, self.spec.shard(url), self.every_for(url))

    def flush(self) -> None:
        with self.conn.transaction():
            store.stage(self.conn, self.reading.reading_id, self._batch)
        self._batch = []

    def follow_links(self, since) -> None:
        """Link discovery: the in-scope links of the site's pages that changed since the previous
        reading, one hop further each, within the depth limit and the page cap. The same filters
        as a sitemap's URLs (address, scope, robots.txt)."""
        found: dict[str, store.Listed] = {}
        # The left-out figures are the sitemaps'; what the links lead to that is left out is
        # counted apart (`links_left_out`), so a reading's line adds up.
        before = {k: self.counts[k] for k in LEFT_OUT}

        def register() -> None:
            added, over = store.register_links(self.conn, self.spec.name, list(found.values()),
                                               max_pages=self.spec.max_pages)
            self.counts["new_from_links"] += added
            self.counts["over_cap"] += over
            found.clear()

        for crawl_url, text, depth in store.link_sources(self.conn, self.spec.name, max_depth=self.spec.link_depth,
                                                         since=since):
            self.counts["link_pages_read"] += 1
            for link in links_in(text, crawl_url):
                listed = self.listed(link, None)
                if listed is not None and listed.url not in found:
                    self.counts["links_found"] += 1
                    found[listed.url] = replace(listed, depth=depth + 1)
            if len(found) >= STAGE_ROWS:
                register()
        register()
        for k in LEFT_OUT:
            self.counts["links_left_out"] += self.counts[k] - before[k]
            self.counts[k] = before[k]

    def judge_pages(self) -> None:
        """The site's known pages by robots.txt as this reading read it: those it disallows held
        out of the queue past the next reading, those it allows again due now. A page whose
        robots.txt could not be read is left as it was (an outage is no verdict). Every robots.txt
        is read first, outside any transaction; then the pages are read a keyset batch at a time
        and each batch's verdicts written in a short transaction of their own, so a pass over a
        large site keeps no snapshot open and no page row locked (batch runs lock those rows)."""
        # Pages on the site's start hosts, or on a host this reading read robots.txt of already:
        # another host's robots.txt is the crawler's to read (a reading is not failed by it).
        for origin in self.spec.robots_origins():
            if origin not in {o.lower() for o in self._robots} and \
                    robots_verdicts.has_pages_on(self.conn, self.spec.name, origin):
                self.robots(origin)
        unreadable = {o.lower() for o in self._unreadable}
        judges = {o.lower(): r for o, r in self._robots.items() if o.lower() not in unreadable}
        after = None
        while batch := robots_verdicts.site_pages(self.conn, self.spec.name, after, JUDGE_ROWS):
            after = batch[-1][0]
            disallowed: dict[str, str] = {}
            allowed: list[str] = []
            for _, url, crawl_url, marked_for in batch:
                # A page the crawler found disallowed at a hop of its redirect is judged by that hop
                # when it is on the page's origin; elsewhere the crawler's own hold decides.
                judged_url = marked_for or crawl_url
                origin = _origin(judged_url)
                robots = judges.get(origin.lower())
                if robots is None or origin != _origin(crawl_url):
                    continue
                rule = robots.why_disallowed(judged_url, self.agent)
                if rule and judged_url == crawl_url:
                    disallowed[url] = rule
                elif not rule and marked_for is not None:
                    allowed.append(url)
            marked, released = robots_verdicts.judged(self.conn, self.spec.name, disallowed, allowed,
                                                      holds=2 * self.spec.discover_every)
            self.counts["pages_disallowed"] += marked
            self.counts["allowed_again"] += released

    def failed(self, url: str, reason: str) -> None:
        self.counts["files_failed"] += 1
        self.problem(f"{url}: {reason}")
        return None

    def problem(self, reason: str) -> None:
        log.warning("site %s: %s", self.spec.name, reason)
        self.errors.append(reason)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def read_site(conn: psycopg.Connection, client: httpx.Client, spec: SiteSpec, *,
              robots_for: Callable[[str], Robots], agent: str, every_for: Callable[[str], timedelta],
              allowed: tuple[Network, ...] = (), deadline_s: float = 300.0,
              run_id: str | None = None) -> ReadingResult:
    """Read `spec`'s robots.txt and sitemaps once and apply what they list. Never raises for what
    the site serves: each problem is a reason in the result (and on the reading's row)."""
    previous = store.newest_reading(conn, spec.name)
    with conn.transaction():
        reading = store.begin_reading(conn, spec.name, run_id)
    reader = _Reader(conn, client, spec, robots_for, agent, every_for, allowed, deadline_s, reading)
    reader.read()
    reader.flush()
    seeds = [row for row in (reader.listed(url, None) for url in spec.seeds) if row is not None]
    with conn.transaction():
        reader.counts["seeds_registered"] = store.register_seeds(conn, spec, seeds)
    # Before the listing is applied: a page robots.txt now disallows is no page "no longer listed".
    reader.judge_pages()
    complete = not reader.errors
    counts, examples = store.apply_reading(conn, reading, max_pages=spec.max_pages, complete=complete)
    reader.counts.update(counts)
    if spec.link_depth:
        # Every page again when the previous reading failed: its links may never have been read.
        since = previous.started_at if previous is not None and previous.complete else None
        reader.follow_links(since)
    if reader.counts["over_cap"]:
        reader.problem(f"{reader.counts['over_cap']} new URL(s) over the site's page cap ({spec.max_pages}): "
                       "not registered")
    next_in = spec.discover_every
    if not complete:    # soon, and later with each failed reading in a row (core/retrying.py)
        failures = store.incomplete_in_a_row(conn, spec.name) + 1
        next_in = timedelta(seconds=reading_retry_s(spec.discover_every.total_seconds(), failures))
    store.finish_reading(conn, reading, complete=complete, counts=dict(reader.counts), errors=reader.errors,
                         next_in=next_in)
    return ReadingResult(reading.reading_id, complete, reader.counts, reader.errors, examples)
