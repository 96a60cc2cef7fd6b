"""Fuzzing the receiver: over 10,000 generated requests, never a 5xx, and nothing stored that
was not acknowledged as stored (a bad token, a refusal, a duplicate or a probe adds no row).

Hypothesis batches sent through the in-process ASGI transport (fast, and free to send byte values no
HTTP parser would let through). The schemathesis cases, built from the app's own OpenAPI schema and
sent over real loopback HTTP, are in test_fuzz_openapi.py (a file each: they run side by side).
"""

from __future__ import annotations

import gzip
import json

import httpx
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_pipeline_tests.webhook.answers import check_answer, newest_id
from rag_pipeline_tests.webhook.conftest import TOKEN, make_app

BATCH = 25
HYPOTHESIS_BATCHES = 410  # 410 x 25 = 10,250 requests

latin1 = st.text(st.characters(max_codepoint=255), max_size=40)
statuses = st.one_of(st.sampled_from(["200", "404", "410", "301", "503", "200, 200", "200,404", " 200 "]),
                     st.integers(-5, 1200).map(str), latin1)
urls = st.one_of(st.sampled_from(["https://example.com/a", "http://example.com/b?x=1", "ftp://x/",
                                  "http://[::1", "https://example.com:0/", "http://example.com:99999/",
                                  "https://ex ample.com/", "https://", "//example.com/"]),
                 st.builds(lambda s: f"https://example.com/{s}", latin1), latin1)
rids = st.one_of(st.uuids().map(lambda u: u.hex), st.sampled_from(["dup-1", "dup-2", "dummyrequest", ""]),
                 latin1, st.text(max_size=300).filter(lambda s: s.isascii()))
pages = st.one_of(st.just(""), st.text(max_size=200), st.sampled_from(["# T\n\nbody\n", "   \n"]))


PAGES = [gzip.compress(f"# Page {i}\n\n{'Some words about pgvector. ' * (i * 7 + 1)}\n".encode()) for i in range(8)]
BOMB = gzip.compress(b"a" * 200_000)  # over this app's 100 kB page cap, from ~200 bytes


def _json_delivery(draw) -> bytes:
    fields = draw(st.dictionaries(
        st.sampled_from(["rid", "url", "pc_status", "cb_status", "original_status", "body"]),
        st.one_of(st.none(), st.integers(-1, 1000), latin1, rids, urls, statuses, st.lists(st.integers(), max_size=2)),
        max_size=6))
    base = {"rid": draw(st.uuids()).hex, "url": "https://example.com/j", "pc_status": 200,
            "original_status": 200, "body": "# J\n\ntext"}
    return gzip.compress(json.dumps({**base, **fields}).encode())


MUTATIONS = ["bad_token", "no_token", "empty_token", "header_token", "no_rid", "rid", "duplicate_rid", "no_url",
             "url", "crawler_status", "original_status", "no_statuses", "pushed_url", "probe", "plain_body",
             "empty_body", "random_body", "truncated_gzip", "bomb", "json", "json_garbage", "content_encoding"]


@st.composite
def requests_(draw):
    """A valid delivery, then up to three mutations drawn from what a client can get wrong."""
    params = {"token": TOKEN}
    h: dict[str, str] = {"rid": draw(st.uuids()).hex, "url": draw(st.sampled_from(["https://example.com/a",
                         "http://example.com/b?x=1", "https://example.com/c#frag"])),
                         "cb-status": "200", "original-status": draw(st.sampled_from(["200", "404", "301", "503"])),
                         "content-encoding": "gzip"}
    body = draw(st.sampled_from(PAGES))
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        if mutation == "bad_token":
            params["token"] = TOKEN + draw(st.text(min_size=1, max_size=3))
        elif mutation == "no_token":
            params.pop("token", None)
        elif mutation == "empty_token":
            params["token"] = ""
        elif mutation == "header_token":
            params.pop("token", None)
            h["x-webhook-token"] = TOKEN
        elif mutation in ("no_rid", "no_url"):
            h.pop(mutation[3:], None)
        elif mutation == "rid":
            h["rid"] = draw(rids)
        elif mutation == "duplicate_rid":
            h["rid"] = draw(st.sampled_from(["dup-1", "dup-2"]))
        elif mutation == "url":
            h["url"] = draw(urls)
        elif mutation == "crawler_status":
            h.pop("cb-status", None)
            h[draw(st.sampled_from(["cb-status", "cb_status", "pc-status", "pc_status"]))] = draw(statuses)
        elif mutation == "original_status":
            h.pop("original-status", None)
            h[draw(st.sampled_from(["original-status", "original_status"]))] = draw(statuses)
        elif mutation == "no_statuses":
            h.pop("cb-status", None)
            h.pop("original-status", None)
        elif mutation == "pushed_url":
            h[draw(st.sampled_from(["pushed-url", "pushed_url"]))] = draw(urls)
        elif mutation == "probe":
            h["user-agent"] = draw(st.sampled_from(["Crawlbase Monitoring Bot 1.0", "Crawlbase", "curl/8"]))
        elif mutation == "plain_body":
            body = draw(pages).encode("utf-8", errors="surrogatepass")
            h.pop("content-encoding", None)
        elif mutation == "empty_body":
            body = b""
        elif mutation == "random_body":
            body = draw(st.binary(max_size=100))
        elif mutation == "truncated_gzip":
            body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
        elif mutation == "bomb":
            body = BOMB
        elif mutation in ("json", "json_garbage"):
            h["content-type"] = "gzip/json"
            body = _json_delivery(draw) if mutation == "json" else gzip.compress(draw(st.binary(max_size=60)))
        elif mutation == "content_encoding":
            h["content-encoding"] = draw(st.sampled_from(["identity", "br", "gzip, gzip", ""]))
    headers = [(k.encode(), v.encode("latin-1")) for k, v in h.items()]
    # The header wins when it is non-empty; the query parameter is read otherwise.
    good_token = (h.get("x-webhook-token") == TOKEN
                  or (not h.get("x-webhook-token") and params.get("token") == TOKEN))
    return good_token, params, headers, body


def test_hypothesis_fuzz_10k_requests(database_url, conn):
    app = make_app(database_url, WEBHOOK_MAX_PAGE_BYTES=100_000, WEBHOOK_ACCESS_LOG=False)
    seen = {"sent": 0, "stored": 0, "refused": 0}

    async def send(batch):
        """A batch in one call into the app's event loop: a hop between threads per request (the
        test client's way) cost more than the receiver's own work on every request."""
        # Read once a batch (a failed batch leaves it stale); within it, one writer: each
        # answer's newest id is the next request's before.
        newest = newest_id(conn)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            for good_token, params, headers, body in batch:
                resp = await http.post("/webhook", params=params, headers=headers, content=body)
                seen["sent"] += 1
                answer = resp.json()
                newest = check_answer(conn, newest, resp.status_code, answer, good_token)
                seen["stored" if answer.get("status") == "stored" else "refused"] += 1

    with TestClient(app) as client:       # runs the app's lifespan (its pool) on the client's loop
        @settings(max_examples=HYPOTHESIS_BATCHES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(requests_(), min_size=BATCH, max_size=BATCH))
        def fuzz(batch):
            client.portal.call(send, batch)

        fuzz()
    print(f"hypothesis fuzz: {seen}")
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == seen["stored"]
    assert seen["sent"] >= 10_000
    # The generator reaches both sides: plenty stored, plenty refused.
    assert seen["stored"] > 500 and seen["refused"] > 2_000
