"""URL normalization and the stable IDs derived from it.

A page must get one identity whatever variant it was linked as, so every ID in the
index is computed from the normalized URL, never from the URL as delivered.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote, unquote, urlsplit

__all__ = ["InvalidURL", "normalize_url", "page_id", "chunk_id"]

_PERCENT_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}")
_UNSAFE = re.compile(r"[\x00-\x20\x7f]|\s")
_DEFAULT_PORTS = frozenset({80, 443})
_ALLOWED_SCHEMES = frozenset({"http", "https"})


class InvalidURL(ValueError):
    """Raised for input that cannot name a crawlable page."""


def _upper_escapes(part: str) -> str:
    # %2f and %2F are the same octet; one spelling keeps IDs stable. Whitespace and control
    # characters are escaped too: left raw, a trailing one would be stripped by the next
    # normalization, and the result would not be a fixed point.
    part = _UNSAFE.sub(lambda m: quote(m.group(0), safe=""), part)
    return _PERCENT_ESCAPE.sub(lambda m: m.group(0).upper(), part)


def _normalize_host(hostname: str) -> str:
    host = hostname.lower()
    # Loop so the result is a fixed point ("www.www.x.com" would otherwise change twice),
    # and keep "www." when nothing with a dot would remain ("www.com" is its own site).
    while host.startswith("www.") and "." in host[4:]:
        host = host[4:]
    if ":" in host:  # IPv6 literal: urlsplit removed the brackets.
        host = f"[{host}]"
    return host


def _normalize_query(query: str) -> str:
    # Work on the raw "key=value" strings rather than decoding and re-encoding them,
    # so that an escaped "&" or "=" inside a value keeps its meaning.
    params: list[tuple[str, str]] = []
    for piece in query.split("&"):
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        if unquote(key).lower().startswith("utm_"):
            continue
        params.append((_upper_escapes(key), sep + _upper_escapes(value)))
    params.sort()
    return "&".join(key + value for key, value in params)


def normalize_url(url: str) -> str:
    """One spelling per page, so that links to the same page share one ID."""
    raw = url.strip()
    try:
        parts = urlsplit(raw)
        port = parts.port  # Raises ValueError for a non-numeric or out-of-range port.
    except ValueError as exc:
        raise InvalidURL(f"cannot parse URL {raw!r}: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in _ALLOWED_SCHEMES:
        raise InvalidURL(f"only http and https URLs can be indexed, got {raw!r}")
    if "@" in parts.netloc:
        # Credentials would end up in page IDs, logs and citations.
        raise InvalidURL(f"URLs with user information are refused: {raw!r}")
    hostname = parts.hostname
    if not hostname:
        raise InvalidURL(f"URL has no host: {raw!r}")
    if any(ch.isspace() for ch in hostname):
        raise InvalidURL(f"URL host contains whitespace: {raw!r}")

    netloc = _normalize_host(hostname)
    if port is not None and port not in _DEFAULT_PORTS:
        netloc = f"{netloc}:{port}"
    path = _upper_escapes(parts.path).rstrip("/")
    query = _normalize_query(parts.query)
    return f"https://{netloc}{path}" + (f"?{query}" if query else "")


def page_id(normalized_url: str) -> uuid.UUID:
    """Deterministic, so any process can find a page without a lookup table."""
    return uuid.uuid5(uuid.NAMESPACE_URL, normalized_url)


def chunk_id(normalized_url: str, index: int) -> uuid.UUID:
    """Position-based, so a re-chunk overwrites rows in place and a shorter page loses its tail."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{normalized_url}#{index}")
