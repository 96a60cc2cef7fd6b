"""What routing writes for a chunk of deliveries, held and written a set at a time: the new
pages, the crawls noted, the unchanged pages stamped (their source reset where a failed run left
another), what the hash gate learned of the pages it compared (and the newest text of those
whose content did not move), the older deliveries superseded and each delivery's outcome. Eight
statements for the chunk, instead of three or four for each delivery.

A write waits only while nothing reads what it changes: routing flushes before it routes a page
that has writes waiting (a second delivery of the page in the chunk), and before any write it
makes directly (a tombstone, a redirect), so every read and every direct write sees the writes
of the deliveries routed before it, in receipt order, as when each was written at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import psycopg

from rag_pipeline.store import deliveries, pages


@dataclass
class RoutingWrites:
    conn: psycopg.Connection
    _new_pages: list[tuple] = field(default_factory=list)
    _crawls: list[tuple] = field(default_factory=list)
    _sources: list[tuple] = field(default_factory=list)
    _verified: list[tuple] = field(default_factory=list)
    _supersede: list[tuple[str, int]] = field(default_factory=list)
    _marks: list[tuple] = field(default_factory=list)
    _keys: list[tuple] = field(default_factory=list)
    _refreshed: list[tuple] = field(default_factory=list)
    _touched: set[str] = field(default_factory=set)

    def waiting_on(self, urls) -> bool:
        """Whether a write to one of these pages is held (then flush before reading them)."""
        return not self._touched.isdisjoint(urls)

    def touch(self, urls) -> None:
        self._touched.update(urls)

    def ensure_page(self, pid: UUID, url: str, crawl_url: str, site: str | None, shard: int | None,
                    discovered_by: str) -> None:
        self._new_pages.append((pid, url, crawl_url, site, shard, discovered_by))
        self._touched.add(url)

    def note_crawl(self, pid: UUID, url: str, crawled_at: datetime, digest: str) -> None:
        self._crawls.append((pid, crawled_at, digest))
        self._touched.add(url)

    def set_source(self, pid: UUID, url: str, text: str, digest: str, delivery_id: int,
                   original_status: int | None) -> None:
        self._sources.append((pid, text, digest, delivery_id, original_status))
        self._touched.add(url)

    def stamp_verified(self, pid: UUID, url: str, delivery_id: int, original_status: int | None) -> None:
        self._verified.append((pid, delivery_id, original_status))
        self._touched.add(url)

    def content_key(self, pid: UUID, url: str, key: str | None, tag: str | None, volatile_counts: dict) -> None:
        """What the hash gate learned of the page: its source's key (None: the cached one holds)
        and its volatile history."""
        self._keys.append((pid, key, tag, volatile_counts))
        self._touched.add(url)

    def refresh_source(self, pid: UUID, url: str, text: str, digest: str, delivery_id: int,
                       original_status: int | None, key: str, tag: str, volatile_counts: dict) -> None:
        """The content is what is indexed, the text moved: the newest text kept as the source."""
        self._refreshed.append((pid, text, digest, delivery_id, original_status, key, tag, volatile_counts))
        self._touched.add(url)

    def supersede_older(self, page_url: str, delivery_id: int) -> None:
        self._supersede.append((page_url, delivery_id))
        self._touched.add(page_url)

    def mark(self, delivery_id: int, outcome: str, *, page_url: str | None = None, error: str | None = None,
             text: str | None = None, text_hash: str | None = None, crawled_at: datetime | None = None) -> None:
        self._marks.append((delivery_id, outcome, page_url, error, text, text_hash, crawled_at))

    def flush(self) -> None:
        """Everything held, in the order routing made it: pages exist before their crawls are noted."""
        held = (self._new_pages, self._crawls, self._sources, self._keys, self._refreshed, self._verified,
                self._supersede, self._marks)
        (self._new_pages, self._crawls, self._sources, self._keys, self._refreshed, self._verified,
         self._supersede, self._marks) = ([], [], [], [], [], [], [], [])
        self._touched = set()
        new_pages, crawls, sources, keys, refreshed, verified, supersede, marks = held
        pages.ensure_many(self.conn, new_pages)
        pages.note_crawls(self.conn, crawls)
        pages.set_sources(self.conn, sources)
        pages.set_content_keys(self.conn, keys)
        pages.refresh_sources(self.conn, refreshed)
        pages.stamp_verified_many(self.conn, verified)
        deliveries.supersede_older_many(self.conn, supersede)
        deliveries.mark_many(self.conn, marks)
