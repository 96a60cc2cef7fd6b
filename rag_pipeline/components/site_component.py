"""The site component: one YAML file per web site under `rag_pipeline/defs/sites/<name>/defs.yaml`
(`dg scaffold defs SiteComponent sites/<name> --sitemap URL`), turned into the site's own asset
group: discovery → pages → chunks → embeddings, each page on the site's partition set (or its
shard's), plus the sensor that reads the site on its cadence.

No `from __future__ import annotations` here: Dagster's resolver reads these annotations at run time.
"""

from typing import Optional

import dagster as dg
from pydantic import Field, PrivateAttr

from rag_pipeline.core.site_spec import PARTITION_CEILING, SiteError, SiteSpec
from rag_pipeline.crawl.cadence_rules import CadenceError, CadenceRules, format_interval, parse_interval
from rag_pipeline.crawl.site_cadences import site_cadence

class SiteScaffoldParams(dg.Model):
    sitemap: Optional[str] = None
    seed: Optional[str] = None


class SiteScaffolder(dg.Scaffolder[SiteScaffoldParams]):
    """Writes a commented defs.yaml for a new site, after checking it as the code location will
    (components/site_files.py): a bad URL or a folder name that cannot be a site's name is refused
    in one line, and nothing is written."""

    @classmethod
    def get_scaffold_params(cls) -> type[SiteScaffoldParams]:
        return SiteScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[SiteScaffoldParams]) -> None:
        import sys

        from rag_pipeline.components.site_files import check_text

        params = request.params or SiteScaffoldParams()
        text = scaffold_text(request.type_name, params)
        target = request.target_path / "defs.yaml"
        checked = check_text(text, str(target), request.target_path.name) if text else None
        if request.target_path.parent.name != "sites":
            said = (f"{request.target_path}: a site goes in sites/<name> (dg scaffold defs SiteComponent "
                    "sites/<name>), where the code location reads each site file on its own")
        elif text is None or not isinstance(checked, SiteComponent):
            said = checked.one_line() if checked is not None else (
                "give --sitemap URL or --seed URL: where the site's pages are listed or start")
        else:
            said = None
        if said:
            print(f"dg scaffold: not written: {said}", file=sys.stderr)
            if request.target_path.is_dir() and not any(request.target_path.iterdir()):
                request.target_path.rmdir()     # dg makes the folder before asking us: left as found
            raise SystemExit(1)
        request.target_path.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def scaffold_text(type_name: str, params: SiteScaffoldParams) -> Optional[str]:
    """The new site's defs.yaml: its sitemap and seed as given. With only a seed, the sitemaps
    line is an empty list beside a commented example (an example host would be put in scope and
    read, and its failures would mark every reading incomplete). None without either."""
    if not params.sitemap and not params.seed:
        return None
    sitemaps = (f"sitemaps: [{_quoted(params.sitemap)}]" if params.sitemap
                else 'sitemaps: []   # e.g. ["https://docs.example.com/sitemap.xml"]')
    seeds = f"[{_quoted(params.seed)}]" if params.seed else "[]"
    return SCAFFOLD.format(type=type_name, sitemaps=sitemaps, seeds=seeds)


def _quoted(url: str) -> str:
    """A URL as a YAML double-quoted string (whatever it holds)."""
    import json

    return json.dumps(url)


SCAFFOLD = """\
# A site to index: where its pages are listed, what is in scope, how often to look.
# Its asset group is site_<folder name>: discovery -> pages -> chunks -> embeddings.
type: {type}
attributes:
  # Sitemaps (sitemap indexes and .xml.gz too); robots.txt `Sitemap:` lines are read as well.
  {sitemaps}
  # Pages to crawl even if no sitemap lists them.
  seeds: {seeds}
  # Globs over normalized URLs (https://host/path, * matches across /). Unset: the start hosts.
  # include: ["https://docs.example.com/*"]
  # exclude: ["*/changelog/*"]
  max_pages: 100000
  discover_every: 1d
  # A site without a sitemap: follow in-scope links this many hops from the seeds (0: off).
  link_depth: 0
  # Recrawl cadence rules in cadence.yaml's format; unset: CADENCE_FILE (or the bundled one).
  # cadence:
  #   default: 7d
  #   rules:
  #     - glob: "*/blog/*"
  #       every: 1d
"""


@dg.scaffold_with(SiteScaffolder)
class SiteComponent(dg.Component, dg.Model, dg.Resolvable):
    """A web site, indexed from its sitemaps: its own discovery asset, its own `pages` → `chunks`
    → `embeddings` on its own partition set (split into shards past PARTITION_CEILING pages)."""

    name: Optional[str] = Field(default=None, description="The site's name; unset: the folder's.")
    enabled: bool = Field(default=True, description="False leaves the site out (its pages stay in the database).")
    sitemaps: list[str] = Field(default_factory=list, description="Sitemap or sitemap index URLs.")
    robots_sitemaps: bool = Field(default=True, description="Also read the start hosts' robots.txt `Sitemap:` lines.")
    seeds: list[str] = Field(default_factory=list, description="URLs crawled whether or not a sitemap lists them.")
    include: list[str] = Field(default_factory=list, description="Scope globs; unset: the start hosts.")
    exclude: list[str] = Field(default_factory=list, description="Globs left out of scope.")
    max_pages: int = Field(default=PARTITION_CEILING, description="The site's page cap.")
    shards: Optional[int] = Field(default=None, description="Partition sets; unset: one per 100,000 pages of the cap.")
    discover_every: str = Field(default="1d", description="How often its sitemaps are read.")
    link_depth: int = Field(default=0, description=(
        "Follow in-scope links of its pages this many hops from the sitemap and seed pages (for a "
        "site without a sitemap); 0: off."))
    max_sitemap_files: int = Field(default=1_000, description="Sitemap files read at most per reading.")
    max_listed_urls: int = Field(default=2_000_000, description="URLs read at most per reading.")
    cadence: Optional[dict] = Field(default=None, description="Recrawl rules in cadence.yaml's form.")
    boilerplate: list[dict] = Field(default_factory=list, description=(
        "Boilerplate rules in boilerplate.yaml's form for this site's pages, added to BOILERPLATE_RULES."))
    crawler: Optional[str] = Field(default=None, description="local or crawlbase; unset: CRAWLER.")
    template_every: str = Field(default="1d", description=(
        "Learn the site's template again in a discovery run once it is older than this (or when its "
        "pages moved by more than 10%)."))
    template_pins: list[dict] = Field(default_factory=list, description=(
        "Blocks pinned as content or template: {as: content|template, text|glob|regex: ...}; a content pin "
        "wins."))
    _folder: Optional[str] = PrivateAttr(default=None)
    _source: Optional[str] = PrivateAttr(default=None)   # where it is declared, for error messages

    @classmethod
    def load(cls, attributes, context: dg.ComponentLoadContext) -> "SiteComponent":
        # The folder names the site: kept for readers of the tree that never build it (the CLI).
        component = super().load(attributes, context)
        component._folder = context.path.name
        component._source = str(context.path / "defs.yaml")
        return component

    def spec(self, folder: Optional[str] = None) -> SiteSpec:
        name = self.name or folder or self._folder
        try:
            every = parse_interval(self.discover_every)
        except CadenceError as exc:
            raise SiteError(f"site {name}: discover_every: {exc}", ("discover_every",)) from None
        try:
            template_every = parse_interval(self.template_every)
        except CadenceError as exc:
            raise SiteError(f"site {name}: template_every: {exc}", ("template_every",)) from None
        return SiteSpec(
            name=name, sitemaps=tuple(self.sitemaps), seeds=tuple(self.seeds),
            robots_sitemaps=self.robots_sitemaps, include=tuple(self.include), exclude=tuple(self.exclude),
            max_pages=self.max_pages, discover_every=every, link_depth=self.link_depth,
            boilerplate=tuple(self.boilerplate), crawler=self.crawler,
            shards=self.shards if self.shards is not None else SiteSpec.shards_for(self.max_pages),
            max_sitemap_files=self.max_sitemap_files, max_listed_urls=self.max_listed_urls,
            cadence=self.cadence if self.cadence_rules(name) is not None else None,
            template_every=template_every, template_pins=site_pins(name, self.template_pins),
        )

    def cadence_rules(self, name: str) -> Optional[CadenceRules]:
        if self.cadence is None:
            return None
        return site_cadence(self.cadence, name)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        if not self.enabled:
            return dg.Definitions()
        return self.definitions(context.path.name)

    def definitions(self, folder: Optional[str] = None) -> dg.Definitions:
        """The site's discovery asset, job and sensor, and its page assets on each shard."""
        from rag_pipeline.defs.index.assets import embedder_kind, page_assets
        from rag_pipeline.defs.index.partitions import partitions_def
        from rag_pipeline.defs.index.set_checks import set_checks
        from rag_pipeline.components.discovery_asset import discovery_asset, discovery_sensor
        from rag_pipeline.settings import at_load

        spec = self.spec(folder)
        rules = self.cadence_rules(spec.name)
        group = f"site_{spec.name}"
        discovery = discovery_asset(spec, rules, group)
        kind = embedder_kind()
        shards = [None] if spec.shards == 1 else list(range(spec.shards))
        assets = [discovery]
        for shard in shards:
            assets += page_assets(spec.asset_prefix(shard), partitions_def(spec.name, shard), group,
                                  embedder_kind=kind, upstream=discovery.key)
        job = dg.define_asset_job(f"{spec.name}_discovery", selection=[discovery.key],
                                  description=f"Read {spec.name}'s robots.txt and sitemaps now.")
        site = dg.Definitions(assets=assets, jobs=[job], asset_checks=[set_checks(spec.name, s) for s in shards],
                              sensors=[discovery_sensor(spec, job, at_load("discovery_interval_s"))])
        questions = self.questions_file()
        if questions is None:
            return site
        from rag_pipeline.defs.quality.site_quality import quality_definitions

        embeddings = [key for a in assets for key in a.keys if key.path[-1] == "embeddings"]
        return dg.Definitions.merge(site, quality_definitions(spec, questions, group, embeddings))

    def questions_file(self):
        """The site's labelled questions file, when it has one (components/site_files.py)."""
        from rag_pipeline.components.site_files import questions_file

        if self._source is None:
            return None
        path = questions_file(self._source)
        return path if path.is_file() else None


def site_pins(name: Optional[str], items: list) -> tuple:
    """The site's template pins, or a SiteError naming the pin (its index, so the file's line)."""
    import re

    from rag_pipeline.core.template_pins import parse_pins

    try:
        return parse_pins(items)
    except ValueError as exc:
        said = re.match(r"template pin #(\d+): (.*)", str(exc), re.S)
        where = ("template_pins", int(said.group(1)) - 1) if said else ("template_pins",)
        raise SiteError(f"site {name}: template_pins: {said.group(2) if said else exc}", where) from None


def describe(spec: SiteSpec) -> str:
    """One line for logs and the CLI."""
    pages = f"up to {spec.max_pages:,} pages" + (f" in {spec.shards} shards" if spec.shards > 1 else "")
    # Where its sitemaps come from: those declared, and robots.txt's `Sitemap:` lines unless off.
    sitemaps = f"{len(spec.sitemaps)} sitemap(s)" if spec.sitemaps else "no sitemap declared"
    if spec.robots_sitemaps:
        sitemaps += " and robots.txt's Sitemap: lines"
    return (f"{spec.name}: {sitemaps}, {len(spec.seeds)} seed(s), {pages}, "
            f"read every {format_interval(spec.discover_every)}")



def declared_sites() -> list[tuple[SiteSpec, Optional[CadenceRules]]]:
    """Every enabled site that loads, as the CLI and the sensors see them: the same files the code
    location is built from (components/site_files.py), a bad one left out (`site check` names it)."""
    from rag_pipeline.components.site_files import declarations

    found = []
    for component in declarations().sites:
        spec = component.spec()
        found.append((spec, component.cadence_rules(spec.name)))
    return sorted(found, key=lambda pair: pair[0].name)
