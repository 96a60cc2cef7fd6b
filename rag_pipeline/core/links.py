"""The links of a page's stored markdown, as absolute URLs: what link discovery follows on a site
that publishes no sitemap. Pure: no I/O."""

from __future__ import annotations

import re
from urllib.parse import urldefrag, urljoin, urlsplit

__all__ = ["links_in", "MAX_LINKS_PER_PAGE"]

# A page links to at most this many URLs that count: a page of 100,000 links is a sitemap in
# disguise or a trap, and one page must not fill a site's cap.
MAX_LINKS_PER_PAGE = 1_000
# [text](target "title") and <https://autolink>; images ![…](…) are not pages.
_INLINE = re.compile(r"(?<!!)\[[^\]\n]{0,500}\]\(\s*<?([^)\s>]{1,2048})>?(?:\s+\"[^\"\n]{0,300}\")?\s*\)")
_AUTOLINK = re.compile(r"<(https?://[^>\s]{1,2048})>")
_SKIP_SCHEMES = ("mailto:", "javascript:", "tel:", "data:", "ftp:")


def links_in(markdown: str, base_url: str) -> list[str]:
    """Absolute http(s) URLs the page links to, fragments dropped, in order, once each."""
    found: dict[str, None] = {}
    for match in (*_INLINE.finditer(markdown), *_AUTOLINK.finditer(markdown)):
        target = match.group(1).strip()
        if not target or target.startswith("#") or target.lower().startswith(_SKIP_SCHEMES):
            continue
        try:
            url = urldefrag(urljoin(base_url, target)).url
            scheme = urlsplit(url).scheme
        except ValueError:     # an unparseable target (a bad IPv6 literal, a bad port)
            continue
        if scheme in ("http", "https"):
            found[url] = None
            if len(found) >= MAX_LINKS_PER_PAGE:
                break
    return list(found)
