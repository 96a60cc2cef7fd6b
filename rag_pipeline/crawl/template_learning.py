"""Learning a site's template from its stored pages, in its discovery run or when an operator asks.

After a reading, the site's template is learned again when it never was, when it is older than the
site's ``template_every``, or when its live pages moved by more than 10% (core/template_rows.py).
The sources are streamed from the database (store/site_templates.py) into ``learn_from``; what is
learned replaces the stored template in one transaction. A learning that fails never fails the
reading: the old template stays, and the failure is recorded and said (metadata, log, `site show`).

What is learned is not used by change detection or chunking yet: it is shown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

import psycopg

from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.core.site_template import Template, learn_from
from rag_pipeline.core.template_rows import learning_due
from rag_pipeline.core.urls import InvalidURL, normalize_url
from rag_pipeline.store import site_templates as store

log = logging.getLogger(__name__)


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


def own_site(spec: SiteSpec):
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
    started = time.monotonic()
    stored = store.load(conn, spec.name)
    old = stored.template if stored else None
    learned_at = stored.learned_at if stored else None
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
                            f"pages, within template_every and the page count", old, learned_at)
    try:
        template = learn_from(store.live_sources(conn, spec.name), own_site(spec), pins=spec.template_pins)
        learned_at = store.replace(conn, spec.name, template)
    except Exception as exc:   # a failed learning must not fail the reading: said, recorded, old kept
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        log.warning("%s: template learning failed: %s", spec.name, error, exc_info=True)
        try:
            store.note_failure(conn, spec.name, error)
        except psycopg.Error as noted:
            log.warning("%s: could not record the failed learning: %s", spec.name, noted)
        return Learning(spec.name, "failed", reason, old, stored.learned_at if stored else None,
                        time.monotonic() - started, error)
    return Learning(spec.name, "learned", reason, template, learned_at, time.monotonic() - started)
