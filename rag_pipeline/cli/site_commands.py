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
    from rag_pipeline.components.site_files import declarations

    found = declarations()
    declared = {c.spec().name: c for c in found.sites}
    if name not in declared:
        broken = next((p for p in found.problems if p.name == name), None)
        if broken is not None:
            raise UnknownSite(f"site {name!r} does not load: {broken.one_line()}")
        if name in known_running:
            raise UnknownSite(f"site {name!r} is {ONLY_RUNNING}; set it to read the site from here, or launch "
                              f"the job {name}_discovery in the Dagster UI")
        raise UnknownSite(f"no site {name!r} is declared; declared sites: {every_site(found, known_running)}")
    component = declared[name]
    spec = component.spec()
    return spec, component.cadence_rules(spec.name)


def every_site(found, known_running: set[str] = frozenset()) -> str:
    """Every site a name could mean, each marked unless it loads and is on: `site show` and
    `site discover` list the same, whatever they were asked."""
    marks: dict[str, str] = {c.spec().name: "" for c in found.sites}
    for component in found.disabled:
        name = component.name or component._folder
        marks.setdefault(name, " (switched off here: enabled is false; the sample site is on under `make run`)")
    for problem in found.problems:
        marks.setdefault(problem.name, " (its file does not load: `rag-pipeline site check`)")
    for name in known_running:
        marks.setdefault(name, " (recorded by the running code location, not declared in this shell)")
    return (", ".join(f"{n}{marks[n]}" for n in sorted(marks))
            or "none (add one: dg scaffold defs SiteComponent sites/<name>)")


def _reading_line(row: dict) -> str:
    from rag_pipeline.cli.site_views import reading_line

    return reading_line(row)


@click.group("site")
def site() -> None:
    """Declared sites (rag_pipeline/defs/sites/*/defs.yaml) and their discovery."""


@site.command("check")
def site_check() -> None:
    """Read every site file (rag_pipeline/defs/sites/*/defs.yaml and SITES_DIR) as the code location
    will: one line per bad one, `file:line: field: reason`, and exit 1; a deploy stops it first."""
    from rag_pipeline.components.site_files import declarations, read_questions
    from rag_pipeline.core.answer_quality import QuestionsError

    found = declarations()
    said = [problem.one_line() for problem in found.problems]
    asked = 0
    # Each site's labelled questions: a bad file fails only its quality runs, and is said here.
    for component in [*found.sites, *found.disabled]:
        path = component.questions_file()
        if path is None:
            continue
        try:
            asked += len(read_questions(path, component.spec()))
        except QuestionsError as exc:
            said.append(str(exc))
    for line in said:
        click.echo(line)
    if said:
        raise click.exceptions.Exit(1)
    # A switched-off site's file is judged as fully as the others, but it is not counted as OK:
    # nothing of it runs here, so its reading and its pages are not known to work.
    off = f", {len(found.disabled)} switched off (checked)" if found.disabled else ""
    questions = f", {asked} labelled question(s) read" if asked else ""
    click.echo(f"{len(found.sites)} site(s) OK{off}{questions}")


@site.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def site_list(as_json: bool) -> None:
    """Each declared site: its pages by state and its last reading; a site whose file does not
    load, with why."""
    from rag_pipeline.components.site_files import declarations
    from rag_pipeline.store import db
    from rag_pipeline.store import sites as store

    found = declarations()
    declared = set(found.names())
    broken = {p.name: p for p in found.problems}
    with db.connection(index_url()) as conn:
        rows = {r["site"]: r for r in store.overview(conn)}
    # The sites this shell declares, those the running code location recorded, and the broken ones.
    names = sorted(declared | set(rows) | set(broken))
    if as_json:
        click.echo(json.dumps([{**rows.get(n, {"site": n}), "declared_here": n in declared,
                                "does_not_load": broken[n].as_dict() if n in broken else None} for n in names],
                              default=str, indent=2))
        return
    if not names:
        click.echo("no sites declared: add one with `dg scaffold defs SiteComponent sites/<name> --sitemap URL`")
        return
    for name in names:
        row = rows.get(name)
        if name in broken:
            click.echo(f"{name}: DOES NOT LOAD: {broken[name].one_line()}")
        elif row is None:
            click.echo(f"{name}: declared, not read yet (its discovery sensor reads it within a minute of loading)")
        else:
            click.echo(f"{name}: {row['live']} live, {row['listed']} listed, {row['unlisted']} unlisted, "
                       f"{row['tombstoned']} tombstoned, {row['due']} due"
                       + (f", {row['disallowed']} disallowed by robots.txt" if row["disallowed"] else "")
                       + f"; {_reading_line(row)}")


@site.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same facts).")
def site_show(name: str, as_json: bool) -> None:
    """One site: what it declares, its pages by state, and its last reading with its problems; for
    a site whose file does not load, why (file:line: field: reason), and exit 1."""
    from rag_pipeline.cli.site_views import show_site

    show_site(name, as_json)


@site.command("template")
@click.argument("name")
@click.option("--learn", is_flag=True, help="Learn it now from the site's stored pages (after changing its pins).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same facts).")
def site_template(name: str, learn: bool, as_json: bool) -> None:
    """NAME's learned template: every block, with why it is template, the pages it was seen on and
    an example page; --learn learns it now (exit 1 if that fails: the old template is kept)."""
    from rag_pipeline.cli.template_views import show_template

    show_template(name, as_json, learn)


@site.command("discover")
@click.argument("name")
def site_discover(name: str) -> None:
    """Read NAME's robots.txt and sitemaps now (the discovery asset's work, in this process), and
    record the reading on its discovery asset when the Dagster instance is reachable."""
    from rag_pipeline.components.discovery_asset import run_reading
    from rag_pipeline.crawl.template_learning import learn_site
    from rag_pipeline.store import db
    from rag_pipeline.store import sites as store

    settings = get_settings()
    with db.connection(index_url()) as conn:
        spec, rules = _site(name, {r["site"] for r in store.overview(conn)})
        with conn.transaction():
            store.sync_declared(conn, [spec])
        result = run_reading(conn, spec, rules, settings)
        learning = learn_site(conn, spec)
    recorded = _record(spec.name, result, settings, learning)
    click.echo(f"{name}: {result.summary}")
    for problem in result.errors:
        click.echo(f"  problem: {problem}")
    click.echo(f"  {learning.summary.removeprefix(f'{name}: ')}")
    click.echo(f"  {recorded}")
    if not result.complete:
        raise click.exceptions.Exit(1)


READ_BY = "rag-pipeline site discover"


def _record(site_name: str, result, settings, learning) -> str:
    """The reading as a materialization of the site's discovery asset, or why it was not recorded."""
    import os
    import socket
    from pathlib import Path

    import dagster as dg

    from rag_pipeline.components.discovery_asset import (DISCOVERY_CHECK, discovery_key, reading_check,
                                                         reading_metadata, template_metadata)
    from rag_pipeline.defs import check_states
    from rag_pipeline.defs.index.events import write_runless

    home = Path(os.environ.get("DAGSTER_HOME") or settings.rag_home / "dagster_home")
    if not (home / "dagster.yaml").is_file():
        return f"not recorded in Dagster: no instance at {home} (set DAGSTER_HOME)"
    # Said on both events: a shell's reading (its own environment, its own network) must not pass
    # for the sensor's in the UI, where it turns the deployment's check red or green.
    origin = {"read_by": READ_BY, "read_on": socket.gethostname()}
    check = reading_check(result)
    check = {**check, "metadata": {**check["metadata"], **origin},
             "description": f"read by `{READ_BY}` from a shell: "
                            + (result.errors[0] if result.errors else result.summary)}
    with dagster_storage_url(settings) as missing:
        if missing:
            return f"not recorded in Dagster: {missing}"
        try:
            with check_states.instance_at(home) as instance:
                write_runless(instance, [dg.AssetMaterialization(asset_key=discovery_key(site_name),
                                                                 metadata={**reading_metadata(result),
                                                                           **template_metadata(learning), **origin})])
                # Its check with it, or the UI greys the sensor's last one out as older than this.
                instance.report_runless_asset_event(dg.AssetCheckEvaluation(
                    asset_key=discovery_key(site_name), check_name=DISCOVERY_CHECK, **check))
        except Exception as exc:  # the reading is applied either way; say why the UI will not show it
            return f"not recorded in Dagster: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return f"recorded on {discovery_key(site_name).to_user_string()} in {home}"
