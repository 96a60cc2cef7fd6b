"""What `rag-pipeline site show` and `site template` say of a site's learned template, in words and
as JSON: one set of facts for both (template_facts), so the text never says what the JSON does not."""

from __future__ import annotations

import json

import click

from rag_pipeline.cli.common import index_url

SHOWN_IN_SITE_SHOW = 10


def template_facts(learned) -> dict:
    """A stored template (store.site_templates.Learned, or None) as plain facts, every block included."""
    if learned is None:
        return {"learned_at": None, "pages": None, "blocks_by_kind": {}, "blocks": [], "pins": [],
                "failed_at": None, "error": None, "now": None}
    from rag_pipeline.core.template_rows import blocks_by_kind

    template = learned.template
    blocks = list(template.blocks) if template is not None else []
    return {"learned_at": learned.learned_at, "pages": template.pages if template is not None else None,
            "blocks_by_kind": blocks_by_kind(blocks),
            "blocks": [{"kind": b.kind, "why": b.by, "pages_seen": b.pages_seen, "scope": b.scope,
                        "example_url": b.example_url, "canonical_url": b.canonical_url, "text": b.text,
                        "fingerprint": b.fingerprint} for b in blocks],
            "pins": [{"as": p.role, p.how: p.pattern} for p in template.pins] if template is not None else [],
            "failed_at": learned.failed_at, "error": learned.error, "now": learned.now}


def _excerpt(text: str, width: int) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def template_lines(facts: dict, limit: int | None = SHOWN_IN_SITE_SHOW, excerpt: int = 80) -> list[str]:
    """The template section: when and from how many pages, blocks by kind, then the blocks (the
    first ``limit``, most pages seen first; None: all), each with its pages seen and example page."""
    from rag_pipeline.cli.site_views import ago

    if facts["learned_at"] is None:
        lines = ["template: never learned (its discovery run learns it once its pages have a stored source)"]
    else:
        kinds = ", ".join(f"{n} {kind}" for kind, n in facts["blocks_by_kind"].items()) or "none"
        lines = [f"template: learned {ago(facts['learned_at'], facts['now'])} from {facts['pages']} pages: "
                 f"{len(facts['blocks'])} blocks ({kinds})"]
    if facts["error"]:
        kept = "the template above is kept" if facts["learned_at"] is not None else "nothing learned yet"
        lines.append(f"  last learning FAILED {ago(facts['failed_at'], facts['now'])}: {facts['error']} ({kept})")
    shown = facts["blocks"] if limit is None else facts["blocks"][:limit]
    for b in shown:
        canonical = f"; stays content on {b['canonical_url']}" if b["canonical_url"] else ""
        lines.append(f"  {b['pages_seen']:>6} pages  {b['kind']} by {b['why']} ({b['scope']}), e.g. "
                     f"{b['example_url']}{canonical}: {_excerpt(b['text'], excerpt)}")
    if len(shown) < len(facts["blocks"]):
        lines.append(f"  … and {len(facts['blocks']) - len(shown)} more: rag-pipeline site template <site>")
    return lines


def show_template(name: str, as_json: bool, learn: bool) -> None:
    """`site template NAME [--learn]`: every block of the stored template; --learn learns it now."""
    from rag_pipeline.cli.site_commands import UnknownSite, _site, every_site
    from rag_pipeline.components.site_files import declarations
    from rag_pipeline.crawl.template_learning import learn_site
    from rag_pipeline.store import db
    from rag_pipeline.store import site_templates
    from rag_pipeline.store import sites as store

    learning = None
    with db.connection(index_url()) as conn:
        running = {r["site"] for r in store.overview(conn)}
        if learn:
            spec, _ = _site(name, running)   # pins are the site file's: it must be declared here
            learning = learn_site(conn, spec, force=True)
        else:
            found = declarations()
            if name not in found.names() and store.declared_row(conn, name) is None:
                raise UnknownSite(f"no site {name!r} is declared; declared sites: {every_site(found, running)}")
        facts = {"site": name, **template_facts(site_templates.load(conn, name))}
    if learning is not None:
        facts["learning"] = {"outcome": learning.outcome, "seconds": round(learning.seconds, 3),
                             "error": learning.error}
    if as_json:
        click.echo(json.dumps(facts, default=str, indent=2))
    else:
        if learning is not None:
            click.echo(learning.summary)
        click.echo(f"{name}: " + "\n".join(template_lines(facts, limit=None, excerpt=200)))
    if learning is not None and learning.outcome == "failed":
        raise click.exceptions.Exit(1)
