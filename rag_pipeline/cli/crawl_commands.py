"""`rag-pipeline deliver`, `seed` and `cadence …`: put pages in front of the crawler, or a delivery in front of the receiver."""

from __future__ import annotations

import gzip
import uuid
from datetime import timedelta
from pathlib import Path

import click

from rag_pipeline.cli.common import CliError, index_url, progress
from rag_pipeline.settings import get_settings


@click.command()
@click.argument("url")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--webhook", "webhook_url", default="http://127.0.0.1:8800/webhook", show_default=True)
@click.option("--status", "original_status", default=200, show_default=True, type=int)
@click.option("--rid", default=None, help="Request id (default: a new UUID).")
def deliver(url: str, file: Path, webhook_url: str, original_status: int, rid: str | None) -> None:
    """POST FILE to the webhook as the crawler would deliver URL (gzip'd markdown).

    The delivery is recorded as the answer to a manual push of URL (the pushes table), so routing
    indexes it as it indexes what a crawler was asked for."""
    import httpx

    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.store import db, pushes

    settings = get_settings()
    rid = rid or uuid.uuid4().hex
    try:
        page_url = normalize_url(url)
    except InvalidURL as exc:
        raise click.BadParameter(str(exc), param_hint="URL") from exc
    headers = {
        "rid": rid,
        "url": url,
        "Original-Status": str(original_status),
        "CB-Status": "200",
        "Content-Encoding": "gzip",
        "Content-Type": "text/markdown; charset=utf-8",
    }
    from rag_pipeline.crawl.fetching import answer_reason

    token = settings.resolved_webhook_token()
    if token:   # a header, never `?token=`: URLs end up in proxies' logs
        headers["X-Webhook-Token"] = token
    with db.connection(index_url()) as conn:
        with conn.transaction():
            (push_id,) = pushes.begin(conn, [(url, page_url)], reason="manual", crawler="deliver", run_id=None)
        error = None
        try:
            resp = httpx.post(webhook_url, headers=headers,
                              content=gzip.compress(file.read_bytes()), timeout=30)
            if resp.status_code != 200:
                error = f"webhook answered {resp.status_code}: {answer_reason(resp)}"
        except httpx.HTTPError as exc:
            error = f"cannot reach the webhook at {webhook_url}: {exc}"
        with conn.transaction():
            pushes.finish(conn, [pushes.Outcome(push_id, None if error else rid, 1, error)])
    if error:
        raise CliError(error)
    click.echo(resp.text)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--no-push", is_flag=True, help="Register the pages and their cadence only.")
@click.option("--wait", "wait_s", default=300.0, show_default=True,
              help="local crawler: seconds to wait for the fetches to be delivered.")
def seed(file: Path, no_push: bool, wait_s: float) -> None:
    """Register the URLs in FILE with their cadence and push them to the crawler.

    One URL per line, `#` starts a comment, `every=6h` sets that page's cadence
    (else cadence.yaml's default for its pattern)."""
    from rag_pipeline.core.site_spec import SiteError
    from rag_pipeline.crawl.cadence_rules import CadenceError, parse_seeds
    from rag_pipeline.crawl.factory import make_crawler
    from rag_pipeline.crawl.pushing import push_by_site, register_seeds
    from rag_pipeline.crawl.site_cadences import load_site_rules
    from rag_pipeline.store import db

    settings = get_settings()
    try:
        seeds = parse_seeds(file.read_text(encoding="utf-8"), timedelta(seconds=settings.recrawl_interval_s))
    except CadenceError as exc:
        raise CliError(f"{file}: {exc}") from exc
    with db.connection(index_url()) as conn:
        try:
            rules = load_site_rules(conn, settings.cadence_file)
        except (CadenceError, SiteError) as exc:
            raise CliError(str(exc)) from exc
        targets, skipped = register_seeds(conn, seeds, rules)
        for line in skipped:
            click.echo(f"alias, not pushed: {line}")
        aliases = f" ({len(skipped)} of them redirect{'s' if len(skipped) == 1 else ''} elsewhere: not pushed)" if skipped else ""
        click.echo(f"registered {len(seeds)} page(s){aliases}")
        if no_push or not targets:
            return
        crawlers: dict = {}

        def crawler_for(kind):   # a site may ask for its own crawler; None: CRAWLER
            if kind not in crawlers:
                try:
                    crawlers[kind] = make_crawler(settings if kind is None
                                                  else settings.model_copy(update={"crawler": kind}))
                except ValueError as exc:
                    raise CliError(str(exc)) from exc
            return crawlers[kind]

        try:
            name = crawler_for(None).name
            with progress(f"pushed to {name}", len(targets), every=max(1, len(targets) // 10)) as advance:
                done = [0]

                def pushed(n: int) -> None:
                    done[0] += n
                    advance(done[0])

                report = push_by_site(conn, crawler_for, targets, reason="seed",
                                      concurrency=settings.crawler_push_concurrency,
                                      tombstone_recheck=rules.tombstone_recheck, drain_timeout_s=wait_s,
                                      progress=pushed)
        finally:
            for crawler in crawlers.values():
                crawler.close()
    click.echo(f"pushed {report.pushed}, failed {report.failed}"
               + (f", disallowed by robots.txt {report.disallowed}" if report.disallowed else ""))
    for error in report.errors[:20]:
        click.echo(f"  failed: {error}", err=True)
    for line in report.disallowed_urls[:20]:     # not crawled, and no failure: what the site asks
        click.echo(f"  disallowed: {line}")
    if report.disallowed:
        click.echo("  (not fetched; out of the recrawl queue until robots.txt is read again: "
                   "`rag-pipeline site show` counts them)")
    if report.undelivered_local:
        click.echo(f"{report.undelivered_local} page(s) were still being fetched after --wait {wait_s:g} s: "
                   "their pushes count as failed and their pages fall due again", err=True)
    if report.failed:
        raise CliError(f"{report.failed} push(es) failed (recorded in the pushes table)")


@click.group()
def cadence() -> None:
    """Per-page recrawl cadence (defaults by URL pattern: rag_pipeline/config/cadence.yaml)."""


@cadence.command("set")
@click.argument("url")
@click.argument("every")
@click.option("--register", is_flag=True, help="Add URL if it is not registered yet (due at the next tick).")
def cadence_set(url: str, every: str, register: bool) -> None:
    """Recrawl URL every EVERY (1m, 15m, 6h, 1d, 2w, 1h30m; at least RECRAWL_INTERVAL_S): fixed,
    never adapted. EVERY `auto` gives the page back to its rule and the adaptive cadence."""
    from datetime import timedelta

    from rag_pipeline.core.site_spec import SiteError
    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.crawl.cadence_rules import CadenceError, check_honourable, format_interval, parse_interval
    from rag_pipeline.crawl.site_cadences import load_site_rules
    from rag_pipeline.store import db, schedule, sites

    auto = every.strip().lower() == "auto"
    try:
        page_url = normalize_url(url)
        interval = None if auto else parse_interval(every)
    except (CadenceError, InvalidURL) as exc:
        raise click.BadParameter(str(exc)) from exc
    with db.connection(index_url()) as conn:
        site, shard = sites.place(conn, page_url)
        if auto:   # its site's rule, where its site has rules
            try:
                interval = load_site_rules(conn, get_settings().cadence_file).every_for(page_url, site)
            except (CadenceError, SiteError) as exc:
                raise CliError(str(exc)) from exc
        try:
            check_honourable(interval, timedelta(seconds=get_settings().recrawl_interval_s))
        except CadenceError as exc:
            raise CliError(f"{exc} (or lower RECRAWL_INTERVAL_S)") from exc
        with conn.transaction():
            row = schedule.set_cadence(conn, url, page_url, interval, register=register,
                                       source="default" if auto else "manual", site=site, shard=shard)
    if row is None:
        raise CliError(f"{page_url} is not registered: check the URL, or add it with --register")
    if row.alias_of:
        raise CliError(f"{page_url} redirects to {row.alias_of} and is not recrawled: set the cadence there "
                       f"(rag-pipeline cadence set {row.alias_of} {format_interval(interval)})")
    added = " (registered, first crawl at the next recrawl tick)" if row.created else ""
    adapts = "; adaptive from the next cadence refresh (CADENCE_REFRESH_S)" if auto else ""
    click.echo(f"{page_url}: every {format_interval(row.recrawl_every)}{added}{adapts}")


@cadence.command("show")
@click.argument("url")
def cadence_show(url: str) -> None:
    """The cadence of URL and why: its estimated change rate, the observations it rests on, its
    rule and bounds; its last and next crawl, redirect, tombstone."""
    from rag_pipeline.core.site_spec import SiteError
    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.crawl.cadence_rules import CadenceError, describe_time, format_interval
    from rag_pipeline.crawl.site_cadences import load_site_rules
    from rag_pipeline.store import crawl_observations as cadence_store
    from rag_pipeline.store import db, schedule

    try:
        page_url = normalize_url(url)
    except InvalidURL as exc:
        raise click.BadParameter(str(exc)) from exc
    with db.connection(index_url()) as conn:
        row = schedule.cadence_of(conn, page_url)
        if row is None:
            raise CliError(f"{page_url} is not registered (rag-pipeline seed FILE)")
        total, changed, newest = cadence_store.observations_of(conn, page_url, 5)
        try:
            by_site = load_site_rules(conn, get_settings().cadence_file)
        except (CadenceError, SiteError) as exc:
            raise CliError(str(exc)) from exc
    rules = by_site.of(row.site)
    rule = rules.rule_for(page_url)
    adapts = row.source == "default" and rules.adaptive and rule.adapt
    whose = f"site {row.site}'s rule" if row.site in by_site.sites else "rule"
    # A cadence from a rule names the rule (a site's or the deployment's), not "default".
    source = f"{whose} {rule.label}" if row.source == "default" else row.source
    label = (f"{source}, {'adaptive' if adapts else 'fixed'}" if row.source in ("default", "seed", "manual")
             else row.source or "not assigned yet")
    click.echo(f"{page_url}: every {format_interval(row.recrawl_every)} ({label})")
    click.echo(f"  last crawled {describe_time(row.last_crawled_at, row.now)}, "
               f"next crawl {describe_time(row.next_crawl_at, row.now, missing='not scheduled')}")
    if row.alias_of:
        click.echo(f"  redirects to {row.alias_of}: not recrawled")
    if row.deleted_at:
        click.echo(f"  tombstoned since {describe_time(row.deleted_at, row.now)}: re-checked slowly")
    click.echo(f"  {whose} {rule.label}: every {format_interval(rule.every)}, "
               f"{format_interval(rule.floor)}–{format_interval(rule.ceiling)}")
    if row.change_rate is None:
        rate = "not estimated yet"
    elif total == 0:   # the estimate is the prior alone: an assumption, not a measured rate
        rate = (f"none observed yet (no crawl compared with an earlier one); {row.change_rate * 86400:.3g}/day "
                f"assumed from its rule or its pattern's pages until then")
    else:
        rate = f"{row.change_rate * 86400:.3g} changes/day estimated {describe_time(row.derived_at, row.now)}"
    click.echo(f"  change rate: {rate}; observations: {total} ({changed} changed)")
    for o in newest:
        click.echo(f"    {describe_time(o.crawled_at, row.now)}: {'changed' if o.changed else 'unchanged'} "
                   f"after {format_interval(timedelta(seconds=max(1, round(o.interval_s))))}")
    if adapts and row.why:
        click.echo(f"  why this interval: {row.why}")
