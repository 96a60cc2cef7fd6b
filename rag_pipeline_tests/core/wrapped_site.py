"""A documentation site as a full-page crawl delivers it: each page's content wrapped in the site's
chrome, as Crawlbase's markdown of a page carries it. A top navigation of 12 links, a cookie banner,
a sidebar listing up to 25 pages of the page's section (the current page in bold, unlinked), and a
footer with "Build <hex> · <date>", "Last updated <date>" and a copyright line.

The content is real-looking documentation: the repository's samples/*.md, and pages assembled from
sentences of doc prose (deterministic by seed). ``Chrome`` holds what a redeploy changes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path

SITE = "https://docs.example.org"
SECTIONS = {"intro": 6, "topics": 30, "ref": 40, "howto": 12}
NAV = ["Home", "Getting started", "Topics", "Reference", "How-to guides", "FAQ", "Release notes",
       "Internals", "Community", "Download", "Search", "GitHub"]
SAMPLES = Path(__file__).resolve().parents[2] / "samples"

SENTENCES = [
    "A delivery is stored before it is acknowledged, so a crash never loses a page.",
    "The sensor adds partitions and requests runs only for pages whose content changed.",
    "Chunks are anchored at headings and paragraph breaks, then packed up to about 512 tokens.",
    "Each chunk is addressed by the SHA-256 of the exact text sent to the embedding model.",
    "A page that did not change since its last crawl gets a new verification time and no run.",
    "Set the recrawl interval per site; a page that changes often is crawled more often.",
    "The query API returns passages with their citation, the page URL and both timestamps.",
    "When the model changes, a second embedding space is built from the stored chunk text.",
    "Search stays exact while the index is being built, and says so in its answer.",
    "Use the status command to see the backlog, the last run and any failing check.",
    "Tombstoned pages keep their history but their chunks leave the search index.",
    "A site definition that fails to load fails that site only; the others keep running.",
    "Webhook tokens are compared in constant time and never written to the logs.",
    "Retries back off exponentially and stop after the configured number of attempts.",
    "Large backlogs are loaded without the HNSW index, which is built once at the end.",
    "The ledger counts every token embedded, by run, by site and by model.",
]


@dataclass(frozen=True)
class Chrome:
    """The site's template, as a redeploy changes it."""

    nav_extra: tuple[str, ...] = ()
    sidebar_extra: str | None = None  # a page title added to every sidebar
    build: str = "4f3a9c1"
    built_on: str = "2026-12-01"
    updated: dict[str, str] = field(default_factory=dict)  # url → "Last updated" date

    def redeployed(self) -> Chrome:
        """One navigation item and one sidebar page added, a new build id and dates."""
        return replace(self, nav_extra=(*self.nav_extra, "Blog"), sidebar_extra="Upgrading to 6.0",
                       build="9b2e771", built_on="2026-12-07",
                       updated={url: "2026-12-07" for url in self.updated})


def slug(title: str) -> str:
    return "-".join(title.lower().replace(".", "").split())


def _sample_pages() -> list[str]:
    return [path.read_text(encoding="utf-8").strip() for path in sorted(SAMPLES.glob("*.md"))]


def content_pages(seed: int = 7) -> dict[str, tuple[str, str]]:
    """URL → (title, content markdown), per section; the samples are the first intro pages."""
    rng = random.Random(seed)
    samples = _sample_pages()
    pages: dict[str, tuple[str, str]] = {}
    for section, count in SECTIONS.items():
        for number in range(count):
            if section == "intro" and number < len(samples):
                text = samples[number]
                title = text.splitlines()[0].lstrip("# ").strip()
            else:
                title = f"{section.capitalize()} {rng.choice(['of', 'for', 'with'])} part {number + 1}"
                paragraphs = [" ".join(rng.sample(SENTENCES, rng.randint(2, 4))) for _ in range(rng.randint(2, 4))]
                code = f"```python\nsettings.RECRAWL_EVERY = {rng.randint(1, 90)}\n```"
                steps = "\n".join(f"- {sentence}" for sentence in rng.sample(SENTENCES, 3))
                text = "\n\n".join([f"# {title}", paragraphs[0], f"## Details", *paragraphs[1:], code, steps])
            pages[f"{SITE}/{section}/{slug(title)}/"] = (title, text)
    return pages


def wrap(url: str, title: str, content: str, section_titles: list[tuple[str, str]], chrome: Chrome) -> str:
    """The page as the crawl delivers it: chrome, content, sidebar, footer."""
    nav = [*NAV, *chrome.nav_extra]
    nav_lines = "\n".join(f"- [{name}]({SITE}/{slug(name)}/)" for name in nav)
    sidebar = [(t, u) for t, u in section_titles[:25]]
    if chrome.sidebar_extra:
        sidebar.append((chrome.sidebar_extra, f"{SITE}/{url.split('/')[3]}/{slug(chrome.sidebar_extra)}/"))
    sidebar_lines = "\n".join(f"- **{t}**" if u == url else f"- [{t}]({u})" for t, u in sidebar)
    updated = chrome.updated.get(url, chrome.built_on)
    return "\n\n".join([
        "[Skip to main content](#main)",
        nav_lines,
        "We use cookies to understand how the documentation is read. By continuing to browse you "
        f"accept our [cookie policy]({SITE}/legal/cookies/). [Accept](#accept)",
        content,
        "### In this section",
        sidebar_lines,
        f"Build {chrome.build} · {chrome.built_on}",
        f"Last updated {updated}",
        f"© 2026 Example Project. [Privacy]({SITE}/legal/privacy/) · [Terms]({SITE}/legal/terms/)",
    ])


def wrapped_site(chrome: Chrome = Chrome(), contents: dict[str, tuple[str, str]] | None = None) -> dict[str, str]:
    """URL → full-page markdown for the whole site."""
    contents = contents if contents is not None else content_pages()
    by_section: dict[str, list[tuple[str, str]]] = {}
    for url, (title, _) in contents.items():
        by_section.setdefault(url.split("/")[3], []).append((title, url))
    return {url: wrap(url, title, text, by_section[url.split("/")[3]], chrome)
            for url, (title, text) in contents.items()}


def own_site(url: str) -> bool:
    return url.startswith(SITE + "/")
