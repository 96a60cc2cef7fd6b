"""Which pages a code location serves (LOCATION_HOLDS), for a deployment that spreads its sites
over several code locations, each on a host of its own.

With Dagster's default run launcher a run executes beside the code server of its location: a
location per site (or per shard of a large site) puts each site's batch runs on that site's host.
`main` is everything that is not one site's: the catch-all's pages and the index-wide objects (the
`index` asset and its checks, recrawl pushes, snapshots, maintenance, the HNSW upkeep). Exactly one
location must hold `main`; every site must be held by one location.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

ALL = "all"
MAIN = "main"
_TOKEN = re.compile(r"^(?P<site>[a-z][a-z0-9_]*)(?::(?P<shard>\d+))?$")


class HoldsError(ValueError):
    """LOCATION_HOLDS names something that cannot be held; the message is one line."""


@dataclass(frozen=True)
class Holds:
    """`everything`: the single-location default. Otherwise `main`, whole `sites`, and single
    `shards` as (site, shard) pairs."""

    everything: bool = True
    main: bool = True
    sites: frozenset[str] = field(default_factory=frozenset)
    shards: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    # The declared sites and their shard counts, when known: `main` then also holds the pages of
    # a site no longer declared (or of a shard past its count), which no location could name.
    declared: tuple[tuple[str, int], ...] | None = None

    def with_declared(self, declared: dict[str, int]) -> Holds:
        return replace(self, declared=tuple(sorted(declared.items())))

    def holds_main(self) -> bool:
        return self.everything or self.main

    def holds_site(self, site: str) -> bool:
        """Any of the site: its discovery goes with the location that holds it, or its shard 0."""
        return self.everything or site in self.sites or (site, 0) in self.shards

    def holds_page(self, site: str | None, shard: int | None) -> bool:
        """Whether this location's batch runs apply a page of `site`/`shard` (None: the catch-all)."""
        if self.everything:
            return True
        if site is None:
            return self.main
        return site in self.sites or (site, shard if shard is not None else 0) in self.shards

    def check_against(self, declared: dict[str, int]) -> None:
        """Every site and shard named is declared (name → its number of shards)."""
        for site in sorted(self.sites | {s for s, _ in self.shards}):
            if site not in declared:
                known = ", ".join(sorted(declared)) or "none"
                raise HoldsError(f"LOCATION_HOLDS names the site {site!r}, which is not declared "
                                 f"(declared: {known})")
        for site, shard in sorted(self.shards):
            if shard >= declared[site]:
                raise HoldsError(f"LOCATION_HOLDS names {site}:{shard}, but {site} has "
                                 f"{declared[site]} shard(s) (0 to {declared[site] - 1})")

    def describe(self) -> str:
        if self.everything:
            return ALL
        parts = ([MAIN] if self.main else []) + sorted(self.sites) + [f"{s}:{n}" for s, n in sorted(self.shards)]
        return ",".join(parts)


def parse_holds(text: str) -> Holds:
    """`all` (the default), or a comma-separated list of `main`, site names and `site:shard`."""
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    if not tokens or tokens == [ALL]:
        return Holds()
    if ALL in tokens:
        raise HoldsError("LOCATION_HOLDS: 'all' cannot be combined with other entries")
    main = False
    sites: set[str] = set()
    shards: set[tuple[str, int]] = set()
    for token in tokens:
        if token == MAIN:
            main = True
            continue
        match = _TOKEN.match(token)
        if match is None:
            raise HoldsError(f"LOCATION_HOLDS: {token!r} is not 'main', a site name or site:shard")
        if match["shard"] is None:
            sites.add(match["site"])
        else:
            shards.add((match["site"], int(match["shard"])))
    both = sorted({s for s, _ in shards} & sites)
    if both:
        raise HoldsError(f"LOCATION_HOLDS names {both[0]} both whole and by shard")
    return Holds(everything=False, main=main, sites=frozenset(sites), shards=frozenset(shards))
