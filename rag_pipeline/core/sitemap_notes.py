"""When a sitemap fails to parse, whether the content type it was served with helps to say why.

"(served as text/html)" explains "not a sitemap: root element <html>", and "(served as
application/gzip)" explains "not gzip data"; it explains nothing of "DTDs are not allowed" or a
malformed tag in a file served as XML, and there it only misleads. Pure: text in, text out."""

from __future__ import annotations

# Errors about what the file is, rather than about what it says.
_WHAT_IT_IS = ("not XML", "not a sitemap", "not UTF-8", "empty document", "declared encoding")
_GZIP = ("not gzip data", "bad gzip data", "truncated gzip data", "unexpected data after the end of the gzip")


def is_xml(media_type: str) -> bool:
    return media_type in ("application/xml", "text/xml") or media_type.endswith("+xml")


def served_note(error: str, content_type: str) -> str:
    """` (served as TYPE)` where TYPE explains `error`, else ""."""
    media = content_type.split(";")[0].strip().lower()
    if not media:
        return ""
    if error.startswith(_GZIP):
        explains = True          # what it was served as says whether it claimed to be gzip
    elif error.startswith(_WHAT_IT_IS):
        explains = not is_xml(media) and media != "text/plain"
    else:
        explains = False
    return f" (served as {media})" if explains else ""
