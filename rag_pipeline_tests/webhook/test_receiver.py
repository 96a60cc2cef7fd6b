"""The receiver against a real database: what it stores, what it refuses, and why."""

from __future__ import annotations

import gzip
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rag_pipeline.settings import Settings
from rag_pipeline_tests.servers import serve
from rag_pipeline_tests.webhook.conftest import PAGE, TOKEN, headers, post, rows
from webhook_sensor.app import create_app

def test_stores_a_gzip_delivery(client, conn):
    resp = post(client)
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "stored"
    assert rows(conn) == [("rid-1", "https://example.com/a", 200, 200, "gzip")]
    body, = conn.execute("SELECT body FROM deliveries").fetchone()
    assert gzip.decompress(body) == PAGE


def test_plain_body_and_underscore_headers(client, conn):
    h = {"rid": "r2", "url": "http://example.com/b", "original_status": "404", "pc_status": "200"}
    resp = client.post("/webhook", params={"token": TOKEN}, headers=h, content=b"gone")
    assert resp.status_code == 200, resp.text
    assert rows(conn) == [("r2", "http://example.com/b", 200, 404, "identity")]


def test_duplicate_rid_answers_200_and_adds_nothing(client, conn):
    assert post(client).json()["status"] == "stored"
    second = post(client)
    assert second.status_code == 200 and second.json()["status"] == "duplicate"
    assert len(rows(conn)) == 1


@pytest.mark.parametrize("token", [None, "", "wrong"])
def test_bad_token_is_401_and_stores_nothing(client, conn, token):
    resp = post(client, token=token)
    assert resp.status_code == 401
    assert "token" in resp.json()["error"]
    assert rows(conn) == []


def test_token_in_header_is_accepted(client, conn):
    resp = client.post("/webhook", headers={**headers(), "X-Webhook-Token": TOKEN}, content=gzip.compress(PAGE))
    assert resp.status_code == 200
    assert len(rows(conn)) == 1


def test_the_header_token_wins_over_the_query_parameter(client, conn):
    """`?token=` stays accepted (Crawlbase's callback URL), but when both are given the header is
    the one checked: a right token in the URL does not make up for a wrong one in the header."""
    wrong_header = client.post("/webhook", params={"token": TOKEN},
                               headers={**headers(rid="r-1"), "X-Webhook-Token": "wrong"}, content=gzip.compress(PAGE))
    assert wrong_header.status_code == 401, wrong_header.text
    right_header = client.post("/webhook", params={"token": "wrong"},
                               headers={**headers(rid="r-2"), "X-Webhook-Token": TOKEN}, content=gzip.compress(PAGE))
    assert right_header.status_code == 200, right_header.text
    assert post(client, token=TOKEN, rid="r-3").status_code == 200       # the query parameter alone
    assert [r[0] for r in rows(conn)] == ["r-2", "r-3"]


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"rid": None}, "rid"),
        ({"url": None}, "url"),
        ({"url": "ftp://example.com/x"}, "http"),
        ({"Original-Status": "abc"}, "status"),
    ],
)
def test_bad_headers_are_400_with_reason(client, conn, change, reason):
    resp = post(client, **change)
    assert resp.status_code == 400
    assert reason in resp.json()["error"]
    assert rows(conn) == []


def test_corrupt_gzip_is_400(client, conn):
    resp = post(client, body=b"\x1f\x8b\x08\x00garbage-not-deflate")
    assert resp.status_code == 400
    assert "gzip" in resp.json()["error"]
    assert rows(conn) == []


def test_empty_body_for_a_200_is_400(client, conn):
    resp = post(client, body=gzip.compress(b"   \n"))
    assert resp.status_code == 400
    assert "empty" in resp.json()["error"]
    assert rows(conn) == []


def test_gzip_bomb_is_413(client, conn):
    bomb = gzip.compress(b"\0" * 5_000_000)  # 5 MB out of ~5 KB, over the 1 MB cap of this app
    resp = post(client, body=bomb)
    assert resp.status_code == 413
    assert rows(conn) == []


def test_monitoring_probe_is_200_and_stores_nothing(client, conn):
    resp = client.post("/webhook", params={"token": TOKEN},
                       headers={"User-Agent": "Crawlbase Monitoring Bot 1.0", "rid": "dummyrequest"},
                       content=b'{"anything": true}')
    assert resp.status_code == 200
    assert resp.json()["status"] == "ignored"
    assert rows(conn) == []


def test_healthz(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_refuses_to_start_without_token():
    with pytest.raises(RuntimeError, match="WEBHOOK_TOKEN"):
        create_app(Settings())


def test_same_delivery_posted_five_times_concurrently_is_one_row(database_url, conn):
    app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
    body = gzip.compress(PAGE)
    with serve(app, health_path="/healthz") as base:
        def send(_):
            return httpx.post(f"{base}/webhook", params={"token": TOKEN}, headers=headers(rid="same"),
                              content=body, timeout=10)
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(send, range(5)))
    assert [a.status_code for a in answers] == [200] * 5
    assert sorted(a.json()["status"] for a in answers) == ["duplicate"] * 4 + ["stored"]
    assert len(rows(conn)) == 1
