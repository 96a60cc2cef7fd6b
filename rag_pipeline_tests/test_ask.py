"""`rag-pipeline ask`: answers from live pages that cite URL, excerpt and both freshness stamps.

The first test runs the whole loop (receiver → sensor → Dagster runs → pgvector → ask) with the
loopback fake OpenAI serving both embeddings and chat; the others index pages directly with the
hash embedder (no Dagster) and use the fake for chat only.
"""

from __future__ import annotations

import gzip
import json
import re
import time
import uuid

import psycopg
import pytest
from click.testing import CliRunner
from pgvector.psycopg import register_vector

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.embedders.local_embedder import LocalEmbedder
from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import configure, deliver, openai_stack

MAX = 10_000_000
WEBHOOKS = "https://docs.example.com/webhooks"
PRICING = "https://docs.example.com/pricing"
BACKUPS = "https://docs.example.com/backups"
PAGES = {
    WEBHOOKS: "# Webhook tokens\n\nTo rotate the webhook token, generate a new token on the settings page, "
              "update the crawler callback with it, then revoke the old webhook token.",
    PRICING: "# Pricing\n\nThe quokka plan costs nine dollars a month and includes one webhook token.",
    BACKUPS: "# Backups\n\nSnapshot backups run nightly. The webhook token is not part of a backup: "
             "rotate the webhook token again after a restore.",
}
QUESTION = "How do I rotate the webhook token?"


@pytest.fixture(autouse=True)
def _no_answer_settings(monkeypatch):
    for var in ("ANSWER_API_KEY", "ANSWER_BASE_URL", "ANSWER_MODEL", "ANSWER_MAX_CONTEXT_TOKENS",
                "ANSWER_MAX_OUTPUT_TOKENS", "ANSWER_TIMEOUT_S", "ANSWER_MAX_RETRIES"):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()


def ask(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["ask", *args])
    return result.exit_code, result.stdout, result.stderr


def ask_json(*args: str) -> tuple[dict, str]:
    code, out, err = ask(*args, "--json")
    assert code == 0, out + err
    return json.loads(out), err


def numbers_by_url(prompt: str) -> dict[str, int]:
    return {url: int(n) for n, url in re.findall(r"^\[(\d+)\] (\S+)$", prompt, re.MULTILINE)}


def page_stamps(conn, url: str) -> tuple[str, str]:
    verified, changed = conn.execute(
        "SELECT last_verified_at, last_changed_at FROM pages WHERE url = %s", (url,)).fetchone()
    return verified.isoformat(), changed.isoformat()


# -- the whole loop -----------------------------------------------------------------------------


@pytest.fixture
def stack(database_url, monkeypatch):
    """Real receiver, fake OpenAI (embeddings and chat, one key), real Dagster instance."""
    with FakeOpenAI(dimensions=256, api_key="sk-test") as fake, \
            openai_stack(database_url, monkeypatch, fake) as (base, pipeline):
        yield base, fake, pipeline


def test_ask_cites_only_live_pages_through_the_whole_pipeline(stack, conn, monkeypatch):
    base, fake, pipeline = stack
    for url, markdown in PAGES.items():
        deliver(base, url, markdown)
    assert sorted(pipeline.tick().partitions) == sorted(PAGES)
    deliver(base, PRICING, "Not found", original_status=404)
    assert pipeline.tick().partitions == []

    # The model cites both sources it was given, and one it was not.
    fake.script_chat(lambda messages: "Generate a new token, update the callback, revoke the old one [1]. "
                                      "Rotate it again after a restore [2]. Pricing says one token [9].")
    data, err = ask_json(QUESTION)
    (call,) = fake.chat_calls
    assert call.status == 200 and call.model == "gpt-5.6-luna"
    prompt = call.messages[-1]["content"]
    sent = numbers_by_url(prompt)
    assert set(sent) == {WEBHOOKS, BACKUPS}                 # the tombstoned page is never sent
    assert "quokka" not in prompt and PRICING not in prompt
    assert PAGES[WEBHOOKS].split("\n\n")[1] in prompt and QUESTION in prompt
    assert call.messages[0]["role"] == "system" and "only" in call.messages[0]["content"]

    assert [c["url"] for c in data["citations"]] == [
        url for url, _ in sorted(sent.items(), key=lambda item: item[1])]
    for citation in data["citations"]:
        assert citation["source"] == sent[citation["url"]]
        assert (citation["last_verified_at"], citation["last_changed_at"]) == page_stamps(conn, citation["url"])
        assert citation["excerpt"] and citation["excerpt"] in " ".join(PAGES[citation["url"]].split())
    assert data["unknown_markers"] == [9] and "[9]" not in data["answer"]
    assert "[9]" in err and "names no source" in err
    assert data["usage"]["prompt_tokens"] > 0 and data["model"] == "gpt-5.6-luna"

    # Text output: the answer, then only the cited sources, each with both stamps.
    fake.script_chat("Revoke the old webhook token after rotating it [1].")
    code, out, _ = ask(QUESTION)
    assert code == 0
    source_lines = [line for line in out.splitlines() if re.match(r"^\[\d+\] https://", line)]
    assert len(source_lines) == 1 and PRICING not in out
    assert re.search(r"verified \d{4}-\d\d-\d\dT\S+  changed \d{4}-\d\d-\d\dT\S+", out)

    # A question about the tombstoned page still cannot cite it.
    code, out, _ = ask("How much does the quokka plan cost?")
    assert code == 0 and PRICING not in out

    # 429 (with Retry-After) then success: retried, answered.
    before = len(fake.chat_calls)
    fake.fail_next(1, 429, retry_after=0.05, endpoint="chat")
    data, _ = ask_json(QUESTION)
    assert [c.status for c in fake.chat_calls[before:]] == [429, 200]
    assert data["retries"] == 1 and data["citations"]

    # A refused key: a clear error at once, non-zero exit, no retry.
    before = len(fake.chat_calls)
    monkeypatch.setenv("ANSWER_API_KEY", "sk-wrong")
    get_settings.cache_clear()
    code, out, err = ask(QUESTION)
    assert code == 1
    assert "refused the API key (HTTP 401)" in err and "ANSWER_API_KEY" in err
    assert [c.status for c in fake.chat_calls[before:]] == [401]


# -- indexed directly, hash embedder ------------------------------------------------------------


def put(conn, url: str, text: str, status: int = 200) -> None:
    deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                      original_status=status, content_type="text/markdown", body=gzip.compress(text.encode()),
                      body_encoding="gzip")


def tombstone(database_url: str, url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        put(conn, url, "gone", status=404)
        assert dict(route_batch(conn, 100, MAX).outcomes) == {"deleted": 1}


@pytest.fixture
def indexed(database_url, monkeypatch):
    """The three pages indexed with the hash embedder; chat through the fake with its own key."""
    index_pages(database_url, HashEmbedder(dimensions=64), budget=(512, 64))
    with FakeOpenAI(dimensions=16, api_key="sk-chat") as fake:
        monkeypatch.setenv("DATABASE_URL", database_url)
        monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
        monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
        monkeypatch.setenv("ANSWER_API_KEY", "sk-chat")
        monkeypatch.setenv("ANSWER_BASE_URL", fake.base_url)
        get_settings.cache_clear()
        yield fake


def test_no_chat_endpoint_says_what_to_set_and_search_still_works(indexed, monkeypatch):
    monkeypatch.delenv("ANSWER_API_KEY")
    get_settings.cache_clear()
    code, out, err = ask(QUESTION)
    assert code == 1 and out == ""
    assert "OPENAI_API_KEY" in err and "ANSWER_API_KEY" in err and "rag-pipeline search" in err
    assert indexed.chat_calls == []
    search = CliRunner().invoke(cli, ["search", QUESTION, "--json"])
    assert search.exit_code == 0 and json.loads(search.stdout)["results"]


def test_ask_sends_what_search_retrieves_best_first(indexed):
    search = CliRunner().invoke(cli, ["search", QUESTION, "--k", "3", "--json"])
    ranked = [r["url"] for r in json.loads(search.stdout)["results"]]
    data, _ = ask_json(QUESTION, "--k", "3")
    sent = numbers_by_url(indexed.chat_calls[0].messages[-1]["content"])
    assert [url for url, _ in sorted(sent.items(), key=lambda item: item[1])] == ranked
    assert data["retrieved"] == data["sources_sent"] == 3


def test_the_source_budget_keeps_the_best_ranked(indexed, monkeypatch):
    search = CliRunner().invoke(cli, ["search", QUESTION, "--k", "3", "--json"])
    ranked = [r["url"] for r in json.loads(search.stdout)["results"]]
    monkeypatch.setenv("ANSWER_MAX_CONTEXT_TOKENS", "100")   # room for two ~50-token sources, not three
    get_settings.cache_clear()
    data, _ = ask_json(QUESTION, "--k", "3")
    sent = list(numbers_by_url(indexed.chat_calls[0].messages[-1]["content"]))
    # The best always goes in; after it, whatever still fits, in rank order.
    assert sent[0] == ranked[0] and sent == [url for url in ranked if url in sent]
    assert data["retrieved"] == 3 and data["sources_sent"] == len(sent) == 2 and data["source_tokens"] <= 100


def test_a_page_tombstoned_while_the_model_answers_is_not_cited(indexed, database_url):
    def answer_while_webhooks_is_deleted(messages):
        tombstone(database_url, WEBHOOKS)
        n = numbers_by_url(messages[-1]["content"])
        return f"Revoke the old token [{n[WEBHOOKS]}]. Rotate again after a restore [{n[BACKUPS]}]."

    indexed.script_chat(answer_while_webhooks_is_deleted)
    data, err = ask_json(QUESTION)
    assert [c["url"] for c in data["citations"]] == [BACKUPS]
    assert [w["url"] for w in data["withdrawn"]] == [WEBHOOKS]
    withdrawn = data["withdrawn"][0]["source"]
    assert f"[{withdrawn}]" not in data["answer"] and "Revoke the old token." in data["answer"]
    assert WEBHOOKS in err and "left the index" in err


def test_no_hits_says_so_without_calling_the_model(indexed, database_url):
    for url in PAGES:
        tombstone(database_url, url)
    code, out, _ = ask(QUESTION)
    assert code == 0 and "no results" in out and "not asked" in out
    data, _ = ask_json(QUESTION)
    assert data["answer"] is None and data["citations"] == []
    assert indexed.chat_calls == []


def test_an_answer_that_the_sources_do_not_answer_cites_nothing(indexed):
    indexed.script_chat("The sources do not answer the question.")
    code, out, err = ask("What is the capital of France?")
    assert code == 0
    assert out.startswith("The sources do not answer the question.") and "Sources: none cited" in out
    assert "cites no source" in err


def test_server_errors_are_retried_then_reported(indexed, monkeypatch):
    monkeypatch.setenv("ANSWER_MAX_RETRIES", "1")
    get_settings.cache_clear()
    indexed.fail_next(2, 500, retry_after=0.01, endpoint="chat")
    code, _, err = ask(QUESTION)
    assert code == 1 and "gave up after 1 retries: HTTP 500" in err
    assert [c.status for c in indexed.chat_calls] == [500, 500]


def test_an_empty_index_says_so(database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("ANSWER_API_KEY", "sk-unused")
    get_settings.cache_clear()
    code, _, err = ask(QUESTION)
    assert code == 1 and "the index is empty" in err


def test_no_transaction_stays_open_while_the_model_answers(indexed, database_url):
    samples: list[dict[int, str]] = []

    def answer_and_look(messages):
        # The CLI is blocked on this reply, so its connection's state holds still; the pool may be
        # opening another one meanwhile (briefly in a transaction while it is configured): sample a few times.
        with psycopg.connect(database_url, autocommit=True) as conn:
            for _ in range(5):
                samples.append(dict(conn.execute(
                    "SELECT pid, state FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()))
                time.sleep(0.05)
        return "Revoke the old token [1]."

    indexed.script_chat(answer_and_look)
    ask_json(QUESTION)
    assert all(samples)
    held = set.intersection(*({pid for pid, state in s.items() if state == "idle in transaction"} for s in samples))
    assert not held, samples   # the CLI's connection is idle between its reads, holding no locks


# -- questions are embedded in the active space, whatever keys are set --------------------------


def index_pages(database_url: str, embedder, budget: tuple[int, int] = (160, 32)) -> None:
    """The three pages indexed directly with ``embedder``: its space becomes the active one.

    Not the pool the CLI draws from: its connections stay as the CLI leaves them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        register_vector(conn)
        for url, markdown in PAGES.items():
            put(conn, url, markdown)
        route_batch(conn, 100, MAX)
        for url in PAGES:
            indexing.take_newest_delivery(conn, url, MAX)
            indexing.stage_chunks(conn, url, *budget)
            indexing.embed_and_switch(conn, url, embedder)


def search(*args: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(cli, ["search", QUESTION, "--json", *args])
    urls = [r["url"] for r in json.loads(result.stdout)["results"]] if result.exit_code == 0 else []
    return result.exit_code, urls, result.stderr


def test_a_chat_key_does_not_change_how_questions_of_a_local_index_are_embedded(database_url, monkeypatch):
    # The case: `make run` indexed with the offline model, then a key is set to get answers.
    index_pages(database_url, LocalEmbedder())
    with FakeOpenAI(dimensions=64, api_key="sk-chat") as fake:
        configure(monkeypatch, DATABASE_URL=database_url)
        code, offline, err = search()
        assert code == 0 and offline, err
        configure(monkeypatch, OPENAI_API_KEY="sk-chat", OPENAI_BASE_URL=fake.base_url)
        assert get_settings().resolved_embedding_provider() == "openai"   # what indexing would use

        code, urls, err = search()
        assert code == 0, err
        assert urls == offline                  # the same model ranked the same passages
        fake.script_chat("Generate a new token, update the callback, then revoke the old one [1].")
        data, _ = ask_json(QUESTION)
        assert [c["url"] for c in data["citations"]] == [offline[0]]
        assert len(fake.chat_calls) == 1
        assert fake.calls == []                 # no question was sent to the embeddings endpoint


@pytest.mark.parametrize("env", [
    {"EMBEDDING_PROVIDER": None, "EMBEDDING_DIMENSIONS": None, "OPENAI_API_KEY": "sk-x"},
    {"EMBEDDING_PROVIDER": "local", "EMBEDDING_DIMENSIONS": None},
    {"EMBEDDING_PROVIDER": "hash", "EMBEDDING_DIMENSIONS": "32"},
], ids=["openai-key", "local-configured", "other-hash-size"])
def test_a_hash_space_is_searched_at_its_own_size_whatever_is_configured(database_url, monkeypatch, env):
    index_pages(database_url, HashEmbedder(dimensions=64))
    # Nothing listens there: a question sent to an OpenAI-compatible server would fail.
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64",
              OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    code, expected, err = search()
    assert code == 0 and expected, err
    configure(monkeypatch, **env)
    assert search() == (0, expected, "")


def test_an_openai_space_is_searched_with_its_model_and_size(database_url, monkeypatch):
    with FakeOpenAI(dimensions=64, api_key="sk-emb") as fake:
        index_pages(database_url, OpenAIEmbedder("text-embedding-3-small", 64, api_key="sk-emb",
                                                 base_url=fake.base_url))
        indexed_calls = len(fake.calls)
        # Configured for another model (and provider unset): questions still use the space's.
        configure(monkeypatch, DATABASE_URL=database_url, OPENAI_API_KEY="sk-emb", OPENAI_BASE_URL=fake.base_url,
                  EMBEDDING_MODEL="text-embedding-3-large")
        code, urls, err = search()
        assert code == 0 and urls, err
        (call,) = fake.calls[indexed_calls:]
        assert (call.status, call.model, call.dimensions, call.inputs) == (200, "text-embedding-3-small", 64,
                                                                          [QUESTION])

        # A chat key alone cannot embed a question in this space: one line says what is missing.
        configure(monkeypatch, OPENAI_API_KEY=None, ANSWER_API_KEY="sk-chat", ANSWER_BASE_URL=fake.base_url,
                  EMBEDDING_PROVIDER="local")
        for code, _, err in (search(), ask(QUESTION)):
            assert code == 1
            assert "text-embedding-3-small" in err and "needs OPENAI_API_KEY" in err
            assert len(err.strip().splitlines()) == 1
        assert len(fake.calls) == indexed_calls + 1 and fake.chat_calls == []
