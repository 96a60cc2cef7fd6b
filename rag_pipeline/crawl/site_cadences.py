"""Whose recrawl rules a page follows: its site's `cadence:` block where the site declares one, else
the deployment's (CADENCE_FILE). Discovery, the recrawl sensor, the cadence refresh, seeding and
`cadence show` all ask here, so a site's rules hold wherever its pages are scheduled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psycopg

from rag_pipeline.core.site_spec import SiteError
from rag_pipeline.crawl.cadence_rules import CadenceError, CadenceRules, Rule, load_rules, rules_from
from rag_pipeline.store import sites


@dataclass(frozen=True)
class SiteRules:
    deployment: CadenceRules
    sites: Mapping[str, CadenceRules] = field(default_factory=dict)

    def of(self, site: str | None) -> CadenceRules:
        return self.sites.get(site, self.deployment) if site else self.deployment

    def rule_for(self, normalized_url: str, site: str | None) -> Rule:
        return self.of(site).rule_for(normalized_url)

    def every_for(self, normalized_url: str, site: str | None) -> timedelta:
        return self.of(site).every_for(normalized_url)

    @property
    def tombstone_recheck(self) -> timedelta:
        return self.deployment.tombstone_recheck


def site_cadence(block: dict | None, site: str) -> CadenceRules | None:
    """A site's `cadence:` block as rules (None: it has none), or a SiteError naming the site."""
    if block is None:
        return None
    if isinstance(block, dict) and "tombstone_recheck" in block:
        # claim_due re-checks every tombstone at one pace; a site's own would be silently ignored.
        raise SiteError(f"site {site}: cadence: tombstone_recheck is set for the whole deployment "
                        "(CADENCE_FILE), not per site", ("cadence", "tombstone_recheck"))
    try:
        return rules_from(block, f"site {site}: cadence")
    except CadenceError as exc:
        raise SiteError(str(exc), ("cadence",)) from None


def load_site_rules(conn: psycopg.Connection, path: Path | None) -> SiteRules:
    """The deployment's rules and every declared site's own, as each site's discovery sensor last
    stored its declaration."""
    return SiteRules(load_rules(path), {name: site_cadence(block, name)
                                        for name, block in sites.cadence_blocks(conn).items()})
