"""A site's discovery asset and the sensor that reads the site on its own cadence, built for each
site component. The reading itself is `crawl.discovery.read_site`; this only runs it in Dagster."""

import dagster as dg

from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.crawl.cadence_rules import CadenceRules, format_interval, load_rules
from rag_pipeline.crawl.discovery import FIGURES, ReadingResult, read_site
from rag_pipeline.crawl.guarded_http import guarded_client
from rag_pipeline.crawl.robots_cache import RobotsCache
from rag_pipeline.crawl.template_learning import Learning, learn_site
from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.defs.unended_runs import unended_run
from rag_pipeline.settings import Settings
from rag_pipeline.store import sites as store

DISCOVERY_CHECK = "discovery_read_cleanly"


def discovery_key(site: str) -> dg.AssetKey:
    return dg.AssetKey([site, "discovery"])


def run_reading(conn, spec: SiteSpec, rules: CadenceRules | None, settings: Settings,
                run_id: str | None = None) -> ReadingResult:
    """One reading with the deployment's crawler settings: the network guard, the User-Agent
    robots.txt is read for, the fetch deadline. Shared by the asset and `site discover`."""
    every_for = (rules or load_rules(settings.cadence_file)).every_for
    with guarded_client(allowed=settings.allowed_networks(), user_agent=settings.crawler_user_agent,
                        timeout_s=settings.crawler_timeout_s) as client:
        robots = RobotsCache(client, agent=settings.crawler_user_agent, ttl_s=60.0,
                             deadline_s=settings.crawler_fetch_deadline_s)
        return read_site(conn, client, spec, robots_for=robots.rules_for, agent=settings.crawler_user_agent,
                         every_for=every_for, allowed=settings.allowed_networks(),
                         deadline_s=settings.crawler_fetch_deadline_s, run_id=run_id)


def reading_metadata(result: ReadingResult) -> dict:
    """Each figure as a number (the UI plots them across readings), and the problems as text."""
    metadata: dict = {figure: int(result.counts.get(figure, 0)) for figure in FIGURES}
    metadata["complete"] = result.complete
    metadata["reading_id"] = result.reading_id
    metadata["problems"] = dg.MetadataValue.md("\n".join(f"- {e}" for e in result.errors) or "none")
    for change, urls in result.examples.items():
        if urls:   # which pages: new ones registered, and those gone from the sitemaps (now unlisted)
            metadata[f"{change}_urls"] = dg.MetadataValue.md("\n".join(f"- {u}" for u in urls))
    return metadata


def template_metadata(learning: Learning) -> dict:
    """The site's template as the UI shows it on the reading: what this run did with it (learned,
    kept, failed and why), its blocks by kind, when and from how many pages, and the top blocks."""
    from rag_pipeline.core.template_rows import blocks_by_kind, top_blocks_markdown

    metadata: dict = {"template": learning.summary}
    template = learning.template
    if template is not None:
        metadata.update({
            "template_learned_at": dg.MetadataValue.timestamp(learning.learned_at),
            "template_pages": template.pages,
            "template_blocks": len(template.blocks),
            "template_blocks_by_kind": dg.MetadataValue.json(blocks_by_kind(template.blocks)),
            "template_top_blocks": dg.MetadataValue.md(top_blocks_markdown(template.blocks)),
        })
    if learning.error:
        metadata["template_error"] = learning.error
    return metadata


def reading_check(result: ReadingResult) -> dict:
    """discovery_read_cleanly's result fields for a reading, made in a run or by `site discover`."""
    return {"passed": result.complete, "severity": dg.AssetCheckSeverity.WARN,
            "metadata": {"problems": len(result.errors), "first_problem": result.errors[0] if result.errors else ""}}


def discovery_asset(spec: SiteSpec, rules: CadenceRules | None, group: str) -> dg.AssetsDefinition:
    key = discovery_key(spec.name)

    @dg.asset(
        key=key,
        group_name=group,
        kinds={"postgres"},
        check_specs=[dg.AssetCheckSpec(DISCOVERY_CHECK, asset=key, description=(
            "The newest reading read every robots.txt and sitemap file it was given, within its caps."))],
        description=(
            f"What {spec.name}'s robots.txt and sitemaps list, read every {format_interval(spec.discover_every)} (or on "
            "demand): new in-scope URLs become pages due for a crawl, a moved <lastmod> makes a page due "
            "now, and a page no longer listed is crawled once to check it (404/410 tombstones it; 200 "
            "keeps it, unlisted). A reading that met a problem never marks pages gone. After it, the "
            f"site's template is learned again from its stored pages when older than "
            f"{format_interval(spec.template_every)} or its pages moved by more than 10%."
        ),
    )
    def discovery(context: dg.AssetExecutionContext, postgres: PostgresResource,
                  settings: SettingsResource) -> dg.MaterializeResult:
        with postgres.connect() as conn:
            with conn.transaction():
                store.sync_declared(conn, [spec], by_location=True)
            result = run_reading(conn, spec, rules, settings.get(), run_id=context.run.run_id)
            learning = learn_site(conn, spec)
        context.log.info(f"{spec.name}: {result.summary}")
        for problem in result.errors:
            context.log.warning(f"{spec.name}: {problem}")
        (context.log.warning if learning.outcome == "failed" else context.log.info)(learning.summary)
        return dg.MaterializeResult(
            metadata={**reading_metadata(result), **template_metadata(learning)},
            check_results=[dg.AssetCheckResult(check_name=DISCOVERY_CHECK, **reading_check(result))],
        )

    return discovery


def discovery_sensor(spec: SiteSpec, job, interval_s: int) -> dg.SensorDefinition:
    """The site's sensor, ticking every `interval_s` (DISCOVERY_INTERVAL_S, fixed when the code
    location loads)."""

    @dg.sensor(
        name=f"{spec.name}_discovery_sensor",
        job=job,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Reads {spec.name}'s robots.txt and sitemaps when its next reading is due "
                     f"(every {format_interval(spec.discover_every)}; at once for a new site)."),
    )
    def _sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
        with postgres.connect() as conn:
            with conn.transaction():
                store.sync_declared(conn, [spec], by_location=True)
                due = store.due(conn, [spec.name])
                # Link discovery goes on as soon as pages it may lead from were indexed.
                links = not due and spec.link_depth > 0 and store.links_pending(conn, spec.name, spec.link_depth)
        if not due and not links:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"{spec.name}: no reading due"))
        running = unended_run(context.instance, job.name)
        if running:
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"{spec.name}: a reading is due, but run {running} has not ended"))
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=None, tags={"rag/site": spec.name})])

    return _sensor
