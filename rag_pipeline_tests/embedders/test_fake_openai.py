"""The fake must behave like the real /v1/embeddings, or the embedder tests prove nothing."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from rag_pipeline_tests.fakes import FakeOpenAI

AUTH = {"Authorization": "Bearer sk-test"}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(dimensions=16) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeOpenAI) -> FakeOpenAI:
    server.reset()
    return server


def post(fake: FakeOpenAI, body: dict[str, object], headers: dict[str, str] | None = AUTH) -> httpx.Response:
    return httpx.post(f"{fake.base_url}/embeddings", json=body, headers=headers or {}, timeout=10)


def assert_openai_error(response: httpx.Response, status: int, contains: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert contains in error["message"]
    return error


def test_listens_on_loopback_ephemeral_port(fake: FakeOpenAI) -> None:
    assert fake.base_url.startswith("http://127.0.0.1:") and fake.base_url.endswith("/v1")
    assert fake.port > 0


def test_requires_a_bearer_token(fake: FakeOpenAI) -> None:
    assert_openai_error(post(fake, {"model": "m", "input": "x"}, headers=None), 401, "API key")
    assert_openai_error(post(fake, {"model": "m", "input": "x"}, headers={"Authorization": "Bearer"}), 401, "API key")
    assert_openai_error(post(fake, {"model": "m", "input": "x"}, headers={"Authorization": "Basic abc"}), 401,
                        "API key")
    assert fake.requests == 3 and fake.inputs == []


def test_response_shape_float_and_usage(fake: FakeOpenAI) -> None:
    response = post(fake, {"model": "text-embedding-3-small", "input": ["alpha beta", "gamma"],
                           "encoding_format": "float"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["model"] == "text-embedding-3-small"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 16 for d in body["data"])
    assert body["data"][0]["embedding"] == fake.vector("alpha beta")
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == fake.total_tokens > 0


def test_single_string_input_and_base64(fake: FakeOpenAI) -> None:
    response = post(fake, {"model": "m", "input": "alpha beta", "encoding_format": "base64"})
    encoded = response.json()["data"][0]["embedding"]
    decoded = struct.unpack("<16f", base64.b64decode(encoded))
    assert decoded == pytest.approx(fake.vector("alpha beta"), abs=1e-7)


def test_official_client_decodes_the_default_base64(fake: FakeOpenAI) -> None:
    client = openai.OpenAI(api_key="sk-test", base_url=fake.base_url, max_retries=0)
    response = client.embeddings.create(model="text-embedding-3-small", input=["alpha beta"], dimensions=8)
    assert fake.calls[-1].encoding_format == "base64"
    assert response.data[0].embedding == pytest.approx(fake.vector("alpha beta", 8), abs=1e-7)
    assert response.usage.total_tokens == fake.total_tokens


def test_validates_inputs_like_openai(fake: FakeOpenAI) -> None:
    assert_openai_error(post(fake, {"model": "m", "input": ["ok", ""]}), 400, "'$.input' is invalid")
    assert_openai_error(post(fake, {"model": "m", "input": []}), 400, "'$.input' is invalid")
    assert_openai_error(post(fake, {"model": "m", "input": [1, 2]}), 400, "'$.input' is invalid")
    assert_openai_error(post(fake, {"input": "x"}), 400, "model")
    error = assert_openai_error(post(fake, {"model": "m", "input": ["x"] * 2049}), 400, "2048")
    assert error["type"] == "invalid_request_error"
    assert_openai_error(post(fake, {"model": "m", "input": " a" * 8192}), 400, "maximum context length")
    assert post(fake, {"model": "m", "input": " a" * 8191}).status_code == 200
    # 37 inputs of 8,150 tokens: each allowed, 301,550 together are not.
    assert_openai_error(post(fake, {"model": "m", "input": [" a" * 8150] * 37}), 400, "max 300000 tokens")
    assert_openai_error(post(fake, {"model": "m", "input": "x", "encoding_format": "hex"}), 400, "encoding_format")
    assert_openai_error(post(fake, {"model": "text-embedding-ada-002", "input": "x", "dimensions": 8}), 400,
                        "does not support specifying dimensions")
    assert_openai_error(post(fake, {"model": "text-embedding-3-small", "input": "x", "dimensions": 17}), 400,
                        "dimensions")
    assert fake.inputs == [" a" * 8191]  # only the accepted request counts as embedded


def test_fault_injection_and_reset(fake: FakeOpenAI) -> None:
    fake.fail_next(1, status=429, retry_after=0.25)
    fake.fail_next(1, status=500)
    limited = post(fake, {"model": "m", "input": "x"})
    assert_openai_error(limited, 429, "Rate limit")
    assert limited.headers["retry-after-ms"] == "250" and limited.headers["retry-after"] == "1"
    assert_openai_error(post(fake, {"model": "m", "input": "x"}), 500, "server had an error")
    assert post(fake, {"model": "m", "input": "x"}).status_code == 200
    fake.poison("bad")
    assert_openai_error(post(fake, {"model": "m", "input": ["fine", "a bad one"]}), 400, "Invalid 'input'")
    assert post(fake, {"model": "m", "input": ["fine"]}).status_code == 200
    assert fake.requests == 5 and fake.inputs == ["x", "fine"]
    assert [c.status for c in fake.calls] == [429, 500, 200, 400, 200]
    fake.reset()
    assert (fake.requests, fake.inputs, fake.total_tokens, fake.calls) == (0, [], 0, [])
    assert post(fake, {"model": "m", "input": ["a bad one"]}).status_code == 200  # poison cleared


def test_delay_and_concurrent_recording(fake: FakeOpenAI) -> None:
    fake.delay(0.2)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: post(fake, {"model": "m", "input": [f"text {i}"]}).status_code,
                                 range(8)))
    elapsed = time.monotonic() - started
    fake.delay(0)
    assert statuses == [200] * 8
    assert 0.2 <= elapsed < 1.2  # delayed, yet served concurrently
    assert fake.requests == 8 and sorted(fake.inputs) == sorted(f"text {i}" for i in range(8))


def test_a_request_in_flight_across_reset_is_forgotten(fake: FakeOpenAI) -> None:
    fake.delay(0.3)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, fake, {"model": "m", "input": ["slow"]})
        deadline = time.monotonic() + 5
        while fake.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.reset()
        assert pending.result().status_code == 200
    assert (fake.requests, fake.inputs, fake.calls) == (0, [], [])
