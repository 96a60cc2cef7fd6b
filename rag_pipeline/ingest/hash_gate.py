"""The hash gate: whether a content crawl of an indexed page is unchanged (a timestamp, no run).

First by the normalized text's hash against what is indexed; when the text moved, by content key,
past the site's learned template and the page's confirmed volatile lines (core/content_gate.py).
An unchanged crawl is settled here, its writes held in the chunk's RoutingWrites.
"""

from __future__ import annotations

from dataclasses import dataclass

from rag_pipeline.core import content_gate
from rag_pipeline.ingest.routing_writes import RoutingWrites


@dataclass(frozen=True)
class Crawl:
    """A content crawl as routing reads it: its delivery, page, normalized text and hash."""

    delivery: object
    page: object          # store.pages.Page, indexed and with no delivery queued
    pid: object
    page_url: str
    text: str
    digest: str
    crawled_at: object


def settle(writes: RoutingWrites, crawl: Crawl, templates: dict, site: str | None) -> str | None:
    """"unchanged" when the crawl is settled so (its writes held); else None: a change, for a run."""
    page, delivery = crawl.page, crawl.delivery
    if page.indexed_hash == crawl.digest:
        if page.source_hash != crawl.digest:
            # A failed run left a newer source the site has since reverted: the newest crawl wins.
            writes.set_source(crawl.pid, crawl.page_url, crawl.text, crawl.digest, delivery.id,
                              delivery.original_status)
        # Noted by its content key where it has one: a template move is no change to its change rate.
        return unchanged(writes, crawl, page.content_key or crawl.digest)
    if page.source_hash != page.indexed_hash or page.source_text is None:
        return None
    template, learned_at = templates.get(site, (None, None))
    gate = content_gate.compare(page.source_text, crawl.text, crawl.page_url, template, learned_at,
                                page.volatile_counts or {}, page.content_key, page.content_key_tag)
    if not gate.unchanged:
        writes.content_key(crawl.pid, crawl.page_url, gate.old_key if gate.recomputed else None,
                           gate.tag if gate.recomputed else None, gate.volatile_counts)
        return None
    # The newest text becomes the source (what is learned and re-chunked is the site as it is
    # now), with its key and volatile history; the chunks stay, and so does last_changed_at.
    writes.refresh_source(crawl.pid, crawl.page_url, crawl.text, crawl.digest, delivery.id,
                          delivery.original_status, gate.new_key, gate.tag, gate.volatile_counts)
    return unchanged(writes, crawl, gate.new_key)


def unchanged(writes: RoutingWrites, crawl: Crawl, crawl_hash: str) -> str:
    delivery = crawl.delivery
    writes.stamp_verified(crawl.pid, crawl.page_url, delivery.id, delivery.original_status)
    writes.note_crawl(crawl.pid, crawl.page_url, crawl.crawled_at, crawl_hash)
    writes.supersede_older(crawl.page_url, delivery.id)  # a failed one awaiting its retry
    writes.mark(delivery.id, "unchanged", page_url=crawl.page_url, crawled_at=crawl.crawled_at)
    return "unchanged"
