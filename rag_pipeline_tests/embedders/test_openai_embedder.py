"""The OpenAI embedder against a loopback fake of the real API (rag_pipeline_tests/embedders/test_fake_openai.py
holds the fake to what the official client sends and reads)."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from rag_pipeline.core.tokens import MAX_EMBED_INPUT_TOKENS, count_tokens
from rag_pipeline.embedders.base import Embedder, EmbeddingError, PoisonedInputError
from rag_pipeline.core.retrying import parse_retry_after
from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline_tests.fakes import FakeOpenAI
from rag_pipeline_tests.servers import serve

DIMS = 64


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(dimensions=DIMS) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeOpenAI) -> FakeOpenAI:
    server.reset()
    return server


class Sleeps(list[float]):
    """Records the waits instead of waiting, so retry tests take milliseconds."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make(fake: FakeOpenAI, sleeps: Sleeps | None = None, **kwargs: object) -> OpenAIEmbedder:
    options: dict[str, object] = {"api_key": "sk-test", "base_url": fake.base_url, "timeout_s": 5.0,
                                  "sleep": sleeps if sleeps is not None else Sleeps(), "rng": random.Random(7)}
    options.update(kwargs)
    return OpenAIEmbedder("text-embedding-3-small", DIMS, **options)  # type: ignore[arg-type]


def texts(n: int, words: int = 5) -> list[str]:
    return [f"passage {i} " + " ".join(f"w{i}x{j}" for j in range(words)) for i in range(n)]


def test_round_trip_vectors_order_and_accounting(fake: FakeOpenAI) -> None:
    embedder = make(fake)
    assert isinstance(embedder, Embedder)
    inputs = texts(7)
    result = embedder.embed(inputs)
    assert np.allclose(result.vectors, [fake.vector(t) for t in inputs], atol=1e-6)
    assert all(abs(np.linalg.norm(v) - 1.0) < 1e-9 for v in result.vectors)
    assert (result.requests, result.retries) == (1, 0) == (fake.requests, 0)
    assert result.tokens == fake.total_tokens == sum(count_tokens(t) for t in inputs)
    assert fake.inputs == inputs
    call = fake.calls[0]
    # Vectors are asked for in base64, as the official client asks; `dimensions` is sent because it was set.
    assert (call.encoding_format, call.dimensions, call.model) == ("base64", DIMS, "text-embedding-3-small")


def test_empty_list_sends_nothing(fake: FakeOpenAI) -> None:
    result = make(fake).embed([])
    assert (result.vectors, result.tokens, result.requests) == ([], 0, 0)
    assert fake.requests == 0


def test_batches_split_by_input_count(fake: FakeOpenAI) -> None:
    inputs = texts(10)
    result = make(fake, max_inputs_per_request=3).embed(inputs)
    assert [len(c.inputs) for c in fake.calls] == [3, 3, 3, 1]
    assert fake.inputs == inputs
    assert np.allclose(result.vectors, [fake.vector(t) for t in inputs], atol=1e-6)
    assert result.requests == 4 and result.tokens == fake.total_tokens


def test_batches_split_by_token_budget(fake: FakeOpenAI) -> None:
    inputs = texts(12, words=8)
    counts = [count_tokens(t) for t in inputs]
    budget = 3 * max(counts)
    big = "long " * (2 * budget)  # over the budget alone: must go in a request of its own
    inputs.insert(5, big)
    result = make(fake, max_tokens_per_request=budget).embed(inputs)
    sizes = [sum(count_tokens(t) for t in c.inputs) for c in fake.calls]
    assert len(fake.calls) > 3
    assert all(size <= budget for c, size in zip(fake.calls, sizes) if c.inputs != [big])
    assert [big] in [c.inputs for c in fake.calls]
    assert fake.inputs == inputs
    assert np.allclose(result.vectors, [fake.vector(t) for t in inputs], atol=1e-6)
    assert result.tokens == fake.total_tokens


def test_429_honours_retry_after_then_succeeds(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.fail_next(2, status=429, retry_after=0.25)
    result = make(fake, sleeps).embed(texts(3))
    assert sleeps == [0.25, 0.25]  # the server's wait, not our backoff
    assert (result.retries, result.requests, fake.requests) == (2, 3, 3)
    assert result.tokens == fake.total_tokens  # failed requests are not billed


def test_retry_after_is_capped(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.fail_next(1, status=429, retry_after=3600)
    make(fake, sleeps, retry_after_max_s=2.0).embed(texts(1))
    assert sleeps == [2.0]


def test_gives_up_after_max_retries(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.fail_next(10, status=429, retry_after=0.01)
    with pytest.raises(EmbeddingError, match="gave up after 3 retries.*429"):
        make(fake, sleeps, max_retries=3).embed(texts(2))
    assert fake.requests == 4 and len(sleeps) == 3
    assert fake.inputs == []


def test_500_is_retried_with_jittered_backoff(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.fail_next(2, status=500)
    result = make(fake, sleeps, backoff_base_s=1.0).embed(texts(2))
    assert result.retries == 2 and fake.requests == 3
    assert 0.0 <= sleeps[0] <= 1.0 and 0.0 <= sleeps[1] <= 2.0  # full jitter under base * 2**attempt


def test_insufficient_quota_is_not_retried(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.fail_next(1, status=429, code="insufficient_quota", message="You exceeded your current quota")
    with pytest.raises(EmbeddingError, match="quota"):
        make(fake, sleeps).embed(texts(1))
    assert fake.requests == 1 and sleeps == []


def test_timeouts_are_retried_then_reported() -> None:
    # A fake of its own: the slow requests it is still serving must not leak into other tests.
    with FakeOpenAI(dimensions=DIMS) as fake:
        sleeps = Sleeps()
        fake.delay(2.0)
        with pytest.raises(EmbeddingError, match="gave up after 1 retries.*timed out"):
            make(fake, sleeps, timeout_s=0.2, max_retries=1).embed(texts(1))
        assert len(sleeps) == 1
        assert fake.requests == 2


def test_connection_errors_are_retried_then_reported() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    embedder = OpenAIEmbedder("text-embedding-3-small", api_key="k", base_url=f"http://127.0.0.1:{port}/v1",
                              max_retries=2, sleep=sleeps)
    with pytest.raises(EmbeddingError, match="gave up after 2 retries.*connection error"):
        embedder.embed(["hello"])
    assert len(sleeps) == 2


def test_bisection_isolates_the_poisoned_input(fake: FakeOpenAI) -> None:
    inputs = texts(10)
    inputs[6] = "this one carries POISON inside"
    fake.poison("POISON", message="Invalid 'input': rejected by the moderation filter.")
    with pytest.raises(PoisonedInputError) as info:
        make(fake).embed(inputs)
    error = info.value
    assert error.indices == [6]
    assert "moderation filter" in error.reason and "moderation filter" in str(error)
    assert error.vectors[6] is None
    good = error.good_vectors()
    assert sorted(good) == [i for i in range(10) if i != 6]
    for i, v in good.items():
        assert np.allclose(v, fake.vector(inputs[i]), atol=1e-6)
    # Every good input was embedded (and billed) exactly once; the bad one never was.
    assert sorted(fake.inputs) == sorted(t for i, t in enumerate(inputs) if i != 6)
    assert error.tokens == fake.total_tokens and error.requests == fake.requests


def test_bisection_finds_several_poisoned_inputs_across_batches(fake: FakeOpenAI) -> None:
    inputs = texts(20)
    for i in (0, 9, 13):
        inputs[i] += " BAD"
    fake.poison("BAD")
    with pytest.raises(PoisonedInputError) as info:
        make(fake, max_inputs_per_request=8).embed(inputs)
    assert info.value.indices == [0, 9, 13]
    assert set(info.value.reasons) == {0, 9, 13}
    assert len(info.value.good_vectors()) == 17
    assert sorted(fake.inputs) == sorted(t for t in inputs if "BAD" not in t)


def test_a_400_for_every_input_stops_bisecting_early(fake: FakeOpenAI) -> None:
    fake.poison("passage")  # in every input: not an input problem worth ~2 requests per input
    with pytest.raises(EmbeddingError, match="rejects every input") as info:
        make(fake).embed(texts(64))
    assert not isinstance(info.value, PoisonedInputError)
    assert fake.requests < 40


def test_input_over_the_token_limit_is_refused_before_any_request(fake: FakeOpenAI) -> None:
    long_text = "lorem " * (MAX_EMBED_INPUT_TOKENS + 10)
    assert count_tokens(long_text) > MAX_EMBED_INPUT_TOKENS
    with pytest.raises(EmbeddingError, match=rf"#1 \({count_tokens(long_text)} tokens\).*never truncated"):
        make(fake).embed(["fine", long_text, "fine too"])
    assert fake.requests == 0


def test_empty_string_is_refused_before_any_request(fake: FakeOpenAI) -> None:
    with pytest.raises(EmbeddingError, match=r"empty input at index \[1\]"):
        make(fake).embed(["fine", ""])
    assert fake.requests == 0


def test_wrong_key_is_not_retried() -> None:
    with FakeOpenAI(dimensions=DIMS, api_key="right") as fake:
        sleeps = Sleeps()
        with pytest.raises(EmbeddingError, match="HTTP 401"):
            make(fake, sleeps, api_key="wrong").embed(["x"])
        assert fake.requests == 1 and sleeps == []


def test_unknown_model_at_the_server_is_not_retried() -> None:
    with FakeOpenAI(dimensions=DIMS, models=["text-embedding-3-large"]) as fake:
        with pytest.raises(EmbeddingError, match="HTTP 404.*does not exist"):
            make(fake).embed(["x"])
        assert fake.requests == 1


def test_dimensions_sent_only_when_set_and_only_to_v3() -> None:
    with FakeOpenAI(dimensions=1536) as fake:
        default = OpenAIEmbedder("text-embedding-3-small", api_key="k", base_url=fake.base_url)
        assert default.dimensions == 1536
        assert len(default.embed(["a"]).vectors[0]) == 1536
        shortened = OpenAIEmbedder("text-embedding-3-small", 256, api_key="k", base_url=fake.base_url)
        assert len(shortened.embed(["a"]).vectors[0]) == 256
        other = OpenAIEmbedder("my-compatible-model", 1536, api_key="k", base_url=fake.base_url)
        other.embed(["a"])
        assert [c.dimensions for c in fake.calls] == [None, 256, None]


def test_model_configuration_errors() -> None:
    assert OpenAIEmbedder("text-embedding-3-large", api_key="k").dimensions == 3072
    assert OpenAIEmbedder("text-embedding-ada-002", api_key="k").dimensions == 1536
    with pytest.raises(EmbeddingError, match="EMBEDDING_DIMENSIONS"):
        OpenAIEmbedder("some-unknown-model", api_key="k")
    with pytest.raises(EmbeddingError, match="does not support"):
        OpenAIEmbedder("text-embedding-ada-002", 512, api_key="k")
    with pytest.raises(EmbeddingError, match="cannot ask for"):
        OpenAIEmbedder("text-embedding-3-small", 4096, api_key="k")
    with pytest.raises(EmbeddingError, match="API key"):
        OpenAIEmbedder("text-embedding-3-small", api_key="")


def test_server_returning_the_wrong_size_is_an_error(fake: FakeOpenAI) -> None:
    embedder = OpenAIEmbedder("my-compatible-model", DIMS * 2, api_key="k", base_url=fake.base_url)
    with pytest.raises(EmbeddingError, match=f"returned {DIMS} dimensions, expected {DIMS * 2}"):
        embedder.embed(["x"])


def test_usage_missing_falls_back_to_our_count_and_a_list_of_floats_is_read() -> None:
    embedder = OpenAIEmbedder("text-embedding-3-small", 2, api_key="k")
    # A compatible server that ignores encoding_format answers with floats.
    vectors, tokens = embedder._parse({"data": [{"index": 0, "embedding": [3.0, 4.0]}], "usage": None}, 1)
    assert vectors == [[0.6, 0.8]] and tokens is None
    with pytest.raises(EmbeddingError, match="non-numeric vector"):
        embedder._parse({"data": [{"index": 0, "embedding": "not base64!"}]}, 1)


def test_a_proxy_answering_html_is_retried_and_its_words_reported() -> None:
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    seen = []

    async def gateway(request):
        seen.append(request.headers.get("authorization"))
        return HTMLResponse("<html><body>502 Bad Gateway</body></html>", status_code=502)

    sleeps = Sleeps()
    with serve(Starlette(routes=[Route("/v1/embeddings", gateway, methods=["POST"])])) as base:
        embedder = OpenAIEmbedder("text-embedding-3-small", api_key="sk-x", base_url=f"{base}/v1", max_retries=1,
                                  sleep=sleeps)
        with pytest.raises(EmbeddingError, match="gave up after 1 retries.*HTTP 502: <html><body>502 Bad Gateway"):
            embedder.embed(["hello"])
        embedder.close()
    assert seen == ["Bearer sk-x"] * 2 and len(sleeps) == 1


def test_parse_retry_after_headers() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT"}, now=1445412480.0) == 5.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    embedder = OpenAIEmbedder("text-embedding-3-small", api_key="k", backoff_base_s=0.5, backoff_max_s=4.0,
                              rng=random.Random(1))
    for attempt in range(8):
        waits = [embedder.retrying.backoff.delay(attempt, None, embedder.retrying.rng) for _ in range(200)]
        cap = min(4.0, 0.5 * 2**attempt)
        assert all(0.0 <= w <= cap for w in waits)
        assert max(waits) > 0.8 * cap  # spread over the whole range, not a fixed delay


def test_counts_the_chunker_made_stand_in_for_counting_again(monkeypatch):
    """The batch's texts are not tokenized a second time: the counts given plan the requests and
    check each input's limit; a count list of the wrong length is refused before any request."""
    from rag_pipeline.embedders import openai_embedder

    texts = [f"passage {n} about the heron relay" for n in range(6)]
    with FakeOpenAI(dimensions=8) as fake:
        embedder = OpenAIEmbedder("text-embedding-3-small", 8, api_key="sk-test", base_url=fake.base_url,
                                  max_retries=0, max_tokens_per_request=20)
        counted = []
        monkeypatch.setattr(openai_embedder, "count_tokens", lambda t: counted.append(t) or 99)
        result = embedder.embed(texts, [10] * 6)
        assert counted == [] and len(result.vectors) == 6
        assert [len(c.inputs) for c in fake.calls] == [2, 2, 2]     # planned by the counts given
        with pytest.raises(EmbeddingError, match="5 token counts for 6 inputs"):
            embedder.embed(texts, [10] * 5)
        with pytest.raises(EmbeddingError, match="exceed 8191 tokens"):
            embedder.embed(texts[:1], [9000])
        assert len(fake.calls) == 3


def test_a_batch_run_loads_no_sdk_to_embed() -> None:
    """Every batch run starts a process: the SDK's import (~0.8 s) stays out of it."""
    import subprocess
    import sys
    code = ("import sys; import rag_pipeline.definitions, rag_pipeline.ingest.batch_apply;"
            " from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder;"
            " OpenAIEmbedder('text-embedding-3-small', api_key='k').close();"
            " print(sorted(m for m in sys.modules if m == 'openai' or m.startswith('openai.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_redirect_is_followed_with_the_org_headers_and_a_string_error_is_the_reason(monkeypatch) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, RedirectResponse
    from starlette.routing import Route

    seen = []

    async def moved(request):
        return RedirectResponse("/v2/embeddings", status_code=308)

    async def missing(request):
        seen.append((request.headers.get("authorization"), request.headers.get("openai-organization"),
                     request.headers.get("openai-project"), (await request.json())["model"]))
        return JSONResponse({"error": "model not found"}, status_code=404)

    monkeypatch.setenv("OPENAI_ORG_ID", "org-7")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-9")
    app = Starlette(routes=[Route("/v1/embeddings", moved, methods=["POST"]),
                            Route("/v2/embeddings", missing, methods=["POST"])])
    sleeps = Sleeps()
    with serve(app) as base:
        embedder = OpenAIEmbedder("text-embedding-3-small", api_key="sk-x", base_url=f"{base}/v1", sleep=sleeps)
        with pytest.raises(EmbeddingError, match="failed with HTTP 404: model not found$"):
            embedder.embed(["hello"])
        embedder.close()
    assert seen == [("Bearer sk-x", "org-7", "proj-9", "text-embedding-3-small")] and sleeps == []


def test_a_base_url_without_a_scheme_fails_at_once_naming_the_setting() -> None:
    sleeps = Sleeps()
    embedder = OpenAIEmbedder("text-embedding-3-small", api_key="k", base_url="localhost:8080/v1", sleep=sleeps)
    with pytest.raises(EmbeddingError, match="check OPENAI_BASE_URL"):
        embedder.embed(["hello"])
    assert sleeps == []
