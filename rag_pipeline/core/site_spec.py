"""A site: what an operator declares (where its pages are listed, what is in scope, how large it may
grow), and where its pages live in Dagster (asset keys and partition sets). Pure: no I/O.

A page belongs to one site. Pages of no declared site belong to the catch-all (`site` NULL in the
database), which keeps the asset keys `pages`, `chunks`, `embeddings` and the partition set
`pages` of the deployments that came before sites.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from rag_pipeline.core.urls import InvalidURL, normalize_url

__all__ = ["PARTITION_CEILING", "SiteError", "SiteSpec", "SiteScope", "shard_of", "partition_set",
           "asset_prefix", "CATCH_ALL_PARTITIONS", "locate"]

# Keys one dynamic partition set may hold while the UI's asset pages stay responsive: its lineage
# and partition-health queries grow ~30 µs a key and take 3-10 s at 300,000 keys (Dagster 1.13.27,
# measured; see docs/architecture.md). A larger site is split into shards of at most this many.
PARTITION_CEILING = 100_000
CATCH_ALL_PARTITIONS = "pages"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# Words of LOCATION_HOLDS (core/location_holds.py), which would be ambiguous as site names.
RESERVED_NAMES = frozenset({"all", "main"})


class SiteError(ValueError):
    """A site declaration that cannot work; the message names the field, and `field` holds it
    apart (with the item's index for a list), so a file's problem can point at its line."""

    def __init__(self, message: str, field: tuple = ()):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SiteSpec:
    name: str
    sitemaps: tuple[str, ...] = ()
    seeds: tuple[str, ...] = ()
    robots_sitemaps: bool = True          # also read the `Sitemap:` lines of each start host's robots.txt
    include: tuple[str, ...] = ()         # globs over normalized URLs; empty: the start hosts
    exclude: tuple[str, ...] = ()
    max_pages: int = PARTITION_CEILING
    discover_every: timedelta = timedelta(days=1)
    link_depth: int = 0                   # follow in-scope links this many hops; 0: off
    boilerplate: tuple = ()               # rule mappings in boilerplate.yaml's form, for this site's pages
    crawler: str | None = None            # "local" or "crawlbase"; None: the deployment's CRAWLER
    cadence: dict | None = None           # recrawl rules in cadence.yaml's form; None: CADENCE_FILE's
    shards: int = 1
    max_sitemap_files: int = 1_000
    max_listed_urls: int = 2_000_000
    template_every: timedelta = timedelta(days=1)   # how often its template is learned again at most
    template_pins: tuple = ()             # core.template_pins.Pin: the operator's word on template blocks
    # The scope actually applied (include, or the start hosts), fixed at construction.
    scope: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise SiteError(f"site name {self.name!r}: use lower-case letters, digits and _ "
                            "(starting with a letter, at most 40): it becomes asset keys and partition names",
                            ("name",))
        if self.name in RESERVED_NAMES:
            raise SiteError(f"site name {self.name!r} is reserved (LOCATION_HOLDS uses it): choose another",
                            ("name",))
        for what, urls in (("sitemaps", self.sitemaps), ("seeds", self.seeds)):
            for index, url in enumerate(urls):
                try:
                    normalize_url(url)
                except InvalidURL as exc:
                    raise SiteError(f"site {self.name}: {what}: {exc}", (what, index)) from None
        if not (self.sitemaps or self.seeds):
            raise SiteError(f"site {self.name}: declare at least one of sitemaps or seeds (where its pages start)",
                            ("sitemaps",))
        if self.max_pages < 1:
            raise SiteError(f"site {self.name}: max_pages must be at least 1", ("max_pages",))
        if not 1 <= self.shards <= 1_000:
            raise SiteError(f"site {self.name}: shards must be between 1 and 1000", ("shards",))
        if self.crawler not in (None, "local", "crawlbase"):
            raise SiteError(f"site {self.name}: crawler must be local or crawlbase, not {self.crawler!r}",
                            ("crawler",))
        try:
            site_boilerplate(self.boilerplate)
        except ValueError as exc:
            raise SiteError(f"site {self.name}: boilerplate: {exc}", ("boilerplate",)) from None
        if not 0 <= self.link_depth <= 20:
            raise SiteError(f"site {self.name}: link_depth must be between 0 (off) and 20", ("link_depth",))
        if self.discover_every < timedelta(minutes=1):
            raise SiteError(f"site {self.name}: discover_every must be at least 1m", ("discover_every",))
        if self.template_every < timedelta(minutes=1):
            raise SiteError(f"site {self.name}: template_every must be at least 1m", ("template_every",))
        scope = self.include or tuple(f"{origin}{tail}" for origin in self.start_origins() for tail in ("", "/*"))
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "_rule", SiteScope(self.name, scope, self.exclude, self.shards))

    @staticmethod
    def shards_for(max_pages: int) -> int:
        """Enough shards that none holds more than PARTITION_CEILING keys at the page cap."""
        return max(1, math.ceil(max_pages / PARTITION_CEILING))

    def start_origins(self) -> tuple[str, ...]:
        """The normalized `https://host[:port]` of every start URL, in order, once each."""
        origins = []
        for url in (*self.sitemaps, *self.seeds):
            parts = urlsplit(normalize_url(url))
            origins.append(f"{parts.scheme}://{parts.netloc}")
        return tuple(dict.fromkeys(origins))

    def robots_origins(self) -> tuple[str, ...]:
        """Where robots.txt is read: the start URLs' origins as they are crawled (scheme kept)."""
        origins = []
        for url in (*self.sitemaps, *self.seeds):
            parts = urlsplit(url.strip())
            origins.append(f"{parts.scheme.lower()}://{parts.netloc.lower()}")
        return tuple(dict.fromkeys(origins))

    def scope_rule(self) -> "SiteScope":
        return self._rule

    def in_scope(self, page_url: str) -> bool:
        """`page_url` normalized; `*` matches across `/`, as in cadence rules."""
        return self.scope_rule().in_scope(page_url)

    def shard(self, page_url: str) -> int | None:
        return self.scope_rule().shard(page_url)

    def partition_set(self, shard: int | None) -> str:
        return partition_set(self.name, shard)

    def asset_prefix(self, shard: int | None) -> list[str]:
        return asset_prefix(self.name, shard)

    def origin(self) -> str | None:
        """scheme://host[:port] of its first sitemap or seed: where a labelled question's `/path` is."""
        from urllib.parse import urlsplit

        start = next(iter((*self.sitemaps, *self.seeds)), None)
        if start is None:
            return None
        parts = urlsplit(start)
        return f"{parts.scheme}://{parts.netloc}"


def site_boilerplate(rules) -> list:
    """A site's own boilerplate rules (mappings in boilerplate.yaml's form) as rules."""
    from rag_pipeline.core.text import parse_boilerplate_rules

    return parse_boilerplate_rules(json.dumps(list(rules))) if rules else []


def shard_of(page_url: str, shards: int) -> int:
    """Stable across processes and releases (not Python's salted hash())."""
    digest = hashlib.blake2b(page_url.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def partition_set(site: str | None, shard: int | None) -> str:
    """The dynamic partition set a page's partition is in."""
    if site is None:
        return CATCH_ALL_PARTITIONS
    return f"{site}__pages" if shard is None else f"{site}__pages_{shard:02d}"


def asset_prefix(site: str | None, shard: int | None) -> list[str]:
    """The key prefix of a page's `pages`, `chunks` and `embeddings` assets."""
    if site is None:
        return []
    return [site] if shard is None else [site, f"shard_{shard:02d}"]


@dataclass(frozen=True)
class SiteScope:
    """What routing and seeding need of a declared site (its row in `sites`): is a URL in it, and
    in which shard."""

    name: str
    scope: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    shards: int = 1

    def in_scope(self, page_url: str) -> bool:
        return (any(fnmatchcase(page_url, glob) for glob in self.scope)
                and not any(fnmatchcase(page_url, glob) for glob in self.exclude))

    def shard(self, page_url: str) -> int | None:
        return shard_of(page_url, self.shards) if self.shards > 1 else None


def locate(page_url: str, sites) -> tuple[str | None, int | None]:
    """(site, shard) of a page first seen outside discovery (a seed, a redirect target): the first
    declared site, by name, whose scope holds it, else the catch-all's (None, None)."""
    for site in sorted(sites, key=lambda s: s.name):
        if site.in_scope(page_url):
            return site.name, site.shard(page_url)
    return None, None
