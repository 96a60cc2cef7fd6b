"""What `rag-pipeline site show` and `site list` say of a site, in words and as JSON: one set of
facts for both, so the text never says what the JSON does not hold."""

from __future__ import annotations

import json

import click

from rag_pipeline.cli.common import index_url

LEFT_OUT = ("disallowed", "out_of_scope", "invalid", "refused_address")


def ago(when, now) -> str:
    from rag_pipeline.crawl.cadence_rules import describe_time

    return describe_time(when, now, missing="never")


def reading_line(row: dict) -> str:
    """The newest reading in one line: what the sitemaps listed and what link discovery found
    counted apart, then what changed."""
    reading = row["last_reading"]
    if reading is None:
        return "never read"
    if reading["finished_at"] is None:
        return f"reading since {ago(reading['started_at'], row['now'])}"
    c = reading["counts"]
    state = "complete" if reading["complete"] else f"INCOMPLETE, {len(reading['problems'])} problem(s)"
    left_out = ", ".join(f"{c[k]} {k.replace('_', ' ')}" for k in LEFT_OUT if c.get(k))
    links = (f", {c.get('links_found', 0)} found by following links ({c.get('new_from_links', 0)} new"
             + (f", {c['links_left_out']} left out" if c.get("links_left_out") else "") + ")"
             if c.get("link_pages_read") else "")
    return (f"read {ago(reading['finished_at'], row['now'])} ({state}): {c.get('listed', 0)} URLs in the sitemaps"
            + (f" ({left_out})" if left_out else "") + links
            + f", {c.get('new', 0)} new, {c.get('gone', 0)} no longer listed (each crawled once to decide),"
              f" {c.get('lastmod_moved', 0)} lastmod moved")


def pages_line(row: dict) -> str:
    """Pages by state; redirect aliases (a redirect's source URL, a row of its own) said apart so
    the figures add up, and the pages robots.txt disallows (not crawled: neither due nor "never
    crawled" waiting for a crawl)."""
    aliases, disallowed = row.get("aliases", 0), row.get("disallowed", 0)
    indexed = row.get("disallowed_indexed", 0)
    return (f"{row['pages']} ({row['live']} live, {row['listed']} listed, {row['unlisted']} unlisted, "
            f"{row['tombstoned']} tombstoned, {row['due']} due, {row['never_crawled']} never crawled"
            + (f", {disallowed} disallowed by robots.txt" if disallowed else "")
            + (f" ({indexed} still indexed from an earlier crawl)" if indexed else "")
            + (f"; {aliases} of the {row['pages']} {'is a redirect alias' if aliases == 1 else 'are redirect aliases'}"
               " (its URL redirects to a page counted here)" if aliases else "") + ")")


def show_site(name: str, as_json: bool) -> None:
    from rag_pipeline.cli.site_commands import ONLY_RUNNING, UnknownSite, every_site
    from rag_pipeline.components.site_component import describe
    from rag_pipeline.components.site_files import declarations
    from rag_pipeline.crawl.cadence_rules import format_interval
    from rag_pipeline.cli.template_views import template_facts
    from rag_pipeline.store import db, disallowed, site_templates
    from rag_pipeline.store import sites as store

    found = declarations()
    declared = {c.spec().name: c.spec() for c in found.sites}
    broken = next((p for p in found.problems if p.name == name), None)
    with db.connection(index_url()) as conn:
        rows = store.overview(conn)
        recorded = store.declared_row(conn, name)
        held = disallowed.examples(conn, name)
        learned = site_templates.load(conn, name)
    row = next((r for r in rows if r["site"] == name), None)
    facts: dict = {"site": name, "declared_here": name in declared, "does_not_load": None, "declaration": None,
                   "other_site_files_not_loading": [p.one_line() for p in found.problems if p.name != name]}
    if name in declared:
        spec = declared[name]
        facts["declaration"] = {"summary": describe(spec), "sitemaps": list(spec.sitemaps),
                                "robots_sitemaps": spec.robots_sitemaps, "seeds": list(spec.seeds),
                                "max_pages": spec.max_pages, "shards": spec.shards,
                                "discover_every": format_interval(spec.discover_every)}
        scope, exclude = list(spec.scope), list(spec.exclude)
    elif broken is not None:
        facts["does_not_load"] = broken.as_dict()
        scope, exclude = (recorded["scope"], recorded["exclude"]) if recorded else ([], [])
    elif recorded is not None:
        facts["declaration"] = {"summary": f"{name}: up to {recorded['max_pages']:,} pages, read every "
                                           f"{format_interval(recorded['discover_every'])} ({ONLY_RUNNING})",
                                "max_pages": recorded["max_pages"], "shards": recorded["shards"],
                                "discover_every": format_interval(recorded["discover_every"])}
        scope, exclude = recorded["scope"], recorded["exclude"]
    else:
        raise UnknownSite(f"no site {name!r} is declared; declared sites: "
                          f"{every_site(found, {r['site'] for r in rows})}")
    facts.update(scope=scope, exclude=exclude, pages=None if row is None else {
        k: row[k] for k in ("pages", "live", "listed", "unlisted", "tombstoned", "due", "never_crawled", "aliases",
                            "disallowed", "disallowed_indexed")},
        last_reading=None if row is None else row["last_reading"],
        next_reading_at=None if row is None else row["next_reading_at"],
        disallowed_examples=[{"crawl_url": d.crawl_url, "rule": d.rule, "found_at": d.found_at,
                              "next_look_at": d.next_look_at} for d in held],
        template=template_facts(learned))
    if as_json:
        click.echo(json.dumps(facts, default=str, indent=2))
    else:
        _print(facts, row)
    if broken is not None:
        raise click.exceptions.Exit(1)


def _print(facts: dict, row: dict | None) -> None:
    if facts["does_not_load"]:
        click.echo(f"{facts['site']}: DOES NOT LOAD: {facts['does_not_load']['problem']}")
        click.echo("  left out of the code location until the file is fixed (the other sites run on); "
                   "its pages stay indexed")
    else:
        click.echo(facts["declaration"]["summary"])
    if facts["scope"]:
        # Over identities: a page served over http is the same page as over https (one history).
        click.echo(f"  scope (globs over page identities, spelled https:// whatever the scheme): "
                   f"{', '.join(facts['scope'])}" + (f"; excluding {', '.join(facts['exclude'])}" if facts["exclude"] else ""))
    if row is None:
        click.echo("  not read yet")
    else:
        click.echo(f"  pages: {pages_line(row)}")
        examples = facts["disallowed_examples"]
        for d in examples:
            click.echo(f"  disallowed by robots.txt: {d['crawl_url']} ({d['rule']}), found "
                       f"{ago(d['found_at'], row['now'])}; looked at again {ago(d['next_look_at'], row['now'])}")
        if row.get("disallowed", 0) > len(examples):
            click.echo(f"  … and {row['disallowed'] - len(examples)} more disallowed by robots.txt")
        click.echo(f"  last reading: {reading_line(row)}")
        reading = row["last_reading"]
        if reading and reading["counts"]:
            shown = {k: v for k, v in reading["counts"].items() if v}
            click.echo("    " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items()))
        for problem in (reading or {}).get("problems") or []:
            click.echo(f"    problem: {problem}")
        click.echo(f"  next reading: {ago(row['next_reading_at'], row['now']) if row['next_reading_at'] else 'at once'}")
    from rag_pipeline.cli.template_views import template_lines

    for line in template_lines(facts["template"]):
        click.echo(f"  {line}")
    for other in facts["other_site_files_not_loading"]:
        click.echo(f"  (another site file does not load: {other})")


def declared_state() -> dict:
    """For `status`: the site files that do not load (file:line: field: reason), and every name a
    site file declares, loaded or not, so a site whose file was removed reads "no longer declared"."""
    from rag_pipeline.components.site_files import declarations

    found = declarations()
    names = {*found.names(), *(c.name or c._folder for c in found.disabled), *(p.name for p in found.problems)}
    return {"not_loading": [p.as_dict() for p in found.problems], "declared": sorted(names)}
