"""Learning a site's template from its stored pages: in its discovery run, in the batch runs of
its first load, or when an operator asks.

After a reading, the site's template is learned again when it never was, when it is older than the
site's ``template_every``, or when its live pages moved by more than 10% (core/template_rows.py).
A young site is learned by its batch runs (``learn_young_sites``) before they cut its pages. The
sources are streamed from the database (store/site_templates.py) into ``learn_from``, a sample of
at most ``SAMPLE`` pages; what is learned replaces the stored template in one transaction. A
learning that fails never fails the reading or the run: the old template stays, and the failure is
recorded and said (metadata, log, `site show`).

Routing compares crawls past the template (core/content_gate.py) and the chunks are cut without it
(core/template_strip.chunk_source).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from rag_pipeline.core.site_spec import SiteScope, SiteSpec
from rag_pipeline.core.site_template import Template, learn_from, sections_below
from rag_pipeline.core.template_pins import parse_pins
from rag_pipeline.core.template_rows import learning_due
from rag_pipeline.core.urls import InvalidURL, normalize_url
from rag_pipeline.store import site_templates as store
from rag_pipeline.store import sites

log = logging.getLogger(__name__)

# Pages a template is learned from at most: the first by page id, a sample spread over the site
# (store/site_templates.py live_sources). Blocks on half the pages are as plain in 2,000 pages as
# in 100,000, and learning stays seconds and tens of MB whatever the site's size.
SAMPLE = 2_000
# A site is learned in its first load once it has this many live pages (core/site_template.py
# needs MIN_PAGES pages to call a block template; a few more make the share meaningful).
YOUNG_FROM = 20
# A young site whose learning failed is tried again by a batch run after this long.
RETRY_FAILED = timedelta(minutes=10)


@dataclass(frozen=True)
class Learning:
    """What one look at a site's template did: ``outcome`` learned, kept (not due) or failed, and
    why; ``template`` is the one stored afterwards (the new one, or the old one kept)."""

    site: str
    outcome: str
    reason: str
    template: Template | None
    learned_at: datetime | None
    seconds: float = 0.0
    error: str | None = None

    @property
    def summary(self) -> str:
        if self.outcome == "learned":
            return (f"{self.site}: template learned ({self.reason}) from {self.template.pages} pages in "
                    f"{self.seconds:.1f}s: {len(self.template.blocks)} blocks")
        if self.outcome == "failed":
            kept = "the template learned before is kept" if self.template is not None else "no template yet"
            return f"{self.site}: template learning failed ({self.reason}): {self.error}; {kept}"
        return f"{self.site}: template not learned again: {self.reason}"


def own_site(spec: SiteSpec | SiteScope):
    """Whether a link (as written in a page: http or https, any case) is to the site's own pages."""

    def is_own(url: str) -> bool:
        try:
            return spec.in_scope(normalize_url(url))
        except (InvalidURL, ValueError):
            return False

    return is_own


def learn_site(conn: psycopg.Connection, spec: SiteSpec, *, force: bool = False) -> Learning:
    """Learn the site's template if it is due (or ``force``), and store it. Never raises for a
    failed learning: it comes back as outcome "failed", the stored template untouched."""
    stored = store.load(conn, spec.name)
    old = stored.template if stored else None
    pages_now = store.live_count(conn, spec.name)
    if force:
        reason = "asked for"
    elif stored is None or stored.learned_at is None:
        reason = "never learned" if pages_now else None
        if reason is None:
            return Learning(spec.name, "kept", "no page has a stored source yet", None, None)
    else:
        reason = learning_due(stored.learned_at, old.pages, pages_now, stored.now, spec.template_every)
        if reason is None:
            return Learning(spec.name, "kept", f"learned {stored.learned_at:%Y-%m-%d %H:%M} from {old.pages} "
                            f"pages, within template_every and the page count", old, stored.learned_at)
    return _learn(conn, spec.name, own_site(spec), spec.template_pins, reason, stored)


def learn_young_sites(conn: psycopg.Connection, page_urls) -> list[Learning]:
    """In a batch run, after its sources are stored and before they are cut: learn the template
    of each of these pages' sites that is young, so that a site's first load is cut without its
    template from its first batches on, not only after its next discovery run. Young: never
    learned and at least ``YOUNG_FROM`` live pages, or learned from fewer than ``SAMPLE`` pages and
    grown to twice as many since (a few learnings over a whole first load, each of at most
    ``SAMPLE`` pages). A site another run is learning is left to it."""
    done = []
    scopes = {scope.name: scope for scope in sites.declared_scopes(conn)}
    for name in store.sites_of(conn, page_urls):
        if name not in scopes or not store.try_learning_lock(conn, name):
            continue
        try:
            # Every batch looks: the header only (no blocks), and the pages counted only when a
            # learning could be due.
            pages_then, failed_at, now = store.header(conn, name) or (None, None, None)
            if pages_then is None:
                if failed_at is not None and now - failed_at < RETRY_FAILED:
                    continue
                pages_now = store.live_count(conn, name)
                due, reason = pages_now >= YOUNG_FROM, f"a young site: {pages_now} pages, never learned"
            elif pages_then < SAMPLE:
                pages_now = store.live_count(conn, name)
                due, reason = pages_now >= 2 * pages_then, f"a young site: grown from {pages_then} to {pages_now} pages"
            else:
                continue
            if due:
                pins = parse_pins(store.declared_pins(conn, name))
                done.append(_learn(conn, name, own_site(scopes[name]), pins, reason, store.load(conn, name)))
        finally:
            store.learning_unlock(conn, name)
    return done


def _learn(conn: psycopg.Connection, site: str, is_own, pins, reason: str, stored) -> Learning:
    started = time.monotonic()
    old = stored.template if stored else None
    try:
        sample = list(store.live_sources(conn, site, limit=SAMPLE))   # SAMPLE pages: tens of MB at most
        sample.sort()
        template = learn_from(sample, is_own, pins=pins, section_of=sections_below(url for url, _ in sample))
        learned_at = store.replace(conn, site, template)
    except Exception as exc:   # a failed learning must not fail the reading: said, recorded, old kept
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        log.warning("%s: template learning failed: %s", site, error, exc_info=True)
        try:
            store.note_failure(conn, site, error)
        except psycopg.Error as noted:
            log.warning("%s: could not record the failed learning: %s", site, noted)
        return Learning(site, "failed", reason, old, stored.learned_at if stored else None,
                        time.monotonic() - started, error)
    learning = Learning(site, "learned", reason, template, learned_at, time.monotonic() - started)
    log.info("%s", learning.summary)
    return learning
