"""The site component: one YAML file per web site under `rag_pipeline/defs/sites/<name>/defs.yaml`
(`dg scaffold defs SiteComponent sites/<name> --sitemap URL`), turned into the site's own asset
group: discovery → pages → chunks → embeddings, each page on the site's partition set (or its
shard's), plus the sensor that reads the site on its cadence.

No `from __future__ import annotations` here: Dagster's resolver reads these annotations at run time.
"""

from pathlib import Path
from typing import Optional

import dagster as dg
import yaml
from pydantic import Field, PrivateAttr, ValidationError

from rag_pipeline.core.site_spec import PARTITION_CEILING, SiteError, SiteSpec
from rag_pipeline.crawl.cadence_rules import CadenceError, CadenceRules, format_interval, parse_interval
from rag_pipeline.crawl.site_cadences import site_cadence

class SiteScaffoldParams(dg.Model):
    sitemap: Optional[str] = None
    seed: Optional[str] = None


class SiteScaffolder(dg.Scaffolder[SiteScaffoldParams]):
    """Writes a commented defs.yaml for a new site."""

    @classmethod
    def get_scaffold_params(cls) -> type[SiteScaffoldParams]:
        return SiteScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[SiteScaffoldParams]) -> None:
        params = request.params or SiteScaffoldParams()
        sitemap = params.sitemap or "https://docs.example.com/sitemap.xml"
        seeds = f"[{params.seed}]" if params.seed else "[]"
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(SCAFFOLD.format(type=request.type_name, sitemap=sitemap,
                                                                       seeds=seeds))


SCAFFOLD = """\
# A site to index: where its pages are listed, what is in scope, how often to look.
# Its asset group is site_<folder name>: discovery -> pages -> chunks -> embeddings.
type: {type}
attributes:
  # Sitemaps (sitemap indexes and .xml.gz too); robots.txt `Sitemap:` lines are read as well.
  sitemaps: ["{sitemap}"]
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
            raise SiteError(f"site {name}: discover_every: {exc}") from None
        return SiteSpec(
            name=name, sitemaps=tuple(self.sitemaps), seeds=tuple(self.seeds),
            robots_sitemaps=self.robots_sitemaps, include=tuple(self.include), exclude=tuple(self.exclude),
            max_pages=self.max_pages, discover_every=every, link_depth=self.link_depth,
            boilerplate=tuple(self.boilerplate), crawler=self.crawler,
            shards=self.shards if self.shards is not None else SiteSpec.shards_for(self.max_pages),
            max_sitemap_files=self.max_sitemap_files, max_listed_urls=self.max_listed_urls,
            cadence=self.cadence if self.cadence_rules(name) is not None else None,
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
        return dg.Definitions(assets=assets, jobs=[job], asset_checks=[set_checks(spec.name, s) for s in shards],
                              sensors=[discovery_sensor(spec, job, at_load("discovery_interval_s"))])


def sites_from_dir(folder: Path) -> list[SiteComponent]:
    """The sites of SITES_DIR: each `<name>.yaml` in a site's defs.yaml form (`attributes:`, plain
    values: no templates), named by the file unless it sets `name`."""
    if not folder.is_dir():
        raise SiteError(f"SITES_DIR {folder} is not a folder")
    found = []
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SiteError(f"{path}: {str(exc).splitlines()[0]}") from None
        if not isinstance(document, dict) or not isinstance(document.get("attributes", {}), dict):
            raise SiteError(f"{path}: expected a mapping with `attributes:`, as in a site's defs.yaml")
        kind = document.get("type", "rag_pipeline.components.SiteComponent")
        if not isinstance(kind, str) or kind.rsplit(".", 1)[-1] != SiteComponent.__name__:
            raise SiteError(f"{path}: type {kind!r}: only SiteComponent files belong in SITES_DIR")
        try:
            component = SiteComponent.model_validate(document.get("attributes") or {})
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise SiteError(f"{path}: {where}: {problem['msg']}") from None
        component._folder = path.stem
        component._source = str(path)
        found.append(component)
    return found


def unique_sites(components: list[SiteComponent]) -> list[SiteComponent]:
    """The enabled sites, each name once: a name declared twice (in the package and SITES_DIR, or
    two files) is refused, naming both places."""
    seen: dict[str, SiteComponent] = {}
    for component in components:
        if not component.enabled:
            continue
        name = component.spec().name
        if name in seen:
            raise SiteError(f"site {name} is declared twice: {seen[name]._source} and {component._source}")
        seen[name] = component
    return list(seen.values())


def describe(spec: SiteSpec) -> str:
    """One line for logs and the CLI."""
    pages = f"up to {spec.max_pages:,} pages" + (f" in {spec.shards} shards" if spec.shards > 1 else "")
    return (f"{spec.name}: {len(spec.sitemaps)} sitemap(s), {len(spec.seeds)} seed(s), {pages}, "
            f"read every {format_interval(spec.discover_every)}")



def declared_sites() -> list[tuple[SiteSpec, Optional[CadenceRules]]]:
    """Every enabled site of this code location, as the CLI sees them: the same component tree
    the definitions are built from, loaded but not built."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
            warnings.simplefilter("ignore", category)
        tree = dg.ComponentTree(defs_module=importlib.import_module("rag_pipeline.defs"),
                                project_root=Path(__file__).resolve().parents[2])
        components = unique_sites([*tree.get_all_components(of_type=SiteComponent), *external_sites()])
    found = []
    for component in components:
        spec = component.spec()
        found.append((spec, component.cadence_rules(spec.name)))
    return sorted(found, key=lambda pair: pair[0].name)


def external_sites() -> list[SiteComponent]:
    """SITES_DIR's sites, if it is set."""
    from rag_pipeline.settings import location_settings

    folder = location_settings().sites_dir
    return sites_from_dir(Path(folder)) if folder else []
