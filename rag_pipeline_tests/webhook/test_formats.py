"""Every format the crawler sends is stored so that the delivery sensor reads the same page."""

from __future__ import annotations

import gzip
import json

import pytest

from rag_pipeline.core.bodies import decode_stored
from rag_pipeline_tests.webhook.conftest import PAGE, TOKEN, rows

MARKDOWN = "# Café\n\nPrices in €, naïve text.\n"
HTML = "<html><body><h1>Hello</h1><p>World</p></body></html>"


def send(client, body: bytes, **hdrs):
    return client.post("/webhook", params={"token": TOKEN}, headers=hdrs, content=body)


def stored(conn, rid: str):
    return conn.execute(
        "SELECT url, pushed_url, crawler_status, original_status, content_type, body, body_encoding"
        " FROM deliveries WHERE rid = %s", (rid,)
    ).fetchone()


def page_text(row) -> str:
    return decode_stored(bytes(row[5]), row[6], 10_000_000).text


@pytest.mark.parametrize(
    ("status_headers", "crawler", "original"),
    [
        ({"CB-Status": "200", "Original-Status": "200"}, 200, 200),
        ({"cb_status": "200", "original_status": "404"}, 200, 404),
        ({"PC-Status": "503", "Original-Status": "200"}, 503, 200),
        ({"pc_status": "200", "original_status": "410"}, 200, 410),
        # The CB spelling wins over PC, whichever is listed first.
        ({"PC-Status": "520", "CB-Status": "200", "Original-Status": "200"}, 200, 200),
        ({"pc_status": "520", "cb_status": "200", "original_status": "301"}, 200, 301),
        # Repeated or comma-joined by a proxy.
        ({"CB-Status": "200, 200", "Original-Status": "200,200"}, 200, 200),
        ({"CB-Status": "200", "Original-Status": " 404 , 404 "}, 200, 404),
        # No crawler status at all: stored (the sensor skips it), never guessed.
        ({"Original-Status": "200"}, None, 200),
    ],
)
def test_status_header_spellings(client, conn, status_headers, crawler, original):
    resp = send(client, gzip.compress(PAGE), rid="r", url="https://example.com/p",
                **{"Content-Encoding": "gzip"}, **status_headers)
    assert resp.status_code == 200, resp.text
    row = stored(conn, "r")
    assert (row[2], row[3]) == (crawler, original)


def test_repeated_header_lines_count_once(client, conn):
    raw_headers = [("rid", "rep"), ("rid", "rep"), ("url", "https://example.com/r"),
                   ("CB-Status", "200"), ("CB-Status", "200"), ("Original-Status", "200")]
    resp = client.post("/webhook", params={"token": TOKEN}, headers=raw_headers, content=PAGE)
    assert resp.status_code == 200, resp.text
    assert stored(conn, "rep")[2:4] == (200, 200)


def test_gzip_body_without_content_encoding_is_recognised(client, conn):
    resp = send(client, gzip.compress(MARKDOWN.encode()), rid="g", url="https://example.com/g",
                **{"CB-Status": "200", "Original-Status": "200"})
    assert resp.status_code == 200, resp.text
    row = stored(conn, "g")
    assert row[6] == "gzip"
    assert page_text(row) == MARKDOWN


def test_markdown_identity_body(client, conn):
    resp = send(client, MARKDOWN.encode(), rid="md", url="https://example.com/md",
                **{"Content-Type": "text/markdown; charset=utf-8", "CB-Status": "200", "Original-Status": "200"})
    assert resp.status_code == 200, resp.text
    row = stored(conn, "md")
    assert row[4] == "text/markdown; charset=utf-8" and row[6] == "identity"
    assert page_text(row) == MARKDOWN


def test_html_as_text_plain_gzip(client, conn):
    resp = send(client, gzip.compress(HTML.encode()), rid="html", url="https://example.com/h",
                **{"Content-Type": "text/plain", "Content-Encoding": "gzip", "CB-Status": "200",
                   "Original-Status": "200"})
    assert resp.status_code == 200, resp.text
    row = stored(conn, "html")
    assert row[4] == "text/plain"
    assert page_text(row) == HTML


def json_body(**fields) -> bytes:
    # mtime=0: a gzip header carries the time, and a parameter's bytes are its test id, which
    # pytest-xdist's workers must collect alike
    return gzip.compress(json.dumps(fields).encode(), mtime=0)


def test_json_format(client, conn):
    body = json_body(pc_status=200, original_status=200, rid="js", url="https://example.com/js", body=MARKDOWN)
    resp = send(client, body, **{"Content-Type": "gzip/json"})
    assert resp.status_code == 200, resp.text
    row = stored(conn, "js")
    assert row[0] == "https://example.com/js" and row[2:5] == (200, 200, "gzip/json")
    # The extracted page is what the sensor reads, not the JSON envelope.
    assert page_text(row) == MARKDOWN


def test_json_lone_surrogates_are_stored_as_the_replacement_character(client, conn):
    # "\ud800" is a legal JSON escape with no UTF-8 form: stored as U+FFFD, never as a plain "?".
    body = json_body(pc_status=200, original_status=200, rid="sur", url="https://example.com/s",
                     body="# Caf\ud800\n\nWhat? A lone \udfff surrogate.\n")
    assert send(client, body, **{"Content-Type": "gzip/json"}).status_code == 200
    assert page_text(stored(conn, "sur")) == "# Caf\ufffd\n\nWhat? A lone \ufffd surrogate.\n"


def test_json_format_with_string_statuses_and_header_fallbacks(client, conn):
    body = json_body(pc_status="200", original_status="404", body="")
    resp = send(client, body, rid="js2", url="https://example.com/gone",
                **{"Content-Type": "gzip/json; charset=utf-8"})
    assert resp.status_code == 200, resp.text
    row = stored(conn, "js2")
    assert row[0] == "https://example.com/gone" and row[2:4] == (200, 404)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (gzip.compress(b"{not json", mtime=0), "bad_json"),
        (gzip.compress(b"[1, 2]", mtime=0), "bad_json"),
        (json_body(pc_status=200, original_status=200, url="https://example.com/x", body="x"), "missing_rid"),
        (json_body(pc_status=200, original_status=200, rid="j", body="x"), "missing_url"),
        (json_body(pc_status="2x", original_status=200, rid="j", url="https://example.com/x", body="x"),
         "bad_status"),
        (json_body(pc_status=200, original_status=200, rid="j", url="https://example.com/x", body=""),
         "empty_body"),
        (json_body(pc_status=200, original_status=200, rid="j", url="https://example.com/x", body=5),
         "bad_json"),
    ],
)
def test_bad_json_deliveries_are_400(client, conn, body, reason):
    resp = send(client, body, **{"Content-Type": "gzip/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["reason"] == reason
    assert rows(conn) == []


def test_pushed_url_is_stored_beside_the_delivered_url(client, conn):
    resp = send(client, PAGE, rid="redir", url="https://example.com/final",
                **{"Pushed-Url": "https://example.com/old", "CB-Status": "200", "Original-Status": "301"})
    assert resp.status_code == 200, resp.text
    assert stored(conn, "redir")[:2] == ("https://example.com/final", "https://example.com/old")


def test_an_unusable_pushed_url_is_dropped_not_refused(client, conn):
    resp = send(client, PAGE, rid="p2", url="https://example.com/x",
                **{"pushed_url": "javascript:alert(1)", "CB-Status": "200", "Original-Status": "200"})
    assert resp.status_code == 200
    assert stored(conn, "p2")[1] is None


@pytest.mark.parametrize(
    "probe",
    [
        {"headers": {"User-Agent": "Crawlbase Monitoring Bot 1.0"}, "body": b""},
        {"headers": {"User-Agent": "Crawlbase Monitoring Bot 1.0", "rid": "dummyrequest",
                     "Content-Type": "gzip/json"}, "body": b"\x1f\x8b not even gzip"},
        {"headers": {"rid": "dummyrequest", "url": "https://example.com/"}, "body": b'{"rid": "dummyrequest"}'},
        {"headers": {"Content-Type": "gzip/json"},
         "body": json_body(rid="dummyrequest", url="https://example.com/", pc_status=200, body="")},
    ],
)
def test_monitoring_probe_answers_200_and_stores_nothing(client, conn, probe):
    resp = send(client, probe["body"], **probe["headers"])
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "ignored"
    assert rows(conn) == []


def test_probe_still_needs_the_token(client, conn):
    resp = client.post("/webhook", headers={"User-Agent": "Crawlbase Monitoring Bot 1.0"}, content=b"")
    assert resp.status_code == 401


def test_invalid_utf8_is_stored_and_counted(client, conn):
    body = b"# Caf\xe9\n\nLatin-1 bytes in a UTF-8 page.\n"
    resp = send(client, gzip.compress(body), rid="latin", url="https://example.com/l",
                **{"CB-Status": "200", "Original-Status": "200"})
    assert resp.status_code == 200
    decoded = decode_stored(bytes(stored(conn, "latin")[5]), "gzip", 1_000_000)
    assert decoded.replaced_invalid_utf8 and "Caf\ufffd" in decoded.text
    assert "webhook_invalid_utf8_total 1.0" in client.get("/metrics", headers={"X-Webhook-Token": TOKEN}).text
