"""The chat client of `ask` against the loopback fake: what it sends, what it retries, what it refuses.

The fake's chat endpoint is held to OpenAI's behaviour here too, or the client tests prove nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rag_pipeline.query.chat import ChatError, OpenAIChat
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI, default_chat_reply

KEY = "sk-chat"
MODEL = "gpt-5.6-luna"
MESSAGES = [{"role": "system", "content": "Answer from the sources."},
            {"role": "user", "content": "Sources:\n\n<source id=\"1\">\n[1] https://a.example/\nAlpha rotates "
                                        "tokens daily.\n</source>\n\nQuestion: how often do tokens rotate?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(dimensions=16, api_key=KEY, models={MODEL, "llama-3"}, chat_context_tokens=2000) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeOpenAI) -> FakeOpenAI:
    server.reset()
    return server


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client(fake: FakeOpenAI, sleeps: Sleeps | None = None, *, model: str = MODEL, **kwargs) -> OpenAIChat:
    """A client of the fake that records its backoff sleeps instead of sleeping."""
    options = {"api_key": KEY, "base_url": fake.base_url, "max_retries": 3, **kwargs}
    return OpenAIChat(model, sleep=Sleeps() if sleeps is None else sleeps, **options)


def post(fake: FakeOpenAI, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{fake.base_url}/chat/completions", json=body, headers=headers, timeout=10)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# -- the client -------------------------------------------------------------------------------


def test_a_reply_with_its_usage_and_a_request_every_model_accepts(fake):
    reply = client(fake).complete(MESSAGES)
    assert reply.content == default_chat_reply(MESSAGES) == "Alpha rotates tokens daily. [1]"
    assert reply.model == MODEL and reply.finish_reason == "stop"
    assert reply.prompt_tokens > 20 and reply.completion_tokens > 3
    assert reply.total_tokens == reply.prompt_tokens + reply.completion_tokens
    assert (reply.requests, reply.retries) == (1, 0)
    (call,) = fake.chat_calls
    assert call.status == 200 and call.messages == MESSAGES
    # Reasoning models refuse these: they are never sent.
    assert not {"temperature", "max_tokens", "stream"} & set(call.body)
    assert "max_completion_tokens" not in call.body


def test_max_output_tokens_is_sent_as_max_completion_tokens(fake):
    fake.script_chat("word " * 200)
    reply = client(fake, max_output_tokens=20).complete(MESSAGES)
    assert fake.chat_calls[0].body["max_completion_tokens"] == 20
    assert reply.finish_reason == "length" and reply.completion_tokens == 20


def test_429_with_retry_after_then_success(fake):
    fake.fail_next(1, 429, retry_after=0.25, endpoint="chat")
    sleeps = Sleeps()
    reply = client(fake, sleeps).complete(MESSAGES)
    assert sleeps == [0.25]
    assert (reply.requests, reply.retries) == (2, 1)
    assert [c.status for c in fake.chat_calls] == [429, 200]


def test_5xx_are_retried_with_bounded_jittered_backoff(fake):
    fake.fail_next(1, 500, endpoint="chat")
    fake.fail_next(1, 503, endpoint="chat")
    sleeps = Sleeps()
    reply = client(fake, sleeps, backoff_base_s=0.5).complete(MESSAGES)
    assert reply.retries == 2 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0
    assert [c.status for c in fake.chat_calls] == [500, 503, 200]


def test_retries_are_bounded(fake):
    fake.fail_next(5, 502, endpoint="chat")
    sleeps = Sleeps()
    with pytest.raises(ChatError, match=r"gave up after 2 retries: HTTP 502"):
        client(fake, sleeps, max_retries=2).complete(MESSAGES)
    assert len(fake.chat_calls) == 3 and len(sleeps) == 2


def test_faults_for_embeddings_do_not_touch_chat(fake):
    fake.fail_next(1, 429, endpoint="embeddings")
    assert client(fake).complete(MESSAGES).retries == 0


def test_a_timeout_is_retried_then_given_up(fake):
    fake.delay(0.6)
    with pytest.raises(ChatError, match="gave up after 1 retries: timed out"):
        client(fake, timeout_s=0.2, max_retries=1).complete(MESSAGES)


def test_401_fails_at_once_and_says_which_key(fake):
    sleeps = Sleeps()
    with pytest.raises(ChatError) as raised:
        client(fake, sleeps, api_key="sk-wrong").complete(MESSAGES)
    message = str(raised.value)
    assert "HTTP 401" in message and "Incorrect API key" in message and "ANSWER_API_KEY" in message
    assert sleeps == [] and [c.status for c in fake.chat_calls] == [401]


def test_400_fails_at_once_with_the_servers_reason(fake):
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(ChatError, match=r"HTTP 400, param 'messages'\): This model's maximum context length"):
        client(fake).complete(long)
    assert [c.status for c in fake.chat_calls] == [400]


def test_an_unknown_model_says_to_check_answer_model(fake):
    with pytest.raises(ChatError, match="404 for model 'gpt-nope'.*ANSWER_MODEL"):
        client(fake, model="gpt-nope").complete(MESSAGES)
    assert len(fake.chat_calls) == 1


def test_an_exhausted_quota_is_not_retried(fake):
    fake.fail_next(1, 429, code="insufficient_quota", message="You exceeded your current quota.", endpoint="chat")
    with pytest.raises(ChatError, match="quota exhausted"):
        client(fake).complete(MESSAGES)
    assert len(fake.chat_calls) == 1


def test_an_empty_reply_is_an_error(fake):
    fake.script_chat("   ")
    with pytest.raises(ChatError, match="empty reply"):
        client(fake).complete(MESSAGES)


def test_no_key_is_refused_before_any_request():
    with pytest.raises(ChatError, match="ANSWER_API_KEY or OPENAI_API_KEY"):
        OpenAIChat(MODEL, api_key="")


# -- the fake behaves like the API -------------------------------------------------------------


def test_fake_requires_a_valid_bearer_token(fake):
    assert "API key" in error_of(post(fake, {"model": MODEL, "messages": MESSAGES}, key=None), 401)["message"]
    assert error_of(post(fake, {"model": MODEL, "messages": MESSAGES}, key="sk-bad"), 401)["code"] == "invalid_api_key"


@pytest.mark.parametrize("body, param, code", [
    ({"model": MODEL}, "messages", "missing_required_parameter"),
    ({"model": MODEL, "messages": []}, "messages", "empty_array"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 50}, "max_tokens", "unsupported_parameter"),
    ({"model": MODEL, "messages": MESSAGES, "temperature": 0.2}, "temperature", "unsupported_value"),
    ({"model": MODEL, "messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens",
     "integer_below_min_value"),
])
def test_fake_validates_like_openai(fake, body, param, code):
    error = error_of(post(fake, body), 400)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert fake.chat_calls[-1].status == 400


def test_fake_accepts_max_tokens_and_temperature_from_non_reasoning_models(fake):
    response = post(fake, {"model": "llama-3", "messages": MESSAGES, "max_tokens": 50, "temperature": 0.2})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_fake_scripts_replies_in_order_then_falls_back_to_the_default(fake):
    fake.script_chat("first [1]", lambda messages: f"{len(messages)} messages")
    replies = [post(fake, {"model": MODEL, "messages": MESSAGES}).json()["choices"][0]["message"]["content"]
               for _ in range(3)]
    assert replies == ["first [1]", "2 messages", default_chat_reply(MESSAGES)]
    assert default_chat_reply([{"role": "user", "content": "Question: anything?"}]) == (
        "The sources do not answer the question.")
