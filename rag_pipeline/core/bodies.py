"""Delivery bodies: what the receiver accepts and how the stored bytes become text.

Pure functions shared by the receiver (validate before answering 200) and the sensor
(decode the stored bytes), so both agree on what a body is.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

GZIP_MAGIC = b"\x1f\x8b"


class BodyError(ValueError):
    """The body cannot be a page: `reason` is safe to show the client."""

    def __init__(self, reason: str, *, too_large: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large


@dataclass(frozen=True)
class DecodedBody:
    text: str
    replaced_invalid_utf8: bool


def is_gzip(raw: bytes, content_encoding: str | None = None) -> bool:
    if content_encoding and "gzip" in content_encoding.lower():
        return True
    return raw[:2] == GZIP_MAGIC


def gunzip_capped(raw: bytes, max_bytes: int) -> bytes:
    """Decompress a gzip member, refusing corrupt data and output past `max_bytes` (gzip bombs)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise BodyError(f"body is not valid gzip: {exc}") from exc
    if len(out) > max_bytes or decompressor.unconsumed_tail:
        raise BodyError(f"decompressed body exceeds {max_bytes} bytes", too_large=True)
    if not decompressor.eof:
        raise BodyError("body is truncated gzip")
    return out


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def decode_text(data: bytes) -> DecodedBody:
    """UTF-8, with invalid bytes replaced (U+FFFD) and the fact recorded, never refused:
    a site that serves one bad byte still has a page worth indexing."""
    try:
        return DecodedBody(data.decode("utf-8"), False)
    except UnicodeDecodeError:
        return DecodedBody(data.decode("utf-8", errors="replace"), True)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode_text(text: str) -> bytes:
    """UTF-8 of a str that may hold lone surrogates (legal JSON escapes with no UTF-8 form):
    each becomes U+FFFD, as an invalid byte does in `decode_text`, not a "?" that reads as text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def decode_stored(body: bytes, encoding: str, max_bytes: int) -> DecodedBody:
    raw = gunzip_capped(body, max_bytes) if encoding == "gzip" else body
    return decode_text(raw)
