"""Bad input gets a clear 4xx, is counted and logged, and changes nothing; the token never leaks."""

from __future__ import annotations

import gzip
import logging

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from rag_pipeline_tests.servers import serve
from rag_pipeline_tests.webhook.conftest import PAGE, TOKEN, headers, make_app, post, rows
from webhook_sensor.observability import MaskToken, mask_token


@pytest.mark.parametrize(
    ("change", "status", "reason"),
    [
        ({"rid": None}, 400, "missing_rid"),
        ({"rid": "  "}, 400, "missing_rid"),
        ({"rid": "x" * 257}, 400, "bad_rid"),
        ({"rid": "has space"}, 400, "bad_rid"),
        ({"url": None}, 400, "missing_url"),
        ({"url": "ftp://example.com/x"}, 400, "bad_url"),
        ({"url": "example.com/x"}, 400, "bad_url"),
        ({"url": "http://[::1"}, 400, "bad_url"),
        ({"url": "http://example.com:99999999/"}, 400, "bad_url"),
        ({"url": "https://example.com/" + "a" * 2100}, 400, "bad_url"),
        ({"Original-Status": "abc"}, 400, "bad_status"),
        ({"CB-Status": "200x"}, 400, "bad_status"),
        ({"pc_status": "-1", "CB-Status": None}, 400, "bad_status"),
        ({"Original-Status": "200, 2000"}, 400, "bad_status"),
    ],
)
def test_bad_headers_are_refused_with_a_reason(client, conn, change, status, reason):
    resp = post(client, **change)
    assert resp.status_code == status, resp.text
    assert resp.json()["reason"] == reason and resp.json()["error"]
    assert rows(conn) == []


# mtime=0: a gzip header carries the time, and a parameter's bytes are its test id, which
# pytest-xdist's workers must collect alike.
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x1f\x8b\x08\x00garbage-not-deflate", "bad_gzip"),
        (gzip.compress(PAGE, mtime=0)[:-12], "bad_gzip"),  # truncated
        (gzip.compress(PAGE, mtime=0)[:-8] + b"\0\0\0\0" + gzip.compress(PAGE, mtime=0)[-4:], "bad_gzip"),  # wrong CRC-32
        (gzip.compress(PAGE, mtime=0)[:-4] + b"\xff\0\0\0", "bad_gzip"),  # wrong length trailer
        (gzip.compress(PAGE, mtime=0)[:3] + b"\x20" + gzip.compress(PAGE, mtime=0)[4:], "bad_gzip"),  # reserved flag bit
        (gzip.compress(b"   \n", mtime=0), "empty_body"),
        (b"", "empty_body"),
    ],
)
def test_bad_bodies_are_400(client, conn, body, reason):
    resp = post(client, body=body)
    assert resp.status_code == 400
    assert resp.json()["reason"] == reason
    assert rows(conn) == []


def test_empty_body_is_fine_for_a_404(client, conn):
    resp = post(client, body=b"", **{"Original-Status": "404", "Content-Encoding": None})
    assert resp.status_code == 200
    assert rows(conn) == [("rid-1", "https://example.com/a", 200, 404, "identity")]


def test_gzip_bomb_is_413(client, conn):
    bomb = gzip.compress(b"\0" * 5_000_000)  # 5 MB out of ~5 KB, over the 1 MB cap of this app
    assert len(bomb) < 10_000
    resp = post(client, body=bomb)
    assert resp.status_code == 413
    assert resp.json()["reason"] == "page_too_large"
    assert rows(conn) == []


def test_declared_oversized_body_is_413_before_it_is_read(database_url, conn):
    app = make_app(database_url, WEBHOOK_MAX_BODY_BYTES=10_000)
    with serve(app) as base, httpx.Client() as http:
        resp = http.post(f"{base}/webhook", params={"token": TOKEN}, headers=headers(), content=b"x" * 10_001)
        assert resp.status_code == 413 and resp.json()["reason"] == "body_too_large"
        assert rows(conn) == []


def test_streamed_oversized_body_is_413(database_url, conn):
    app = make_app(database_url, WEBHOOK_MAX_BODY_BYTES=10_000)

    def chunks():  # no Content-Length: chunked transfer, cut off while streaming
        for _ in range(50):
            yield b"y" * 1000

    with serve(app) as base, httpx.Client() as http:
        resp = http.post(f"{base}/webhook", params={"token": TOKEN}, headers=headers(), content=chunks())
        assert resp.status_code == 413 and resp.json()["reason"] == "body_too_large"
    assert rows(conn) == []


def test_bad_token_never_reads_the_body(database_url, conn):
    app = make_app(database_url)
    read = []

    async def receive_spy(scope, receive, send):
        async def spying_receive():
            message = await receive()
            read.append(message)
            return message
        await app(scope, spying_receive, send)

    with TestClient(receive_spy) as c:
        resp = c.post("/webhook", params={"token": "wrong"}, headers=headers(), content=gzip.compress(PAGE))
    assert resp.status_code == 401
    assert not any(m["type"] == "http.request" and m.get("body") for m in read)
    assert rows(conn) == []


def test_refusals_are_counted_by_reason_and_logged(client, conn, log_lines):
    post(client, token="wrong")
    post(client, token="wrong")
    post(client, rid=None)
    post(client, body=b"\x1f\x8bjunk")
    assert post(client).status_code == 200
    assert post(client).json()["status"] == "duplicate"
    assert client.get("/metrics").status_code == 401       # behind the webhook token
    text = client.get("/metrics", headers={"X-Webhook-Token": TOKEN}).text
    assert 'webhook_refusals_total{reason="bad_token"} 2.0' in text
    assert 'webhook_refusals_total{reason="missing_rid"} 1.0' in text
    assert 'webhook_refusals_total{reason="bad_gzip"} 1.0' in text
    assert 'webhook_deliveries_total{outcome="stored"} 1.0' in text
    assert 'webhook_deliveries_total{outcome="duplicate"} 1.0' in text
    assert "webhook_request_duration_seconds_count 6.0" in text
    refusals = [line for line in log_lines.parsed() if line["status"] >= 400 and line["path"] == "/webhook"]
    assert [r["reason"] for r in refusals] == ["bad_token", "bad_token", "missing_rid", "bad_gzip"]
    assert all(r["level"] == "warning" and r["path"] == "/webhook" for r in refusals)
    stored = [line for line in log_lines.parsed() if line.get("outcome") == "stored"]
    assert stored and stored[0]["rid"] == "rid-1" and stored[0]["ms"] >= 0


def test_the_token_is_never_logged(client, log_lines, caplog):
    caplog.set_level(logging.DEBUG)
    post(client)
    post(client, token=TOKEN + "x")
    post(client, rid=None)
    # Everything the server side logs (the test's own HTTP client logs its URLs, token included).
    server_side = [r.getMessage() for r in caplog.records if r.name.startswith(("webhook_sensor", "uvicorn"))]
    everything = "\n".join(log_lines.lines + server_side)
    assert log_lines.lines
    assert TOKEN not in everything


def test_uvicorn_access_lines_are_masked():
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "POST", f"/webhook?a=1&token={TOKEN}&b=2", "1.1", 200), None)
    MaskToken().filter(record)
    line = record.getMessage()
    assert TOKEN not in line and "token=***" in line and "a=1" in line and "b=2" in line
    assert mask_token(f"/webhook?token={TOKEN}") == "/webhook?token=***"


def test_refuses_to_start_without_a_token_unless_allowed(database_url, conn):
    with pytest.raises(RuntimeError, match="WEBHOOK_TOKEN"):
        make_app(database_url, WEBHOOK_TOKEN=None)
    with pytest.raises(RuntimeError, match="WEBHOOK_TOKEN"):
        make_app(database_url, WEBHOOK_TOKEN="")
    with TestClient(make_app(database_url, WEBHOOK_TOKEN=None, WEBHOOK_ALLOW_NO_TOKEN=True)) as c:
        assert post(c, token=None).status_code == 200
    assert len(rows(conn)) == 1


def test_cli_refuses_to_start_without_a_token(monkeypatch):
    from click.testing import CliRunner

    from rag_pipeline.cli import main as cli

    result = CliRunner().invoke(cli, ["webhook", "--port", "1"])
    assert result.exit_code != 0 and "WEBHOOK_TOKEN" in result.output


def test_database_gone_is_503_never_500(database_url, pg_server_url, conn, log_lines, caplog):
    with TestClient(make_app(database_url)) as c:
        assert c.get("/healthz").status_code == 200
        conn.close()
        name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
        with psycopg.connect(pg_server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        health = c.get("/healthz")
        # Up or down, nothing more: the database's error text names its host, port and user.
        assert health.status_code == 503 and health.json() == {"status": "unhealthy"}
        assert any(r.getMessage().startswith("healthz: unhealthy:") for r in caplog.records)
        resp = post(c)
        assert resp.status_code == 503 and resp.json()["reason"] == "database_unavailable"
        assert 'webhook_refusals_total{reason="database_unavailable"} 1.0' in c.get(
            "/metrics", params={"token": TOKEN}).text


def test_isal_inflate_agrees_with_zlib_on_what_it_accepts():
    """The receiver inflates with ISA-L for speed; what it accepts must be exactly what zlib accepts."""
    import random
    import zlib

    from webhook_sensor.intake import Refused, decompress

    def by_zlib(raw: bytes, cap: int) -> bytes | None:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(raw, cap + 1)
        except zlib.error:
            return None
        return out if len(out) <= cap and not inflater.unconsumed_tail and inflater.eof else None

    rng = random.Random(3)
    for _ in range(3000):
        body = bytearray(gzip.compress(rng.randbytes(rng.randint(0, 200)) + PAGE * rng.randint(1, 200)))
        for _ in range(rng.randint(0, 2)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.2:
            body = body[:rng.randrange(len(body) + 1)]
        for cap in (100, 20_000):
            try:
                mine = decompress(bytes(body), cap)
            except Refused as exc:
                assert exc.status in (400, 413)
                mine = None
            assert mine == by_zlib(bytes(body), cap)


def test_answers_are_json_like_fastapi_and_the_schema_still_lists_the_route(client, conn):
    stored = post(client, rid="rid-\"q\\")
    assert stored.status_code == 200 and stored.headers["content-type"] == "application/json"
    assert stored.json() == {"status": "stored", "rid": "rid-\"q\\"}
    assert post(client, rid="rid-\"q\\").json() == {"status": "duplicate", "rid": "rid-\"q\\"}
    probe = post(client, **{"User-Agent": "Crawlbase Monitoring Bot 1.0"})
    assert probe.json() == {"status": "ignored", "reason": "monitoring probe"}
    assert int(stored.headers["content-length"]) == len(stored.content)
    assert "post" in client.app.openapi()["paths"]["/webhook"]
    # The interactive docs and the schema's URL are off unless WEBHOOK_PUBLIC_DOCS.
    assert [client.get(path).status_code for path in ("/docs", "/redoc", "/openapi.json")] == [404, 404, 404]
    assert client.get("/webhook").status_code == 405  # other methods still go through FastAPI


def test_two_tokens_are_valid_during_a_rotation_and_every_spelling_of_the_parameter_is_masked(database_url, conn):
    with TestClient(make_app(database_url, WEBHOOK_TOKEN_PREVIOUS="old-token")) as c:
        for token, status in (("old-token", 200), (TOKEN, 200), ("other", 401)):
            resp = c.post("/webhook", headers={**headers(), "X-Webhook-Token": token}, content=gzip.compress(PAGE))
            assert resp.status_code == status, (token, resp.text)
    with TestClient(make_app(database_url)) as c:      # the rotation done: the old one no longer works
        resp = c.post("/webhook", headers={**headers(), "X-Webhook-Token": "old-token"}, content=gzip.compress(PAGE))
        assert resp.status_code == 401
    for line in ("POST /webhook?%74oken=s3cret HTTP/1.1", "POST /webhook?x=1&Token=s3cret", "GET /metrics?token=s3cret"):
        assert "s3cret" not in mask_token(line), line
    assert mask_token("GET /search?q=token=1") == "GET /search?q=token=1"   # a value is not a parameter
