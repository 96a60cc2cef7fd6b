"""A real documentation site for the benches: Salt 3008.5's own documentation, from its source
release on the package index (`bench/peers.py --docs salt`).

Salt's docs are one of the larger prose sites a package ships in its sdist: the `doc/` tree of
the release holds the topics (tutorials, the state system, cloud, development), the reference's
hand-written pages (configuration, CLI, states' and renderers' guides) and the release notes (the
newer ones in markdown), one page a file, at the URL the page has on docs.saltproject.io. Left
out: the reference pages that are only an `automodule`/`autosummary` directive (their text is the
code's docstrings, which the docs tree does not hold; the site renders them at build time), the
include fragments (`_incl/`), the release-note templates and the man pages (`man/`, troff).

reST pages become markdown as a crawler delivers them (sdist_docs.to_markdown: section titles as
`#` headings, every other line as written); markdown pages are delivered as written.

    .venv/bin/python bench/labelled/salt_docs.py    # fetches once, prints the corpus's figures
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run as a program

from bench.labelled.sdist_docs import _UNDERLINE, CACHE, fetch_sdist, to_markdown  # noqa: E402

RELEASE = "3008.5"
SDIST = f"salt-{RELEASE}.tar.gz"
SHA256 = "0259deafd601d783721e5aa8ed10677d8c4d6cc12f5de17499af71590d593315"
BASE_URL = "https://docs.saltproject.io/en/latest/"
LEFT_OUT = ("_incl/", "_templates/", "_themes/", "man/", "topics/releases/templates/")


def fetch(cache: Path = CACHE) -> Path:
    """The source release, from the package index once (pip), checked against its SHA-256."""
    return fetch_sdist("salt", RELEASE, SDIST, SHA256, cache)


def has_prose(rest: str) -> bool:
    """Whether a reST page holds text of its own: a line that is not blank, not a title or its
    adornment, and not a directive (`.. automodule::`, `.. toctree::`, a label) or its indented
    body. A page of directives only is built from elsewhere (docstrings, other pages' titles)."""
    in_directive = False
    lines = rest.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(".."):
            in_directive = True
            continue
        if in_directive and (not line.strip() or line[:1].isspace()):
            continue
        in_directive = False
        if not line.strip() or _UNDERLINE.match(line):
            continue
        if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]):
            continue    # a title
        return True
    return False


def docs(sdist: Path) -> dict[str, str]:
    """Relative path (e.g. `topics/tutorials/walkthrough.rst`) → its text, for the corpus's files."""
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 2)
            if len(parts) < 3 or parts[1] != "doc" or not member.isfile():
                continue
            rel = parts[2]
            if not rel.endswith((".rst", ".md")) or rel.startswith(LEFT_OUT):
                continue
            text = tar.extractfile(member).read().decode("utf-8")
            if rel.endswith(".md") or has_prose(text):
                out[rel] = text
    return out


def url_of(rel: str) -> str:
    """The page's address on the site (Sphinx's HTML builder: one .html a source file)."""
    return BASE_URL + rel.rsplit(".", 1)[0] + ".html"


def corpus(sdist: Path) -> dict[str, str]:
    """URL → markdown, as the crawler would deliver each page."""
    return {url_of(rel): text if rel.endswith(".md") else to_markdown(text)
            for rel, text in sorted(docs(sdist).items())}


def main() -> int:
    pages = corpus(fetch())
    sizes = sorted(len(text) for text in pages.values())
    print(f"Salt {RELEASE} docs: {len(pages)} pages, {sum(sizes):,} characters "
          f"(median {sizes[len(sizes) // 2]:,}, max {sizes[-1]:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
