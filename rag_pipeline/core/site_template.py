"""Learning a site's template from its own pages: the chrome every page repeats, found by counting.

A block (template_blocks.py) is **template** when one of these holds, each explainable by a count:

- **by text**: its text is on at least ``min_share`` of the site's pages and on at least
  ``min_pages`` pages, or the same within one section (the URL's first path segment), so a
  section's own banner is found even when the section is a tenth of the site;
- **by shape**, for short blocks only (at most ``short_words`` words): the same, counting the
  shape (volatile tokens masked), so "Build 4f3a9c1 · 2026-12-01" on one page and "Build 9b2e771
  · 2026-12-07" on another are one block, when it carries a label ("Build", "Last updated") or
  its three most common texts are on half of its pages (chrome carries one build at a time; a
  bare date that differs on every page, a release's date under its title, is that page's
  content). A shape seen with several texts is reported ``volatile``;
- **as a sidebar**: a link list whose items are at least 80% links to the site's own URLs and
  whose items recur: the median item is on at least ``min_pages`` pages and on at least half as
  many pages as the list has items (a navigation list is carried by the pages it lists; a "see
  also" list on one page is not). Sidebars differ from section to section; what is kept is the set
  of their items, so a sidebar that gains an item is still recognised.
- **pinned**: an operator's template pin (template_pins.py); a content pin always wins.

A block that is twice on a page on a tenth of its pages or more (an admonition's label, a
directive) is the pages' structure, never template. The items of sidebars and of link lists
learned by text are kept too: a link list most of whose
items are known is template, so a navigation that gains an item is still recognised.

**Never removing content.** Short blocks, link lists and link-heavy blocks carry navigation, not
content: when template they are template on every page. A prose block (more than ``short_words``
words, less than half of them link text) is real shared text (a licence paragraph on every page of
a legal site): it stays content on its **canonical page**, the page where it is the largest share
of the text (ties: the shortest URL, then the first in order), and is template everywhere else. So
every learned block stays searchable on at least one page.

Learning is one pass over the pages with dict counting (O(total blocks)), deterministic (pages are
visited in URL order; ties break by URL). Pure: no Dagster, no I/O.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rag_pipeline.core.template_blocks import CANDIDATE_KINDS, PageBlock, cut_page, fingerprint, own_site_share
from rag_pipeline.core.template_pins import Pin, pinned_role

__all__ = ["LearnedBlock", "Template", "first_path_segment", "is_prose", "learn", "learn_from", "sections_below"]

MIN_SHARE = 0.5
MIN_PAGES = 5
SHORT_WORDS = 12
SIDEBAR_OWN_SHARE = 0.8
# Texts of one shape counted (the rest are known only to be other texts), and how many of the most
# common must be on half of its pages for the shape to be chrome.
SHAPE_TEXTS = 16
DOMINANT_TEXTS = 3
_MASKS = re.compile(r"‹[^›]*›")
_LABEL = re.compile(r"[^\W\d_]{2,}")


@dataclass(frozen=True)
class LearnedBlock:
    """One learned template block, as ``site show`` and the UI will list it: why (``by``: text,
    shape, sidebar or pin), where (``scope``: site or "section <name>"), how often (pages seen), an
    example page, and for prose the page where it stays content."""

    kind: str  # line, paragraph, list_item, link_list, volatile
    by: str
    fingerprint: str
    pages_seen: int
    example_url: str
    text: str
    scope: str = "site"
    canonical_url: str | None = None


@dataclass(frozen=True)
class Template:
    """What strip() needs: the template texts and short shapes, the known sidebar items, each
    prose block's canonical page, the learned volatile line shapes, and the pins."""

    pages: int
    blocks: tuple[LearnedBlock, ...] = ()
    texts: frozenset[str] = frozenset()
    shapes: frozenset[str] = frozenset()
    sidebar_items: frozenset[str] = frozenset()
    canonical: Mapping[str, str] = field(default_factory=dict)
    volatile_shapes: frozenset[str] = frozenset()
    pins: tuple[Pin, ...] = ()
    short_words: int = SHORT_WORDS

    @classmethod
    def empty(cls, pins: Sequence[Pin] = ()) -> Template:
        return cls(pages=0, pins=tuple(pins))


def first_path_segment(url: str) -> str:
    """A page's section: the first segment of its path ("" for the home page)."""
    return urlsplit(url).path.lstrip("/").split("/", 1)[0]


def sections_below(urls: Iterable[str]) -> Callable[[str], str]:
    """A page's section on a site whose pages all sit under a common path (docs under /en/5.2/):
    the first segment below it, so that the site's sections are its real ones, not one."""
    common: list[str] | None = None
    for url in urls:
        # Every segment counts (normalized URLs have no trailing slash): the docs' root page
        # (/en/5.2) holds the common path down to its own end.
        folders = [part for part in urlsplit(url).path.split("/") if part]
        if common is None:
            common = folders
        else:
            depth = 0
            while depth < min(len(common), len(folders)) and common[depth] == folders[depth]:
                depth += 1
            del common[depth:]
        if not common:
            break
    depth = len(common or [])

    def section_of(url: str) -> str:
        parts = [part for part in urlsplit(url).path.split("/") if part]
        return parts[depth] if len(parts) > depth else ""

    return section_of


def is_prose(block: PageBlock, short_words: int = SHORT_WORDS) -> bool:
    """Long text that is mostly not link text: content when it repeats, kept on its canonical page."""
    return block.kind != "link_list" and block.words > short_words and block.link_words * 2 < block.words


def _threshold(pages: int, min_share: float, min_pages: int) -> int:
    return max(min_pages, math.ceil(min_share * pages))


def _may_be_chrome(block: PageBlock, markdown: str) -> bool:
    """Chrome is words at the page's margin: an indented line (a literal block's code) or a line
    of no words (a closing bracket, an ellipsis) is the content's own structure."""
    if block.kind == "link_list":
        return True
    return not markdown[block.start:block.start + 1].isspace() and _LABEL.search(block.text) is not None


def _candidates(blocks: list[PageBlock], markdown: str) -> list[PageBlock]:
    found = []
    for block in blocks:
        if block.kind in CANDIDATE_KINDS and _may_be_chrome(block, markdown):
            found.append(block)
            if block.kind == "paragraph":
                found.extend(part for part in block.parts if _may_be_chrome(part, markdown))
    return found


@dataclass
class _Counts:
    """Everything one pass over the pages counts; each key once per page."""

    sections: Counter[str] = field(default_factory=Counter)
    texts: Counter[str] = field(default_factory=Counter)
    text_sections: Counter[tuple[str, str]] = field(default_factory=Counter)
    shapes: Counter[str] = field(default_factory=Counter)
    shape_sections: Counter[tuple[str, str]] = field(default_factory=Counter)
    items: Counter[str] = field(default_factory=Counter)
    first: dict[str, tuple[str, PageBlock]] = field(default_factory=dict)  # key → (url, block)
    shape_texts: dict[str, Counter[str]] = field(default_factory=dict)  # pages a text, SHAPE_TEXTS kept
    sidebars: dict[str, PageBlock] = field(default_factory=dict)
    canonical: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    pinned: Counter[str] = field(default_factory=Counter)
    repeated: Counter[str] = field(default_factory=Counter)   # pages where a text or shape is twice


def _count_page(counts: _Counts, url: str, markdown: str, section: str, is_own: Callable[[str], bool],
                pins: Sequence[Pin], short_words: int) -> None:
    blocks = cut_page(markdown, url)
    page_words = sum(block.words for block in blocks) or 1
    # Chrome is once a page; a line a page repeats (a "Note" label, a directive) is its structure.
    top = [block for block in blocks if block.kind in CANDIDATE_KINDS]
    by_text = Counter(block.fingerprint for block in top)
    by_shape = Counter(block.shape for block in top if block.kind != "link_list" and block.words <= short_words)
    counts.repeated.update({key for found in (by_text, by_shape) for key, seen in found.items() if seen > 1})
    texts: set[str] = set()
    shapes: set[str] = set()
    items: set[str] = set()
    for block in _candidates(blocks, markdown):
        role = pinned_role(pins, block.text) if pins else None
        if role == "content":
            continue
        if role == "template":
            counts.pinned[block.fingerprint] += 1
            counts.first.setdefault(block.fingerprint, (url, block))
            continue
        texts.add(block.fingerprint)
        counts.first.setdefault(block.fingerprint, (url, block))
        if block.kind != "link_list" and block.words <= short_words:
            shapes.add(block.shape)
            counts.first.setdefault(block.shape, (url, block))
            seen = counts.shape_texts.setdefault(block.shape, Counter())
            if block.fingerprint in seen or len(seen) < SHAPE_TEXTS:
                seen[block.fingerprint] += 1
        if block.kind == "link_list" and own_site_share(block, is_own) >= SIDEBAR_OWN_SHARE:
            counts.sidebars.setdefault(block.fingerprint, block)
            items.update(part.fingerprint for part in block.parts)
        if is_prose(block, short_words):
            rank = (-block.words / page_words, len(url), url)
            best = counts.canonical.get(block.fingerprint)
            if best is None or rank < best:
                counts.canonical[block.fingerprint] = rank
    counts.sections[section] += 1
    counts.texts.update(texts)
    counts.text_sections.update((section, key) for key in texts)
    counts.shapes.update(shapes)
    counts.shape_sections.update((section, key) for key in shapes)
    counts.items.update(items)


def _frequent(site: Counter[str], by_section: Counter[tuple[str, str]], counts: _Counts,
              min_share: float, min_pages: int) -> dict[str, str]:
    """Keys on enough of the site's pages, or of one section's: key → scope."""
    site_threshold = _threshold(sum(counts.sections.values()), min_share, min_pages)
    found = {key: "site" for key, seen in site.items() if seen >= site_threshold}
    for (section, key), seen in sorted(by_section.items()):
        if key not in found and seen >= _threshold(counts.sections[section], min_share, min_pages):
            found[key] = f"section {section or '/'}"
    return found


def _once_a_page(counts: _Counts, key: str) -> bool:
    """Chrome is once on a page: a block that is twice on a tenth of its pages is their structure."""
    seen = counts.texts.get(key) or counts.shapes.get(key) or 1
    return counts.repeated[key] * 10 < seen


def _chrome_shape(counts: _Counts, shape: str) -> bool:
    """A shape is chrome when its masked text carries a label ("Last updated ‹date›", "Build ‹hex›
    · ‹date›"), or when a few of its texts are on most of its pages (one build at a time). A bare
    date or number whose every page has its own (a release's date under its title) is each page's
    own content."""
    _, block = counts.first[shape]
    if _LABEL.search(_MASKS.sub(" ", block.masked)):
        return True
    top = sum(seen for _, seen in counts.shape_texts[shape].most_common(DOMINANT_TEXTS))
    return top * 2 >= counts.shapes[shape]


def _is_sidebar(block: PageBlock, items: Counter[str], min_pages: int) -> bool:
    median = statistics.median(items[part.fingerprint] for part in block.parts)
    return median >= max(min_pages, math.ceil(len(block.parts) / 2))


def learn(
    pages: Mapping[str, str],
    site_urls: Callable[[str], bool] | Collection[str],
    *,
    min_share: float = MIN_SHARE,
    min_pages: int = MIN_PAGES,
    short_words: int = SHORT_WORDS,
    pins: Sequence[Pin] = (),
    section_of: Callable[[str], str] = first_path_segment,
) -> Template:
    """The site's template, learned from its pages (URL → normalized markdown).

    ``site_urls`` says which links are the site's own: a predicate, or a collection of URLs."""
    return learn_from(((url, pages[url]) for url in sorted(pages)), site_urls, min_share=min_share,
                      min_pages=min_pages, short_words=short_words, pins=pins, section_of=section_of)


def learn_from(
    pages: Iterable[tuple[str, str]],
    site_urls: Callable[[str], bool] | Collection[str],
    *,
    min_share: float = MIN_SHARE,
    min_pages: int = MIN_PAGES,
    short_words: int = SHORT_WORDS,
    pins: Sequence[Pin] = (),
    section_of: Callable[[str], str] = first_path_segment,
) -> Template:
    """``learn`` over (URL, markdown) pairs read one at a time, in URL order (the same template as
    ``learn`` of the same pages): a site's stored sources are streamed from the database, never
    held all at once (100,000 pages of ~20 KB are ~2 GB of text). Each URL once."""
    if not 0 < min_share <= 1:
        raise ValueError(f"min_share must be in (0, 1], got {min_share}")
    if min_pages < 2:
        raise ValueError(f"min_pages must be at least 2 (a block on one page is that page's), got {min_pages}")
    if callable(site_urls):
        is_own = site_urls
    else:
        own = frozenset(site_urls)
        is_own = own.__contains__
    counts = _Counts()
    seen = 0
    for url, markdown in pages:
        _count_page(counts, url, markdown, section_of(url), is_own, pins, short_words)
        seen += 1

    by_text = {key: scope for key, scope in _frequent(counts.texts, counts.text_sections, counts, min_share,
                                                      min_pages).items() if _once_a_page(counts, key)}
    by_shape = {key: scope for key, scope in _frequent(counts.shapes, counts.shape_sections, counts, min_share,
                                                       min_pages).items()
                if _chrome_shape(counts, key) and _once_a_page(counts, key)}
    # A nav list learned by text is a sidebar too: its items are what recognises it once it grows.
    sidebars = {key: block for key, block in counts.sidebars.items() if _is_sidebar(block, counts.items, min_pages)}

    learned: list[LearnedBlock] = []
    canonical: dict[str, str] = {}
    for key, scope in by_text.items():
        url, block = counts.first[key]
        if block.words <= short_words and block.shape in by_shape and block.kind != "link_list":
            continue  # reported once, by its shape
        home = counts.canonical[key][2] if key in counts.canonical else None
        if home is not None:
            canonical[key] = home
        learned.append(LearnedBlock(block.kind, "text", key, counts.texts[key], url, block.text, scope, home))
    volatile: set[str] = set()
    for key, scope in by_shape.items():
        url, block = counts.first[key]
        varies = len(counts.shape_texts[key]) > 1
        if varies:
            volatile.add(key)
        learned.append(LearnedBlock("volatile" if varies else block.kind, "shape", key, counts.shapes[key], url,
                                    block.masked if varies else block.text, scope))
    learned.extend(_sidebar_blocks({k: b for k, b in sidebars.items() if k not in by_text}, counts))
    for key, seen in counts.pinned.items():
        url, block = counts.first[key]
        learned.append(LearnedBlock(block.kind, "pin", key, seen, url, block.text))
    learned.sort(key=lambda b: (-b.pages_seen, b.by, b.kind, b.fingerprint))
    # A navigation list learned by its text (its links may lead off the site): its items recognise
    # it once it gains one, as a sidebar's do.
    navigation = [counts.first[key][1] for key in by_text if counts.first[key][1].kind == "link_list"]
    return Template(
        pages=seen,
        blocks=tuple(learned),
        texts=frozenset(by_text),
        shapes=frozenset(by_shape),
        sidebar_items=frozenset(part.fingerprint for block in (*sidebars.values(), *navigation) for part in block.parts),
        canonical=canonical,
        volatile_shapes=frozenset(volatile),
        pins=tuple(pins),
        short_words=short_words,
    )


def _sidebar_blocks(sidebars: Mapping[str, PageBlock], counts: _Counts) -> list[LearnedBlock]:
    """One learned block per section for its sidebars (their texts differ page by page when the
    current page is marked), counting the pages that carry one."""
    pages: Counter[str] = Counter()
    example: dict[str, tuple[str, PageBlock]] = {}
    for (section, key), seen in counts.text_sections.items():
        if key in sidebars:
            pages[section] += seen
            url, block = counts.first[key]
            if section not in example or url < example[section][0]:
                example[section] = (url, block)
    learned = []
    for section in sorted(pages):
        url, block = example[section]
        learned.append(LearnedBlock("link_list", "sidebar", fingerprint(f"sidebar\n{section}"), pages[section],
                                    url, block.text, f"section {section or '/'}"))
    return learned
