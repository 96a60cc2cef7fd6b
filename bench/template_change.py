"""What a site-wide template change costs (issue 43): tokens embedded and pages routed changed when
a site is redeployed, with its template learned and kept out of change detection and embeddings.

The corpus is real: every page of Django 5.2.19's own documentation (the text docs of its source
release on the package index, downloaded once like bench/search_modes.py's; `--pages N` a seeded
subset), each wrapped as a Crawlbase-style full-page markdown crawl would deliver it:

  a cookie banner line;
  a top navigation of 12 links;
  a sidebar listing up to 25 pages of the page's section (its first path segment), linking to
  the site's own URLs;
  the page's content;
  a footer with "Build <hex id> · <date>", "Last updated <date>" and the copyright line.

The template is a function of (site pages, version): each version after the first adds one
navigation item, one (newly published) page to every section's sidebar, and a new build id and
date. The site is loaded through the production path in process (stored as deliveries, then
route_batch → queued_work → plan_batches → apply_batch, as delivery_sensor and the index_batch
runs do, with the hash embedder and the API embedders' 512/64 chunk budget; tokens are the
embedding ledger's). The docs are a declared site, so its batch runs learn its template as they
would in production (crawl/template_learning.py learn_young_sites: from its first batch, again as
it doubles), and routing compares each recrawl past it. Then the site is recrawled three times,
each recrawl delivering every page again:

  1. template only: template version 2, the content unchanged;
  2. template version 3 plus real content edits: one paragraph of 10% of the pages (a seeded
     choice) gets a sentence more;
  3. template version 4 plus an edit next to the template: the first prose paragraph of the
     content (next to the sidebar) on half of another 10% of the pages, the last (next to the
     footer) on the other half.

The recrawls follow one another on the same database (each one's content is the previous one's
plus its own edits). The same pages with no template at all (the baseline) go through the same
load and recrawls in a database of their own. Per recrawl: tokens embedded, pages routed changed
(queued for a run) of those delivered, the batch runs that applied them, and the tokens as a share
of that arm's full load; and whether every edited page's new sentence is in its chunks.

    .venv/bin/python bench/template_change.py [--pages N] [--seed 7] [--edit-share 0.1]
        [--peers] [--venv ~/.cache/rag-pipeline-bench/peers-venv] [--timeout 1800]

`--peers` also runs LangChain and CocoIndex (bench/peers.py's runner in its own venv, made once
with pinned versions; embedding through the loopback OpenAI fake, whose counter gives their
tokens) on the load and the template-only recrawl, with the template and without, side by side.
The last line: `template_change: template-only recrawl embeds X% of the full load (no template:
Y%), routes N of M pages changed; content edits: ...`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import random
import re
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.database import bench_database  # noqa: E402
from bench.labelled import django_docs  # noqa: E402
from rag_pipeline.core.batch_sizing import plan_batches  # noqa: E402
from rag_pipeline.core.tokens import count_tokens  # noqa: E402
from rag_pipeline.core.urls import normalize_url  # noqa: E402
from rag_pipeline.embedders.hash_embedder import HashEmbedder  # noqa: E402
from rag_pipeline.ingest import batch_apply  # noqa: E402
from rag_pipeline.ingest.routing import route_batch  # noqa: E402
from rag_pipeline.settings import load_settings  # noqa: E402
from rag_pipeline.core.site_spec import SiteSpec  # noqa: E402
from rag_pipeline.store import db, deliveries, sites  # noqa: E402

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

BASE = django_docs.BASE_URL
SITE = "https://www.djangoproject.com/"
DOCS_SITE = SiteSpec(name="django", seeds=(BASE,))
CHUNK_BUDGET = (512, 64)          # the API embedders' default budget (Settings.chunk_budget), as peers.py's
MAX_PAGE_BYTES = 50_000_000
SIDEBAR_PAGES = 25
NAV = [("Home", SITE), ("Overview", SITE + "start/overview/"), ("Download", SITE + "download/"),
       ("Documentation", BASE), ("News", SITE + "weblog/"), ("Code", "https://github.com/django/django"),
       ("Issues", "https://code.djangoproject.com/"), ("Community", SITE + "community/"),
       ("Foundation", SITE + "foundation/"), ("Getting started", BASE + "intro/"),
       ("Topic guides", BASE + "topics/"), ("API reference", BASE + "ref/")]
NEW_NAV = [("Forum", "https://forum.djangoproject.com/"), ("Fundraising", SITE + "fundraising/"),
           ("Events", SITE + "community/events/")]
_PROSE = re.compile(r"^[A-Z][^\n]*[a-z]")


# -- the site ------------------------------------------------------------------------------------


def site_pages(sdist: Path, n: int | None, seed: int) -> dict[str, str]:
    """URL → markdown of every text page of the release's docs (a seeded subset of `n`)."""
    found = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/docs/", 1)[1] if "/docs/" in member.name else None
            if rel and member.isfile() and rel.endswith(".txt") and not rel.startswith("_"):
                found[django_docs.url_of(rel)] = django_docs.to_markdown(tar.extractfile(member).read().decode())
    urls = sorted(found)
    if n is not None and n < len(urls):
        urls = sorted(random.Random(seed).sample(urls, n))
    return {u: found[u] for u in urls}


def section_of(url: str) -> str:
    """A page's section: the first segment of its path under the docs root ("" at the root)."""
    return url.removeprefix(BASE).split("/", 1)[0] if "/" in url.removeprefix(BASE) else ""


def title_of(markdown: str, url: str) -> str:
    return next((line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("# ")),
                url.removeprefix(BASE).strip("/") or "Django documentation")


@dataclass(frozen=True)
class Template:
    """The site's template at one version: its navigation, its sidebars (section → links), and
    its footer's build id and date."""

    version: int
    nav: list[tuple[str, str]]
    sidebars: dict[str, list[tuple[str, str]]]
    headings: dict[str, str]
    build: str
    day: date

    def wrap(self, url: str, content: str) -> str:
        banner = ("We use cookies to understand how you use our site and to improve your experience. "
                  f"[Accept all cookies](#accept) [Cookie policy]({SITE}cookies/)")
        nav = "\n".join(f"* [{text}]({link})" for text, link in self.nav)
        section = section_of(url)
        sidebar = "\n".join(f"* [{text}]({link})" for text, link in self.sidebars[section])
        footer = (f"Build {self.build} · {self.day.isoformat()}\n\nLast updated {self.day:%B %-d, %Y}\n\n"
                  "© 2005-2026 Django Software Foundation and individual contributors. Django is a "
                  "registered trademark of the Django Software Foundation.")
        return (f"{banner}\n\n[Django documentation]({BASE})\n\n{nav}\n\n"
                f"**{self.headings[section]}**\n\n{sidebar}\n\n{content.strip()}\n\n{footer}\n")


def template(pages: dict[str, str], version: int) -> Template:
    """Version 1: 12 navigation links, the first 25 pages of each section (URL order) in its
    sidebar. Each later version adds a navigation item, a newly published page to every
    section's sidebar, and a new build id and date."""
    by_section: dict[str, list[tuple[str, str]]] = {}
    for url in sorted(pages):
        by_section.setdefault(section_of(url), []).append((url, title_of(pages[url], url)))
    sidebars, headings = {}, {}
    for section, listed in by_section.items():
        index = dict(listed).get(f"{BASE}{section}/" if section else BASE)
        headings[section] = f"In this section: {index or section.capitalize()}"
        links = [(title, url) for url, title in listed[:SIDEBAR_PAGES]]
        for v in range(2, version + 1):
            new = f"{BASE}{section + '/' if section else ''}new-in-build-{v}/"
            links.append((f"What's new in {section or 'the docs'} ({v})", new))
        sidebars[section] = sorted(links, key=lambda link: link[1])
    build = hashlib.sha1(f"build {version}".encode()).hexdigest()[:10]
    return Template(version, NAV + NEW_NAV[:version - 1], sidebars, headings, build,
                    date(2026, 11, 2) + timedelta(days=9 * (version - 1)))


# -- content edits -------------------------------------------------------------------------------


def prose_blocks(markdown: str) -> list[int]:
    """Indexes of the blank-line separated blocks that are prose paragraphs (not headings,
    directives, code or lists)."""
    blocks = markdown.split("\n\n")
    return [i for i, b in enumerate(blocks) if _PROSE.match(b) and len(b.split()) >= 12 and "::" not in b]


def edit(markdown: str, which: str, rng: random.Random, marker: str) -> str:
    """One paragraph of `markdown` with a sentence more: the first prose paragraph, the last, or
    a seeded one (`which`)."""
    blocks = markdown.split("\n\n")
    prose = prose_blocks(markdown)
    i = prose[0] if which == "first" else prose[-1] if which == "last" else rng.choice(prose)
    blocks[i] = blocks[i].rstrip() + f" Since {marker}, this behaves as the release notes describe."
    return "\n\n".join(blocks)


@dataclass
class Edits:
    """The content of each page at one recrawl, and the pages edited in it (URL → marker)."""

    content: dict[str, str]
    edited: dict[str, str] = field(default_factory=dict)


def edit_share(content: dict[str, str], share: float, rng: random.Random, kind: str,
               avoid: set[str] = frozenset(), first_ticket: int = 35000) -> Edits:
    """`share` of the pages with a prose paragraph (none of `avoid`), each with one paragraph
    edited: `kind` "middle" (a seeded paragraph) or "edge" (first and last, alternately)."""
    candidates = [u for u in sorted(content) if prose_blocks(content[u]) and u not in avoid]
    chosen = sorted(rng.sample(candidates, min(len(candidates), max(1, round(len(content) * share)))))
    out = Edits(dict(content))
    for n, url in enumerate(chosen):
        marker = f"ticket #{first_ticket + n}"
        which = "any" if kind == "middle" else ("first", "last")[n % 2]
        out.content[url] = edit(content[url], which, rng, marker)
        out.edited[url] = marker
    return out


# -- the production path, in process -------------------------------------------------------------


@dataclass
class Step:
    name: str
    delivered: int = 0
    routed_changed: int = 0
    batches: int = 0
    applied: int = 0
    tokens: int = 0
    chunks: int = 0
    seconds: float = 0.0
    searchable: int | None = None
    edited: int = 0
    shared: int = 0                 # chunks whose exact text is on more than one page


def crawl(conn, name: str, pages: dict[str, str], embedder, settings) -> Step:
    """Deliver every page, then route and apply until nothing is left, as delivery_sensor and
    its batch runs do; what it cost, from the router's outcomes and the embedding ledger."""
    step = Step(name, delivered=len(pages))
    started = time.perf_counter()
    before = ledger(conn)
    with conn.transaction():
        for url, markdown in pages.items():
            deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                              original_status=200, content_type="text/markdown",
                              body=gzip.compress(markdown.encode()), body_encoding="gzip")
    while True:
        routed = route_batch(conn, settings.sensor_batch_size, MAX_PAGE_BYTES)
        step.routed_changed += routed.outcomes.get("queued", 0)
        work = deliveries.queued_work(conn, settings.sensor_batch_size)
        if not routed.routed and not work:
            break
        for batch in plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens, settings.batch_spread):
            events = list(batch_apply.apply_batch(
                conn, batch, batch_key=None, embedder_for=lambda _space: embedder,
                chunk_budget=lambda _space: CHUNK_BUDGET, max_page_bytes=MAX_PAGE_BYTES,
                retry=batch_apply.RetryPolicy(3, 1.0), run_id=name))
            failed = [e for e in events if isinstance(e, batch_apply.Failed)]
            if failed:
                raise SystemExit(f"{name}: {len(failed)} page(s) failed, first: {failed[0].failure.reason}")
            step.batches += 1
            step.applied += len(batch)
    after = ledger(conn)
    step.tokens, step.chunks = after[0] - before[0], after[1] - before[1]
    step.seconds = time.perf_counter() - started
    return step


def ledger(conn) -> tuple[int, int]:
    row = conn.execute("SELECT coalesce(sum(tokens_embedded), 0), coalesce(sum(chunks_embedded), 0)"
                       " FROM embedding_ledger").fetchone()
    return int(row[0]), int(row[1])


def searchable(conn, edited: dict[str, str]) -> int:
    """How many edited pages have their new sentence (its marker) in one of their chunks."""
    found = 0
    for url, marker in edited.items():
        found += conn.execute("SELECT EXISTS (SELECT 1 FROM chunks c JOIN pages p USING (page_id)"
                              " WHERE p.url = %s AND c.content LIKE %s)",
                              (normalize_url(url), f"%Since {marker},%")).fetchone()[0]
    return found


def shared_chunks(conn) -> int:
    """Live chunks whose embedded text is the same on several pages: with a template, the passages
    that hold only its navigation and sidebar (what search would find for a menu's words)."""
    return conn.execute("SELECT count(*) FROM chunks WHERE embed_hash IN (SELECT embed_hash FROM chunks"
                        " GROUP BY 1 HAVING count(DISTINCT page_id) > 1)").fetchone()[0]


def learned(conn) -> str:
    row = conn.execute("SELECT t.pages, count(b.*), t.learned_at IS NOT NULL FROM site_templates t"
                       " LEFT JOIN site_template_blocks b USING (site) WHERE t.site = 'django'"
                       " GROUP BY t.pages, t.learned_at").fetchone()
    return f"template learned from {row[0]} pages, {row[1]} blocks" if row and row[2] else "no template learned"


def run_arm(label: str, versions: list[Template | None], contents: list[Edits], settings) -> list[Step]:
    """The load and the three recrawls of one arm (with the template, or none) in its own database."""
    embedder = HashEmbedder(dimensions=256)
    names = ["full load", "1. template only", "2. + 10% paragraph edits", "3. + edits next to the template"]
    steps = []
    with bench_database(f"bench_template_{label}") as url, db.connection(url) as conn:
        conn.autocommit = True
        sites.sync_declared(conn, [DOCS_SITE])
        for name, tpl, edits in zip(names, versions, contents):
            pages = {u: tpl.wrap(u, text) if tpl else text for u, text in edits.content.items()}
            step = crawl(conn, name, pages, embedder, settings)
            if edits.edited:
                step.edited, step.searchable = len(edits.edited), searchable(conn, edits.edited)
            step.shared = shared_chunks(conn)
            steps.append(step)
            print(f"  [{label}] {name}: {step.tokens:,} tokens, {step.routed_changed} of {step.delivered} routed "
                  f"changed, {step.batches} batches, {step.seconds:.1f} s; {learned(conn)}", flush=True)
    return steps


# -- peers ---------------------------------------------------------------------------------------


def run_peers(args, initial: dict[str, str], bare: dict[str, str], versions: list[Template]) -> dict:
    """LangChain and CocoIndex through bench/peers.py's machinery: (system, arm) → (load tokens,
    template-only recrawl tokens), or an error."""
    from bench import peers
    from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

    python = peers.ensure_peers_venv(args.venv)
    names = {url: f"{n:04d}.md" for n, url in enumerate(sorted(initial))}
    arms = {"template": ({names[u]: versions[0].wrap(u, t) for u, t in initial.items()},
                         {names[u]: versions[1].wrap(u, t) for u, t in initial.items()}),
            "none": ({names[u]: t for u, t in bare.items()}, {names[u]: t for u, t in bare.items()})}
    out = {}
    work = Path(tempfile.mkdtemp(prefix="bench-template-peers-"))
    try:
        with FakeOpenAI(dimensions=peers.DIMENSIONS) as fake, bench_database("bench_template_peers") as server:
            base = peers.conninfo_dbname(server)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHONPATH"))}
            env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
            for system in ("langchain", "cocoindex"):
                for arm, texts in arms.items():
                    corpus = work / f"corpus_{system}_{arm}"
                    corpus.mkdir()
                    chars = sum(map(len, texts[0].values())) / sum(count_tokens(t) for t in texts[0].values())
                    name = f"{base}_{system}_{arm}"
                    db_url = peers.create_peer_database(server, name)
                    commands = {phase: peers.peer_command(python, system, phase, corpus, db_url, fake.base_url,
                                                          False, work / f"state_{system}_{arm}", chars)
                                for phase in ("initial", "recrawl")}
                    run = peers.Run(system, False)
                    print(f"  [{arm}] {system}:", flush=True)
                    peers.run_system(run, commands, env, corpus, texts, fake, args.timeout)
                    out[(system, arm)] = run
                    peers.drop_database(server, name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# -- report --------------------------------------------------------------------------------------


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def report(with_t: list[Step], without: list[Step]) -> None:
    load_t, load_n = with_t[0].tokens, without[0].tokens
    print(f"\nfull load: {load_t:,} tokens ({with_t[0].chunks:,} chunks) with the template, {load_n:,} "
          f"({without[0].chunks:,}) without "
          f"(the template is {pct(load_t - load_n, load_t)} of what is embedded); chunks whose text is on several "
          f"pages after the load: {with_t[0].shared:,} with the template, {without[0].shared:,} without")
    head = (f"{'recrawl':<34} {'template':<9} {'tokens':>9} {'chunks':>7} {'of load':>8} {'routed changed':>15} {'batches':>8} "
            f"{'edited pages searchable':>24}")
    print(head)
    print("-" * len(head))
    for i in (1, 2, 3):
        for arm, steps in (("yes", with_t), ("none", without)):
            s = steps[i]
            found = f"{s.searchable} of {s.edited}" if s.edited else "-"
            print(f"{s.name:<34} {arm:<9} {s.tokens:>9,} {s.chunks:>7,} {pct(s.tokens, steps[0].tokens):>8} "
                  f"{f'{s.routed_changed} of {s.delivered}':>15} {s.batches:>8} {found:>24}")
    for i in (2, 3):
        ratio = f"{with_t[i].tokens / without[i].tokens:.2f}x" if without[i].tokens else "n/a"
        print(f"recrawl {i}: {with_t[i].tokens:,} tokens with the template vs {without[i].tokens:,} for the same "
              f"edits without it ({ratio})")


def acceptance(with_t: list[Step], without: list[Step]) -> str:
    """Issue 43's acceptance on these figures."""
    one, edits = with_t[1], with_t[2]
    tokens_ok = one.tokens <= 0.01 * with_t[0].tokens
    routed_ok = one.routed_changed <= 0.01 * one.delivered
    edits_ok = abs(edits.tokens - without[2].tokens) <= 0.05 * without[2].tokens
    searchable_ok = edits.searchable == edits.edited
    yes = {True: "yes", False: "NO"}
    return (f"issue 43 acceptance: template-only tokens ≤ 1% of the load: {yes[tokens_ok]} "
            f"({pct(one.tokens, with_t[0].tokens)}); pages routed changed ≤ 1%: {yes[routed_ok]} "
            f"({pct(one.routed_changed, one.delivered)}); edit tokens within 5% of no template: {yes[edits_ok]} "
            f"({edits.tokens:,} vs {without[2].tokens:,}); every edited page searchable: {yes[searchable_ok]}")


def summary(with_t: list[Step], without: list[Step]) -> str:
    one, edits, edge = with_t[1], with_t[2], with_t[3]
    return (f"template_change: template-only recrawl embeds {pct(one.tokens, with_t[0].tokens)} of the full load "
            f"(no template: {pct(without[1].tokens, without[0].tokens)}), routes {one.routed_changed} of "
            f"{one.delivered} pages changed (no template: {without[1].routed_changed}); content edits: "
            f"{edits.tokens:,} tokens vs {without[2].tokens:,} without the template "
            f"({edits.routed_changed} vs {without[2].routed_changed} pages routed changed); edits next to the "
            f"template: {edge.tokens:,} vs {without[3].tokens:,} ({edge.routed_changed} vs "
            f"{without[3].routed_changed} pages)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=None, help="a seeded subset of N pages (default: all)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--edit-share", type=float, default=0.1, help="share of pages edited in recrawls 2 and 3")
    parser.add_argument("--peers", action="store_true", help="also LangChain and CocoIndex (their own venv)")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "rag-pipeline-bench" / "peers-venv")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one peer phase may take")
    args = parser.parse_args()
    if args.pages is not None and args.pages < 10:
        parser.error("--pages must be at least 10")
    if not 0 < args.edit_share <= 0.5:
        parser.error("--edit-share must be in (0, 0.5]")

    content = site_pages(django_docs.fetch(), args.pages, args.seed)
    rng = random.Random(args.seed)
    middle = edit_share(content, args.edit_share, rng, "middle")
    edge = edit_share(middle.content, args.edit_share, rng, "edge", avoid=set(middle.edited), first_ticket=36000)
    contents = [Edits(content), Edits(content), middle, edge]
    versions = [template(content, v) for v in (1, 2, 3, 4)]
    sections = {section_of(u) for u in content}
    print(f"template_change: Django {django_docs.RELEASE} docs, {len(content)} pages in {len(sections)} sections, "
          f"{sum(map(count_tokens, content.values())):,} tokens of content; template v1 adds "
          f"{count_tokens(versions[0].wrap(next(iter(content)), ''))} tokens to the first page; recrawl 2 edits "
          f"{len(middle.edited)} pages, recrawl 3 {len(edge.edited)}; {os.cpu_count()} cores, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    settings = load_settings()
    with_t = run_arm("template", versions, contents, settings)
    without = run_arm("none", [None] * 4, contents, settings)
    report(with_t, without)
    if args.peers:
        print("\npeers (LangChain, CocoIndex; tokens billed by the loopback OpenAI fake):", flush=True)
        runs = run_peers(args, content, content, versions[:2])
        print(f"{'system':<11} {'arm':<14} {'load tokens':>12} {'template-only recrawl':>22} {'of load':>8}")
        print(f"{'ours':<11} {'with template':<14} {with_t[0].tokens:>12,} {with_t[1].tokens:>22,} "
              f"{pct(with_t[1].tokens, with_t[0].tokens):>8}")
        print(f"{'ours':<11} {'no template':<14} {without[0].tokens:>12,} {without[1].tokens:>22,} "
              f"{pct(without[1].tokens, without[0].tokens):>8}")
        for (system, arm), run in runs.items():
            arm_name = "with template" if arm == "template" else "no template"
            if run.error or not run.recrawl:
                print(f"{system:<11} {arm_name:<14} FAILED: {(run.error or 'no recrawl').splitlines()[0]}")
                continue
            print(f"{system:<11} {arm_name:<14} {run.initial.tokens:>12,} {run.recrawl.tokens:>22,} "
                  f"{pct(run.recrawl.tokens, run.initial.tokens):>8}")
    print(acceptance(with_t, without))
    print(summary(with_t, without))
    return 0


if __name__ == "__main__":
    sys.exit(main())
