"""Sitemap reading that hostile, huge or broken input can neither crash nor exhaust."""

from __future__ import annotations

import codecs
import re
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from xml.parsers import expat

from rag_pipeline.core.w3c_datetime import MAX_LASTMOD_CHARS, parse_lastmod

__all__ = [
    "MAX_URLS_PER_FILE",
    "MAX_UNCOMPRESSED_BYTES",
    "MAX_LOC_CHARS",
    "SitemapError",
    "Entry",
    "SitemapParser",
    "parse_sitemap",
]

MAX_URLS_PER_FILE = 50_000
MAX_UNCOMPRESSED_BYTES = 50 * 1024 * 1024
MAX_LOC_CHARS = 2_048

_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_BLANK = b" \t\r\n"
# Inflate and check in steps this size: a bomb is stopped within one step of the limit.
_STEP = 64 * 1024
# Text held for one field stops growing here; the slack is for whitespace around a value.
_FIELD_LIMITS = {"loc": MAX_LOC_CHARS + 1_024, "lastmod": MAX_LASTMOD_CHARS + 1_024}
# A text-sitemap line in bytes: up to 4 per character in UTF-8, plus the same slack.
_MAX_LINE_BYTES = 4 * MAX_LOC_CHARS + 1_024
_ENTRY_ELEMENT = {"urlset": "url", "sitemapindex": "sitemap"}
_UTF8_NAMES = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_HTML_START = re.compile(rb"<(?:!doctype\s+html|html)[\s>]", re.IGNORECASE)


class SitemapError(ValueError):
    """A one-line reason a document cannot be read as a sitemap, fit for a crawl report."""


@dataclass(frozen=True)
class Entry:
    """A page URL (in a urlset) or a child sitemap URL (in a sitemapindex)."""

    loc: str
    lastmod: datetime | None = None


class _Collector:
    """Applies the per-file limits, so both sitemap forms count entries the same way."""

    def __init__(self, max_urls: int) -> None:
        self.max_urls = max_urls
        self.entries: list[Entry] = []
        self.accepted = 0
        self.over_limit = 0
        self.skipped = 0

    def add(self, loc: str | None, lastmod: str | None) -> None:
        if not loc or len(loc) > MAX_LOC_CHARS:
            self.skipped += 1
        elif self.accepted >= self.max_urls:
            self.over_limit += 1
        else:
            self.accepted += 1
            self.entries.append(Entry(loc, parse_lastmod(lastmod) if lastmod else None))


def _expat_error(exc: expat.ExpatError, lead_lines: int) -> SitemapError:
    # Columns are reported 1-based, as editors show them.
    where = f"line {exc.lineno + lead_lines}, column {exc.offset + 1}"
    return SitemapError(f"not XML: {expat.ErrorString(exc.code)} at {where}")


class _XmlSink:
    """The XML form, read with expat and everything DTD-related refused outright."""

    def __init__(self, collector: _Collector, lead_lines: int) -> None:
        self.kind: str | None = None
        self._collector = collector
        self._lead_lines = lead_lines  # Blank lines dropped before the document started.
        self._head = b""  # The first bytes, to recognise an HTML page in an error.
        self._ns = ""
        self._depth = 0
        self._in_entry = False
        self._values: dict[str, str | None] = {}
        self._field: str | None = None
        self._text: list[str] = []
        self._text_len = 0
        self._overflow = False
        # The declared encoding is overridden: only UTF-8 is valid, and the bytes were checked.
        parser = expat.ParserCreate(encoding="UTF-8", namespace_separator=" ")
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.XmlDeclHandler = self._xml_decl
        parser.StartDoctypeDeclHandler = self._refuse_dtd
        parser.EntityDeclHandler = self._refuse_dtd
        parser.ExternalEntityRefHandler = self._refuse_dtd
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._chars
        self._parser = parser

    def feed(self, data: bytes, final: bool = False) -> None:
        if len(self._head) < 256:
            self._head += data[: 256 - len(self._head)]
        try:
            self._parser.Parse(data, final)
        except expat.ExpatError as exc:
            raise self._explain(_expat_error(exc, self._lead_lines)) from None
        except SitemapError as exc:
            raise self._explain(exc) from None

    def close(self) -> None:
        self.feed(b"", final=True)

    def _explain(self, error: SitemapError) -> SitemapError:
        # An HTML page (an error or login page served with 200) usually fails as XML before its
        # root is seen; naming it is more useful than the XML error it happened to hit first.
        if self.kind is None and _HTML_START.search(self._head):
            return SitemapError("not a sitemap: root element <html>")
        return error

    def _xml_decl(self, version: str, encoding: str | None, standalone: int) -> None:
        if encoding is not None and encoding.lower() not in _UTF8_NAMES:
            raise SitemapError(f"declared encoding {encoding[:40]!r}: a sitemap must be UTF-8")

    def _refuse_dtd(self, *args: Any) -> None:
        # Entity expansion (billion laughs) and external entities (XXE) both need a DTD.
        raise SitemapError("DTDs are not allowed in a sitemap")

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        ns, _, local = name.rpartition(" ")
        self._depth += 1
        if self._depth == 1:
            if local not in _ENTRY_ELEMENT:
                raise SitemapError(f"not a sitemap: root element <{local[:40]}>")
            # The root's namespace (sitemaps.org, a legacy one, or none) marks the sitemap's own
            # elements; image:loc, xhtml:link and the like are in other namespaces.
            self.kind, self._ns = local, ns
        elif ns != self._ns:
            return
        elif self._depth == 2 and local == _ENTRY_ELEMENT[self.kind or ""]:
            self._in_entry, self._values = True, {}
        elif self._depth == 3 and self._in_entry and local in _FIELD_LIMITS:
            self._field, self._text, self._text_len, self._overflow = local, [], 0, False

    def _chars(self, data: str) -> None:
        if self._field is None or self._depth != 3 or self._overflow:
            return
        if not self._text:
            data = data.lstrip()
        self._text_len += len(data)
        if self._text_len > _FIELD_LIMITS[self._field]:
            self._overflow, self._text = True, []  # Never hold a huge text node, not even once.
        elif data:
            self._text.append(data)

    def _end(self, name: str) -> None:
        depth, self._depth = self._depth, self._depth - 1
        if depth == 3 and self._field is not None:
            value = None if self._overflow else "".join(self._text).strip()
            self._values.setdefault(self._field, value)  # The first <loc> counts, not a repeat.
            self._field, self._text = None, []
        elif depth == 2 and self._in_entry:
            self._in_entry = False
            self._collector.add(self._values.get("loc"), self._values.get("lastmod"))


class _TextSink:
    """The plain-text form: one URL per line."""

    kind = "urlset"

    def __init__(self, collector: _Collector) -> None:
        self._collector = collector
        self._line = bytearray()
        self._overlong = False

    def feed(self, data: bytes) -> None:
        *complete, rest = data.split(b"\n")
        for piece in complete:
            self._append(piece)
            self._end_line()
        self._append(rest)

    def close(self) -> None:
        self._end_line()

    def _append(self, piece: bytes) -> None:
        if self._overlong:
            return
        if len(self._line) + len(piece) > _MAX_LINE_BYTES:
            self._overlong = True
            self._line.clear()
        else:
            self._line += piece

    def _end_line(self) -> None:
        if self._overlong:
            self._collector.add(None, None)
        elif text := self._line.decode("utf-8", "replace").strip():
            self._collector.add(text, None)
        self._line.clear()
        self._overlong = False


class SitemapParser:
    """Fed chunk by chunk, so a body is streamed and never held whole, gzipped or not."""

    def __init__(
        self,
        *,
        gzipped: bool | None = None,
        max_urls: int = MAX_URLS_PER_FILE,
        max_bytes: int = MAX_UNCOMPRESSED_BYTES,
    ) -> None:
        self._gzipped = gzipped  # None until the first two bytes have been seen.
        self._max_bytes = max_bytes
        self._collector = _Collector(max_urls)
        self._raw_head = b""  # Raw bytes held until the gzip magic can be checked.
        self._members = 0
        self._inflater: Any = None
        self._size = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._lead = b""  # The start of a possible UTF-8 BOM, held until it is complete.
        self._past_bom = False
        self._lead_lines = 0
        self._sink: _XmlSink | _TextSink | None = None
        self._error: SitemapError | None = None
        self._closed = False

    @property
    def kind(self) -> str | None:
        """"urlset" or "sitemapindex" once the root element has been seen."""
        return self._sink.kind if self._sink is not None else None

    @property
    def over_limit(self) -> int:
        """Entries past max_urls: counted for the report, not returned."""
        return self._collector.over_limit

    @property
    def skipped(self) -> int:
        """Entries dropped for an empty or overlong loc."""
        return self._collector.skipped

    def feed(self, data: bytes) -> list[Entry]:
        """The entries this chunk completed, so the caller can act on them while streaming."""
        self._check_open()
        try:
            self._feed_raw(data if isinstance(data, bytes) else bytes(data))
        except SitemapError as exc:
            self._error = exc
            raise
        return self._take()

    def close(self) -> list[Entry]:
        """The last entries; raises if the document turns out truncated or malformed."""
        self._check_open()
        self._closed = True
        try:
            self._finish()
        except SitemapError as exc:
            self._error = exc
            raise
        return self._take()

    def _check_open(self) -> None:
        if self._error is not None:
            raise SitemapError(f"already failed: {self._error}")
        if self._closed:
            raise SitemapError("the parser is closed")

    def _take(self) -> list[Entry]:
        entries, self._collector.entries = self._collector.entries, []
        return entries

    def _feed_raw(self, data: bytes) -> None:
        # A loop, not recursion: one chunk may hold thousands of tiny gzip members.
        while data:
            if self._inflater is None:
                if self._gzipped is False:
                    self._feed_plain(data)
                    return
                data, self._raw_head = self._raw_head + data, b""
                if len(data) < 2:
                    self._raw_head = data
                    return
                if data.startswith(_GZIP_MAGIC):
                    self._gzipped = True
                    self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                elif self._gzipped is None:
                    self._gzipped = False
                    continue
                elif self._members:
                    raise SitemapError("unexpected data after the end of the gzip stream")
                else:
                    raise SitemapError("not gzip data (it does not start with 1f 8b)")
            data = self._inflate(data)

    def _inflate(self, data: bytes) -> bytes:
        """Inflates in bounded steps and returns what follows the current gzip member."""
        inflater = self._inflater
        while True:
            try:
                out = inflater.decompress(data, _STEP)
            except zlib.error as exc:
                raise SitemapError(f"bad gzip data: {exc}") from None
            self._feed_plain(out)
            data = inflater.unconsumed_tail
            if inflater.eof:
                self._inflater = None
                self._members += 1
                return bytes(inflater.unused_data) + data
            if not data and len(out) < _STEP:
                return b""

    def _feed_plain(self, data: bytes) -> None:
        if not data:
            return
        self._size += len(data)
        if self._size > self._max_bytes:
            note = " (the protocol's limit)" if self._max_bytes == MAX_UNCOMPRESSED_BYTES else ""
            raise SitemapError(f"larger than {self._max_bytes} bytes uncompressed{note}")
        self._check_utf8(data, final=False)
        if self._sink is None:
            data = self._start(data)
            if self._sink is None:
                return
        self._sink.feed(data)

    def _check_utf8(self, data: bytes, final: bool) -> None:
        # Checked here rather than by expat, so that the reason says what is wrong.
        for start in range(0, max(len(data), 1), _STEP):
            held = len(self._utf8.getstate()[0])  # Bytes of a character split across chunks.
            try:
                self._utf8.decode(data[start : start + _STEP], final)
            except UnicodeDecodeError as exc:
                offset = self._size - len(data) + start - held + exc.start
                raise SitemapError(
                    f"not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {offset} "
                    "(a sitemap must be UTF-8)"
                ) from None

    def _start(self, data: bytes) -> bytes:
        """Drops a BOM and leading blanks, then picks the form from the first real byte."""
        if not self._past_bom:
            data, self._lead = self._lead + data, b""
            if len(data) < 3 and _UTF8_BOM.startswith(data):
                self._lead = data
                return b""
            data = data.removeprefix(_UTF8_BOM)
            self._past_bom = True
        rest = data.lstrip(_BLANK)
        # Blank lines before "<?xml" are an XML error, but a harmless and common one.
        self._lead_lines += data.count(b"\n", 0, len(data) - len(rest))
        if rest.startswith(b"<"):
            self._sink = _XmlSink(self._collector, self._lead_lines)
        elif rest:
            self._sink = _TextSink(self._collector)
        return rest

    def _finish(self) -> None:
        if self._inflater is not None:
            self._feed_raw(self._inflate(b""))  # Drains output held back by the step limit.
        if self._inflater is not None or (self._raw_head and self._gzipped):
            raise SitemapError("truncated gzip data")
        if self._raw_head:  # A one-byte document: too short to have been sniffed.
            self._gzipped = False
            self._feed_plain(self._raw_head)
        try:
            self._check_utf8(b"", final=True)
        except SitemapError:
            raise SitemapError("not UTF-8: the document ends inside a character") from None
        if self._sink is None:
            raise SitemapError("empty document")
        self._sink.close()


def parse_sitemap(data: bytes, **kw: Any) -> tuple[str, list[Entry]]:
    """For small inputs and tests, where streaming buys nothing."""
    parser = SitemapParser(**kw)
    entries = parser.feed(data) + parser.close()
    return parser.kind or "urlset", entries
