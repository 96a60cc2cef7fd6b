"""`rag-pipeline site …`: the declared sites, what their pages are doing, and a reading now."""

from __future__ import annotations

import json

import click

from rag_pipeline.cli.common import dagster_storage_url, index_url
from rag_pipeline.settings import get_settings


class UnknownSite(click.ClickException):
    exit_code = 1


def _declared() -> dict:
    from rag_pipeline.components.site_component import declared_sites

    return {spec.name: (spec, rules) for spec, rules in declared_sites()}


ONLY_RUNNING = ("declared by the running code location (its discovery sensor recorded it), but not in this "
                "shell: its defs.yaml depends on an environment variable this shell lacks (the sample site: "
                "SAMPLE_SITE_URL)")


def _site(name: str, known_running: set[str] = frozenset()):
    declared = _declared()
    if name not in declared:
        if name in known_running:
            raise UnknownSite(f"site {name!r} is {ONLY_RUNNING}; set it to read the site from here, or launch "
                              f"the job {name}_discovery in the Dagster UI")
        known = ", ".join(sorted(set(declared) | set(known_running))) or "none (add one: dg scaffold defs SiteComponent sites/<name>)"
        raise UnknownSite(f"no site {name!r} is declared; declared sites: {known}")
    return declared[name]


def _ago(when, now) -> str:
    from rag_pipeline.crawl.cadence_rules import describe_time

    return describe_time(when, now, missing="never")


def _reading_line(row: dict) -> str:
    reading = row["last_reading"]
    if reading is None:
        return "never read"
    if reading["finished_at"] is None:
        return f"reading since {_ago(reading['started_at'], row['now'])}"
    c = reading["counts"]
    state = "complete" if reading["complete"] else f"INCOMPLETE, {len(reading['problems'])} problem(s)"
    left_out = ", ".join(f"{c[k]} {k.replace('_', ' ')}" for k in ("disallowed", "out_of_scope", "invalid",
                                                                  "refused_address") if c.get(k))
    return (f"read {_ago(reading['finished_at'], row['now'])} ({state}): {c.get('listed', 0)} URLs in the sitemaps"
            + (f" ({left_out})" if left_out else "")
            + f", {c.get('new', 0)} new, {c.get('gone', 0)} gone, {c.get('lastmod_moved', 0)} lastmod moved")


@click.group("site")
def site() -> None:
    """Declared sites (rag_pipeline/defs/sites/*/defs.yaml) and their discovery."""


@site.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def site_list(as_json: bool) -> None:
    """Each declared site: its pages by state and its last reading."""
    from rag_pipeline.store import db
    from rag_pipeline.store import sites as store

    declared = _declared()
    with db.connection(index_url()) as conn:
        rows = {r["site"]: r for r in store.overview(conn)}
    # The sites this shell declares, and those the running code location recorded.
    names = sorted(set(declared) | set(rows))
    if as_json:
        click.echo(json.dumps([{**rows.get(n, {"site": n}), "declared_here": n in declared} for n in names],
                              default=str, indent=2))
        return
    if not names:
        click.echo("no sites declared: add one with `dg scaffold defs SiteComponent sites/<name> --sitemap URL`")
        return
    for name in names:
        row = rows.get(name)
        if row is None:
            click.echo(f"{name}: declared, not read yet (its discovery sensor reads it within a minute of loading)")
            continue
        click.echo(f"{name}: {row['live']} live, {row['listed']} listed, {row['unlisted']} unlisted, "
                   f"{row['tombstoned']} tombstoned, {row['due']} due; {_reading_line(row)}")


@site.command("show")
@click.argument("name")
def site_show(name: str) -> None:
    """One site: what it declares, its pages by state, and its last reading with its problems."""
    from rag_pipeline.components.site_component import describe
    from rag_pipeline.store import db
    from rag_pipeline.store import sites as store

    with db.connection(index_url()) as conn:
        row = next((r for r in store.overview(conn) if r["site"] == name), None)
        recorded = store.declared_row(conn, name)
    if name in _declared():
        spec, _rules = _site(name)
        click.echo(describe(spec))
        scope, exclude = spec.scope, spec.exclude
    elif recorded is not None:
        click.echo(f"{name}: up to {recorded['max_pages']:,} pages, read every {recorded['discover_every']} "
                   f"({ONLY_RUNNING})")
        scope, exclude = recorded["scope"], recorded["exclude"]
    else:
        _site(name)    # says which sites there are
        return
    click.echo(f"  scope (globs over normalized URLs): {', '.join(scope)}"
               + (f"; excluding {', '.join(exclude)}" if exclude else ""))
    if row is None:
        click.echo("  not read yet")
        return
    click.echo(f"  pages: {row['pages']} ({row['live']} live, {row['listed']} listed, {row['unlisted']} unlisted, "
               f"{row['tombstoned']} tombstoned, {row['due']} due, {row['never_crawled']} never crawled)")
    click.echo(f"  last reading: {_reading_line(row)}")
    reading = row["last_reading"]
    if reading and reading["counts"]:
        shown = {k: v for k, v in reading["counts"].items() if v}
        click.echo("    " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items()))
    for problem in (reading or {}).get("problems") or []:
        click.echo(f"    problem: {problem}")
    click.echo(f"  next reading: {_ago(row['next_reading_at'], row['now']) if row['next_reading_at'] else 'at once'}")


@site.command("discover")
@click.argument("name")
def site_discover(name: str) -> None:
    """Read NAME's robots.txt and sitemaps now (the discovery asset's work, in this process), and
    record the reading on its discovery asset when the Dagster instance is reachable."""
    from rag_pipeline.components.discovery_asset import run_reading
    from rag_pipeline.store import db
    from rag_pipeline.store import sites as store

    settings = get_settings()
    with db.connection(index_url()) as conn:
        spec, rules = _site(name, {r["site"] for r in store.overview(conn)})
        with conn.transaction():
            store.sync_declared(conn, [spec])
        result = run_reading(conn, spec, rules, settings)
    recorded = _record(spec.name, result, settings)
    click.echo(f"{name}: {result.summary}")
    for problem in result.errors:
        click.echo(f"  problem: {problem}")
    click.echo(f"  {recorded}")
    if not result.complete:
        raise click.exceptions.Exit(1)


def _record(site_name: str, result, settings) -> str:
    """The reading as a materialization of the site's discovery asset, or why it was not recorded."""
    import os
    from pathlib import Path

    import dagster as dg

    from rag_pipeline.components.discovery_asset import discovery_key, reading_metadata
    from rag_pipeline.defs import check_states
    from rag_pipeline.defs.index.events import write_runless

    home = Path(os.environ.get("DAGSTER_HOME") or settings.rag_home / "dagster_home")
    if not (home / "dagster.yaml").is_file():
        return f"not recorded in Dagster: no instance at {home} (set DAGSTER_HOME)"
    with dagster_storage_url(settings) as missing:
        if missing:
            return f"not recorded in Dagster: {missing}"
        try:
            with check_states.instance_at(home) as instance:
                write_runless(instance, [dg.AssetMaterialization(asset_key=discovery_key(site_name),
                                                                 metadata=reading_metadata(result))])
        except Exception as exc:  # the reading is applied either way; say why the UI will not show it
            return f"not recorded in Dagster: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return f"recorded on {discovery_key(site_name).to_user_string()} in {home}"
