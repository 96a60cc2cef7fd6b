"""The query API (`rag-pipeline serve`): the CLI's search and answers over HTTP, behind a token.

Served by uvicorn on loopback (real HTTP); the pages are indexed directly with the hash embedder,
and the chat model is the loopback fake OpenAI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from click.testing import CliRunner

from query_api.app import MAX_BODY_BYTES, create_app
from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.servers import serve
from rag_pipeline_tests.test_ask import BACKUPS, PAGES, QUESTION, WEBHOOKS, index_pages, tombstone
from rag_pipeline_tests.waiting import wait_until

API_TOKEN = "query-api-test-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.fixture
def env(database_url, monkeypatch):
    index_pages(database_url, HashEmbedder(dimensions=64), budget=(512, 64))
    for var in ("ANSWER_API_KEY", "ANSWER_BASE_URL", "OPENAI_API_KEY", "QUERY_API_MAX_INFLIGHT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
    monkeypatch.setenv("QUERY_API_TOKEN", API_TOKEN)
    get_settings.cache_clear()
    return monkeypatch


@pytest.fixture
def api(env, database_url):
    with serve(create_app(get_settings(), database_url=database_url), health_path="/healthz") as base:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client


def cli_json(*args: str) -> dict:
    shown = CliRunner().invoke(cli, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)


def test_search_cites_as_the_cli_does_with_the_same_options(api):
    for body, args in (({"question": QUESTION}, []),
                       ({"question": QUESTION, "k": 2, "per_page": None}, ["--k", "2", "--per-page", "100"]),
                       ({"question": QUESTION, "mode": "lexical"}, ["--mode", "lexical"]),
                       ({"question": QUESTION, "mode": "vector", "k": 3}, ["--mode", "vector", "--k", "3"]),
                       ({"question": QUESTION, "max_age": "7d", "site": ["https://docs.example.com/back*"]},
                        ["--max-age", "7d", "--site", "https://docs.example.com/back*"])):
        answer = api.post("/search", json=body, headers=AUTH)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data == cli_json("search", QUESTION, *args)
        for hit in data["results"]:
            assert set(hit) >= {"url", "excerpt", "score", "last_verified_at", "last_changed_at"}
            assert hit["url"] in PAGES and hit["last_verified_at"] and hit["last_changed_at"]
    assert [h["url"] for h in answer.json()["results"]] == [BACKUPS]


def test_the_token_is_checked_before_anything_else(api):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_TOKEN}"},
                    {"Authorization": API_TOKEN}):
        refused = api.post("/search", json={"question": QUESTION}, headers=headers)
        assert refused.status_code == 401 and refused.json()["reason"] == "bad_token"
        assert refused.headers["www-authenticate"] == "Bearer"
    # Before the body is read or validated: a bad body without the token is a 401, not a 422 or 413.
    assert api.post("/search", content=b"{", headers={"content-type": "application/json"}).status_code == 401
    assert api.post("/ask", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 401
    assert api.get("/healthz").json() == {"status": "ok"}


def test_the_docs_and_schema_are_not_served_unless_made_public(env, database_url):
    """As the receiver's (WEBHOOK_PUBLIC_DOCS): /docs and /openapi.json were served without a token."""
    with serve(create_app(get_settings(), database_url=database_url), health_path="/healthz") as base:
        for path in ("/docs", "/redoc", "/openapi.json"):
            refused = httpx.get(base + path, timeout=10)
            assert refused.status_code == 401 and refused.json()["reason"] == "bad_token", path
            missing = httpx.get(base + path, headers=AUTH, timeout=10)
            assert missing.status_code == 404 and missing.json()["reason"] == "not_found", path
    schema = create_app(get_settings(), database_url=database_url).openapi()     # for tools and tests
    assert {"/search", "/ask"} <= set(schema["paths"])
    env.setenv("QUERY_API_PUBLIC_DOCS", "true")
    get_settings.cache_clear()
    with serve(create_app(get_settings(), database_url=database_url), health_path="/healthz") as base:
        schema = httpx.get(base + "/openapi.json", timeout=10).json()        # public: no token
        assert {"/search", "/ask"} <= set(schema["paths"])
        assert "max_age" in schema["components"]["schemas"]["SearchRequest"]["properties"]
        assert httpx.get(base + "/docs", timeout=10).status_code == 200
        assert httpx.post(base + "/search", json={"question": QUESTION}, timeout=10).status_code == 401


@pytest.mark.parametrize("body, status, words", [
    ({"question": "   "}, 422, "the question is empty"),
    ({"question": ""}, 422, "question"),
    ({"question": "x" * 2001}, 422, "question"),
    ({"question": QUESTION, "k": 0}, 422, "k:"),
    ({"question": QUESTION, "k": 101}, 422, "k:"),
    ({"question": QUESTION, "per_page": 0}, 422, "per_page"),
    ({"question": QUESTION, "max_age": "soon"}, 422, "cannot read age 'soon'"),
    # Ages past what a timedelta or a PostgreSQL timestamp holds were a 500 (OverflowError, SQL).
    ({"question": QUESTION, "max_age": "9" * 400 + "d"}, 422, "more than 100 years"),
    ({"question": QUESTION, "max_age": "100000000w"}, 422, "more than 100 years"),
    ({"question": QUESTION, "changed_since": "last tuesday"}, 422, "cannot read date"),
    ({"question": QUESTION, "site": ["ftp://files.example.com/*"]}, 422, "only http and https"),
    ({"question": QUESTION, "site": ["https://a.example.com/*"] * 21}, 422, "site"),
    ({"question": QUESTION, "mode": "telepathy"}, 422, "mode"),
    ({"k": 3}, 422, "question"),
    (["not", "an", "object"], 422, "invalid_request"),
    # PostgreSQL's text holds no NUL: it was a 500 (psycopg.DataError).
    ({"question": "a\u0000b"}, 422, "the question contains a NUL character"),
    ({"question": QUESTION, "site": ["https://docs.example.com/\u0000*"]}, 422, "contains a NUL character"),
])
def test_bad_input_gets_a_4xx_with_its_reason(api, body, status, words):
    refused = api.post("/search", json=body, headers=AUTH)
    assert refused.status_code == status, refused.text
    data = refused.json()
    assert data["reason"] == "invalid_request" and words in refused.text


def test_bodies_that_are_not_json_or_too_large_are_refused(api):
    broken = api.post("/search", content=b'{"question": "hel', headers={**AUTH, "content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["error"] == "the body is not valid JSON"
    not_object = api.post("/search", json="hello", headers=AUTH)
    assert not_object.status_code == 422 and not_object.json()["error"].startswith("the body must be a JSON object")
    large = api.post("/search", json={"question": "x" * MAX_BODY_BYTES}, headers=AUTH)
    assert large.status_code == 413 and large.json()["reason"] == "body_too_large"


@pytest.mark.parametrize("path", ["/search", "/ask"])
def test_every_error_has_one_shape_and_says_what_to_send(api, path):
    """An empty body said "Field required", a JSON body sent as another content type "the body
    must be a JSON object", and GET FastAPI's own {"detail": …}."""
    body = json.dumps({"question": QUESTION}).encode()
    empty = api.post(path, content=b"", headers=AUTH)
    assert empty.status_code == 422 and set(empty.json()) == {"error", "reason"}, empty.text
    assert empty.json()["reason"] == "empty_body"
    assert "the body is empty" in empty.json()["error"] and '"question"' in empty.json()["error"]
    for content_type in ("application/x-www-form-urlencoded", "text/plain; charset=utf-8"):  # `curl -d`, and so on
        wrong = api.post(path, content=body, headers={**AUTH, "content-type": content_type})
        assert wrong.status_code == 415 and wrong.json()["reason"] == "unsupported_media_type", wrong.text
        assert content_type in wrong.json()["error"] and "application/json" in wrong.json()["error"]
    got = api.get(path, headers=AUTH)
    assert got.status_code == 405 and set(got.json()) == {"error", "reason"}, got.text
    assert got.json()["reason"] == "method_not_allowed" and "use POST" in got.json()["error"]
    assert got.headers["allow"] == "POST"
    nul = api.post(path, json={"question": "a\u0000b"}, headers=AUTH)    # was a 500 (psycopg.DataError)
    assert nul.status_code == 422 and "NUL character" in nul.json()["error"], nul.text
    nowhere = api.post(path + "x", json={"question": QUESTION}, headers=AUTH)
    assert nowhere.status_code == 404 and nowhere.json()["reason"] == "not_found"
    assert "POST /search" in nowhere.json()["error"]
    untyped = api.post(path, content=body, headers=AUTH)      # no Content-Type at all
    assert untyped.status_code == 415 and "no Content-Type" in untyped.json()["error"], untyped.text
    typed = api.post(path, content=body, headers={**AUTH, "content-type": "application/json; charset=utf-8"})
    assert typed.status_code in (200, 503), typed.text        # /ask: 503 without a chat model


def test_a_tombstoned_page_is_never_returned(api, database_url):
    tombstone(database_url, WEBHOOKS)
    for body in ({"question": QUESTION, "k": 10, "per_page": None},
                 {"question": QUESTION, "site": ["https://docs.example.com/*"]},
                 {"question": QUESTION, "max_age": "1d"}):
        hits = api.post("/search", json=body, headers=AUTH).json()["results"]
        assert hits and WEBHOOKS not in {h["url"] for h in hits}


def test_ask_without_a_chat_model_says_what_to_configure(api):
    unconfigured = api.post("/ask", json={"question": QUESTION}, headers=AUTH)
    assert unconfigured.status_code == 503 and unconfigured.json()["reason"] == "ask_not_configured"
    assert "ANSWER_API_KEY" in unconfigured.json()["error"]


@pytest.fixture
def chat(env):
    """The loopback fake as the chat model of `/ask`."""
    with FakeOpenAI(dimensions=16, api_key="sk-chat") as fake:
        env.setenv("ANSWER_API_KEY", "sk-chat")
        env.setenv("ANSWER_BASE_URL", fake.base_url)
        env.setenv("ANSWER_MAX_RETRIES", "0")
        get_settings.cache_clear()
        yield fake


def test_ask_cites_only_live_sources_and_reports_a_failing_chat_model(chat, database_url):
    fake = chat
    fake.script_chat("Generate a new token, update the callback, revoke the old one [1].")
    with serve(create_app(get_settings(), database_url=database_url)) as base:
        answered = httpx.post(f"{base}/ask", json={"question": QUESTION, "k": 3}, headers=AUTH, timeout=30)
        assert answered.status_code == 200, answered.text
        data = answered.json()
        assert data["answer"].startswith("Generate a new token")
        assert [c["url"] for c in data["citations"]] == [WEBHOOKS]
        assert data["citations"][0]["last_verified_at"] and data["warnings"] == []
        fake.fail_next(1, 500, endpoint="chat")
        failed = httpx.post(f"{base}/ask", json={"question": QUESTION}, headers=AUTH, timeout=30)
        assert failed.status_code == 502 and failed.json()["reason"] == "chat_failed"
        # Neither the upstream's text nor its address reaches the client.
        assert fake.base_url.split("//")[1] not in failed.text and "HTTP 500" not in failed.text


def test_requests_beyond_the_in_flight_limit_get_503_at_once(chat, env, database_url):
    fake = chat
    env.setenv("QUERY_API_MAX_INFLIGHT", "1")
    get_settings.cache_clear()
    with serve(create_app(get_settings(), database_url=database_url)) as base:
        fake.delay(3.0)
        slow: dict = {}
        asking = threading.Thread(target=lambda: slow.update(r=httpx.post(
            f"{base}/ask", json={"question": QUESTION}, headers=AUTH, timeout=30)))
        asking.start()
        wait_until(lambda: fake.requests, 10, "the chat model to get the first request")
        assert fake.requests == 1
        busy = httpx.post(f"{base}/search", json={"question": QUESTION}, headers=AUTH, timeout=5)
        assert busy.status_code == 503 and busy.json()["reason"] == "busy"
        assert busy.headers["retry-after"] == "1"
        asking.join(timeout=20)
        assert slow["r"].status_code == 200
        assert httpx.post(f"{base}/search", json={"question": QUESTION}, headers=AUTH).status_code == 200


def test_serve_refuses_to_start_without_a_token(env, tmp_path):
    env.delenv("QUERY_API_TOKEN")
    env.setenv("RAG_HOME", str(tmp_path))
    get_settings.cache_clear()
    refused = CliRunner().invoke(cli, ["serve"])
    assert refused.exit_code == 1 and "QUERY_API_TOKEN is not set" in refused.output


def test_rag_pipeline_serve_answers_over_http(env):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "serve", "--port", str(port)],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, proc.stdout.read()
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, "`rag-pipeline serve` to answer /healthz")
        # The first search loads the embedder in the server: no speed asked here (a busy machine).
        answer = httpx.post(f"{base}/search", json={"question": QUESTION, "k": 3}, headers=AUTH, timeout=60).json()
        assert (answer["vector_scan"], answer["lexical_scan"]) == ("hnsw", "gin")
        hits = answer["results"]
        assert len(hits) == 3 and hits[0]["url"] == WEBHOOKS
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_search_past_the_statement_timeout_is_cancelled_and_the_pool_serves_the_next(env, database_url):
    """A search stuck (here: behind a lock, as a costly scan would be) ends at
    QUERY_STATEMENT_TIMEOUT_S with a 503 that says so, and its connection serves the next one."""
    import psycopg

    env.setenv("QUERY_STATEMENT_TIMEOUT_S", "0.5")
    env.setenv("QUERY_API_POOL_SIZE", "1")          # one connection: the next request needs it back
    get_settings.cache_clear()
    with serve(create_app(get_settings(), database_url=database_url)) as base, \
            psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        stuck = httpx.post(f"{base}/search", json={"question": QUESTION}, headers=AUTH, timeout=30)
        assert stuck.status_code == 503 and stuck.json()["reason"] == "query_timeout", stuck.text
        assert time.monotonic() - started < 5
        blocker.rollback()
        again = httpx.post(f"{base}/search", json={"question": QUESTION}, headers=AUTH, timeout=30)
        assert again.status_code == 200 and again.json()["results"]


def test_a_token_past_its_rate_gets_429_with_retry_after(env, database_url):
    env.setenv("QUERY_API_RATE", "0.5")        # one request every 2 s, bursts of 2
    env.setenv("QUERY_API_BURST", "2")
    get_settings.cache_clear()
    with serve(create_app(get_settings(), database_url=database_url)) as base:
        answers = [httpx.post(f"{base}/search", json={"question": QUESTION}, headers=AUTH, timeout=30)
                   for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        limited = answers[2]
        assert limited.json()["reason"] == "rate_limited" and int(limited.headers["Retry-After"]) >= 1
        # A wrong token is refused as such, never counted against the right one's rate.
        assert httpx.post(f"{base}/search", json={"question": QUESTION},
                          headers={"Authorization": "Bearer nope"}, timeout=30).status_code == 401
        assert httpx.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}


def test_the_rate_limiter_takes_nothing_when_it_refuses():
    from rag_pipeline.crawl.ratelimit import RateLimiter

    now = [0.0]
    bucket = RateLimiter(1.0, 1, clock=lambda: now[0])
    assert bucket.try_acquire() == 0.0
    assert bucket.try_acquire() == 1.0
    now[0] = 0.5
    assert bucket.try_acquire() == 0.5          # the refused try took nothing
    now[0] = 1.0
    assert bucket.try_acquire() == 0.0


@pytest.mark.parametrize("path", ["/search", "/ask"])
def test_a_client_that_hangs_up_has_its_query_cancelled_and_its_connection_back(chat, env, database_url, path):
    """A client that gives up (here: its read timeout) while its search runs (here: stuck behind a
    lock, as a costly scan would run on) has the query cancelled in PostgreSQL at once, not at
    QUERY_STATEMENT_TIMEOUT_S: the pool's one connection serves the next request while the lock
    is still held."""
    import psycopg

    chat.script_chat("Generate a new token [1].")
    env.setenv("QUERY_STATEMENT_TIMEOUT_S", "60")
    env.setenv("QUERY_API_POOL_SIZE", "1")          # one connection: the next request needs it back
    get_settings.cache_clear()

    def stuck_backends(watcher) -> list[tuple[int, str]]:
        return watcher.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'").fetchall()

    with serve(create_app(get_settings(), database_url=database_url)) as base, \
            psycopg.connect(database_url) as blocker, psycopg.connect(database_url, autocommit=True) as watcher:
        blocker.execute("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")
        gave_up: list[BaseException] = []

        def impatient_client() -> None:
            with httpx.Client(base_url=base, headers=AUTH, timeout=httpx.Timeout(30, read=1.5)) as client:
                try:
                    client.post(path, json={"question": QUESTION, "k": 3})
                except httpx.ReadTimeout as exc:
                    gave_up.append(exc)

        asking = threading.Thread(target=impatient_client)
        asking.start()
        # The request's query, waiting for the lock.
        [(pid, state)] = wait_until(lambda: stuck_backends(watcher), 10, "the request's query to wait for the lock")
        assert state == "active"
        asking.join(timeout=10)
        hung_up = time.monotonic()
        assert gave_up, "the client should have given up waiting"
        wait_until(lambda: watcher.execute("SELECT state IS DISTINCT FROM 'active' FROM pg_stat_activity"
                                           " WHERE pid = %s", (pid,)).fetchone() in (None, (True,)),
                   2, "the query of the client that hung up to be cancelled")
        assert time.monotonic() - hung_up < 2 and stuck_backends(watcher) == []
        # Its connection is back in the pool: the next request is served while the lock still holds.
        health = httpx.get(f"{base}/healthz", timeout=10)
        assert health.status_code == 200 and time.monotonic() - hung_up < 3
        blocker.rollback()
        again = httpx.post(f"{base}{path}", json={"question": QUESTION, "k": 3}, headers=AUTH, timeout=30)
        assert again.status_code == 200, again.text


@pytest.mark.parametrize("command", ["search", "ask"])
def test_the_cli_says_on_one_line_when_the_statement_timeout_cancels_a_search(chat, env, database_url, command):
    """QueryCanceled from the statement timeout was a traceback from `search` and `ask`."""
    import psycopg

    env.setenv("QUERY_STATEMENT_TIMEOUT_S", "0.5")
    get_settings.cache_clear()
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")   # as a costly scan would hold it
        started = time.monotonic()
        result = CliRunner().invoke(cli, [command, QUESTION])
        assert time.monotonic() - started < 10
        blocker.rollback()
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the search"), result.output
    assert "took longer than QUERY_STATEMENT_TIMEOUT_S (0.5 s) and was cancelled" in lines[0]


@pytest.mark.parametrize("command", ["search", "ask"])
def test_the_cli_refuses_a_question_with_a_nul_character_on_one_line(env, command):
    result = CliRunner().invoke(cli, [command, "a\x00b"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exception
    assert "the question contains a NUL character" in result.output and "Traceback" not in result.output
