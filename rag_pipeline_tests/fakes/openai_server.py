"""A loopback fake of OpenAI's /v1/embeddings and /v1/chat/completions that validates, fails and
bills like the real ones.

Tests talk to it through the official ``openai`` client over real HTTP (127.0.0.1, an
ephemeral port), so the whole path (auth header, base64 decoding, status codes, retry
headers) is exercised. Vectors are deterministic from the text (HashEmbedder), so a
search for "what is X" finds the chunk about X.

What it records, all thread-safe:
- ``requests``: every POST /v1/embeddings received, whatever its outcome;
- ``inputs``: the inputs of the requests answered 200, flattened in arrival order
  (what was really embedded and billed; a retried or rejected request adds nothing);
- ``total_tokens``: the usage billed over those requests;
- ``calls``: one ``FakeCall`` per request, with its status and inputs, for finer checks.

Chat completions (``/v1/chat/completions``, non-streaming): the same bearer check (401), OpenAI's
request validation and error bodies (400 for a missing or malformed ``messages``, an unknown role,
``max_tokens`` or a non-default ``temperature`` sent to a reasoning model, a prompt over the
context window; 404 for a model not in ``models``), the same injected faults (``fail_next(...,
endpoint="chat")``) and usage counted with cl100k_base. The reply is what the test scripted
(``script_chat``: strings, or functions of the messages), else ``default_chat_reply``, derived
deterministically from the prompt. ``chat_calls`` records each request with its messages.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rag_pipeline.core.tokens import count_tokens, encoding
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline_tests.servers import LoopbackServer

_INVALID_INPUT = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
_DEFAULT_POISON_MESSAGE = (
    "Invalid 'input': the input could not be processed. Please check the API reference: "
    "https://platform.openai.com/docs/api-reference."
)
_STATUS_ERRORS: dict[int, tuple[str, str, str | None]] = {
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


@dataclass
class FakeCall:
    """One request as the fake saw it."""

    status: int
    inputs: list[str]
    model: str | None = None
    dimensions: int | None = None
    encoding_format: str | None = None


@dataclass
class ChatCall:
    """One chat completions request as the fake saw it (``body`` is the whole JSON request)."""

    status: int
    model: str | None
    messages: list[dict[str, Any]]
    body: dict[str, Any]
    reply: str | None = None

    @property
    def prompt(self) -> str:
        """Every message's text, joined: what the sources and question were."""
        return "\n".join(_message_text(m) for m in self.messages if isinstance(m, dict))


ChatReplyScript = str | Callable[[list[dict[str, Any]]], str]


@dataclass
class _Fault:
    status: int
    retry_after: float | None
    message: str | None
    code: str | None
    endpoint: str | None = None  # "embeddings", "chat", or None for whichever comes first


@dataclass
class _State:
    requests: int = 0
    inputs: list[str] = field(default_factory=list)
    total_tokens: int = 0
    calls: list[FakeCall] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    poison: list[tuple[str, str]] = field(default_factory=list)
    delay_s: float = 0.0
    outage: int | None = None   # while set, every request answers this status
    flaky: tuple[float, tuple[int, ...], object] | None = None   # (rate, statuses, random.Random)
    chat_calls: list[ChatCall] = field(default_factory=list)
    chat_script: list[ChatReplyScript] = field(default_factory=list)


def _error(status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class FakeOpenAI:
    """``with FakeOpenAI(dimensions=64) as fake: OpenAI(base_url=fake.base_url, api_key="k")``."""

    def __init__(
        self,
        dimensions: int = 64,
        *,
        api_key: str | None = None,
        models: Iterable[str] | None = None,
        max_inputs: int = 2048,
        max_input_tokens: int = 8191,
        max_request_tokens: int = 300_000,
        chat_context_tokens: int = 128_000,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host   # another address only where hosts share no loopback (bench/multihost.py)
        self.dimensions = dimensions
        self.api_key = api_key  # None: any non-empty bearer token is accepted
        self.models = set(models) if models is not None else None
        self.max_inputs = max_inputs
        self.max_input_tokens = max_input_tokens
        self.max_request_tokens = max_request_tokens
        self.chat_context_tokens = chat_context_tokens
        self._completion_ids = itertools.count(1)
        self._hashers: dict[int, HashEmbedder] = {dimensions: HashEmbedder(dimensions)}
        self._lock = threading.Lock()
        self._state = _State()
        self._stopping = threading.Event()
        self._server: LoopbackServer | None = None
        self.port: int = 0
        self.app = self._build_app()

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        """Serve on `host` (127.0.0.1) with an ephemeral port, in a daemon thread; return once listening."""
        self._stopping.clear()
        self._server = LoopbackServer(self.app, lifespan="off", name="fake-openai", host=self.host)
        self._server.start()
        self.port = self._server.port

    def stop(self) -> None:
        """Stop serving; delayed requests in flight are woken up first."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop()
        self._server = None

    # -- fault injection ---------------------------------------------------------------

    def fail_next(self, n: int, status: int = 429, retry_after: float | None = None,
                  message: str | None = None, code: str | None = None, *, endpoint: str | None = None,
                  after: int = 0) -> None:
        """The next ``n`` authenticated requests get ``status`` (with Retry-After headers if given),
        once ``after`` more have been answered normally.

        ``endpoint`` ("embeddings" or "chat") limits the faults to that endpoint's requests."""
        if endpoint not in (None, "embeddings", "chat"):
            raise ValueError(f"unknown endpoint {endpoint!r}")
        with self._lock:
            self._state.faults.extend(_Fault(0, None, None, None, endpoint) for _ in range(after))
            self._state.faults.extend(_Fault(status, retry_after, message, code, endpoint) for _ in range(n))

    def outage(self, status: int = 503) -> None:
        """Every authenticated request answers ``status`` until ``recover()``: the API down."""
        with self._lock:
            self._state.outage = status

    def recover(self) -> None:
        with self._lock:
            self._state.outage = None

    def flaky(self, rate: float, statuses: tuple[int, ...] = (429, 500), seed: int = 0) -> None:
        """Each request fails with one of ``statuses`` with probability ``rate`` (0 turns it off)."""
        import random

        with self._lock:
            self._state.flaky = (rate, statuses, random.Random(seed)) if rate > 0 else None

    def script_chat(self, *replies: ChatReplyScript) -> None:
        """The next chat completions answer these, in order: a string, or a function of the messages
        (called in the server thread, before the reply is sent). Then ``default_chat_reply`` again."""
        with self._lock:
            self._state.chat_script.extend(replies)

    def poison(self, substring: str, message: str = _DEFAULT_POISON_MESSAGE) -> None:
        """Any request holding an input that contains ``substring`` is refused with a 400, as a whole."""
        with self._lock:
            self._state.poison.append((substring, message))

    def delay(self, seconds: float) -> None:
        """Answer every request only after ``seconds`` (for timeout tests)."""
        with self._lock:
            self._state.delay_s = seconds

    def reset(self) -> None:
        """Forget recorded requests and every injected fault."""
        with self._lock:
            self._state = _State()

    # -- what was seen -----------------------------------------------------------------

    @property
    def requests(self) -> int:
        with self._lock:
            return self._state.requests

    @property
    def inputs(self) -> list[str]:
        with self._lock:
            return list(self._state.inputs)

    @property
    def total_tokens(self) -> int:
        with self._lock:
            return self._state.total_tokens

    @property
    def calls(self) -> list[FakeCall]:
        with self._lock:
            return list(self._state.calls)

    @property
    def chat_calls(self) -> list[ChatCall]:
        with self._lock:
            return list(self._state.chat_calls)

    def vector(self, text: str, dimensions: int | None = None) -> list[float]:
        """The vector the fake returns for ``text``, at the native or the requested size.

        A shortened size is hashed directly (not cut from the full vector as v3 models do):
        a short text's few features could all fall past the cut and leave a zero vector.
        """
        size = dimensions or self.dimensions
        with self._lock:
            hasher = self._hashers.get(size)
            if hasher is None:
                hasher = self._hashers[size] = HashEmbedder(size)
        return hasher.vector(text)

    # -- the API -----------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="fake OpenAI embeddings")

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> JSONResponse:
            body = await request.body()
            auth = request.headers.get("authorization", "")
            # Token counting and the injected delay run off the event loop, like real concurrency.
            return await anyio.to_thread.run_sync(self._handle, auth, body)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> JSONResponse:
            body = await request.body()
            auth = request.headers.get("authorization", "")
            return await anyio.to_thread.run_sync(self._handle, auth, body, "chat")

        return app

    def _record(self, state: _State, status: int, inputs: list[str], **extra: Any) -> None:
        with self._lock:
            state.calls.append(FakeCall(status=status, inputs=inputs, **extra))

    def _handle(self, auth: str, raw: bytes, endpoint: str = "embeddings") -> JSONResponse:
        # A request belongs to the state it arrived under: one still in flight across a
        # reset() records into the forgotten state, never into the next test's.
        with self._lock:
            state = self._state
            state.requests += 1
            delay_s = state.delay_s
        record = self._record if endpoint == "embeddings" else self._record_chat
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            record(state, 401, [])
            return _error(401, "You didn't provide an API key. You need to provide your API key in an "
                               "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        if self.api_key is not None and token.strip() != self.api_key:
            record(state, 401, [])
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
        if delay_s > 0:
            self._stopping.wait(delay_s)
        with self._lock:
            fault = next((f for f in state.faults if f.endpoint in (None, endpoint)), None)
            if fault is not None:
                state.faults.remove(fault)
            elif state.outage is not None:
                fault = _Fault(state.outage, None, None, None)
            elif state.flaky is not None and state.flaky[2].random() < state.flaky[0]:
                fault = _Fault(state.flaky[2].choice(state.flaky[1]), None, None, None)
        if fault is not None and fault.status == 0:
            fault = None   # a request let through before the faults begin (fail_next's `after`)
        if fault is not None:
            record(state, fault.status, [])
            message, type_, code = _STATUS_ERRORS.get(fault.status, (f"HTTP {fault.status}", "server_error", None))
            headers: dict[str, str] = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(int(round(fault.retry_after * 1000)))
                headers["retry-after"] = str(max(0, math.ceil(fault.retry_after)))
            return _error(fault.status, fault.message or message, type_=type_, code=fault.code or code,
                          headers=headers)
        if endpoint == "chat":
            return self._chat(state, raw)
        return self._embeddings(state, raw)

    def _embeddings(self, state: _State, raw: bytes) -> JSONResponse:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self._record(state, 400, [])
            return _error(400, "We could not parse the JSON body of your request. (HINT: This likely means "
                               "you aren't using your HTTP library correctly.)")
        if not isinstance(body, dict):
            self._record(state, 400, [])
            return _error(400, "The request body must be a JSON object.")
        model = body.get("model")
        dims = body.get("dimensions")
        fmt = body.get("encoding_format")
        extra = {"model": model, "dimensions": dims, "encoding_format": fmt}

        raw_input = body.get("input")
        if isinstance(raw_input, str):
            inputs = [raw_input]
        elif isinstance(raw_input, list) and all(isinstance(x, str) for x in raw_input):
            inputs = list(raw_input)
        else:
            # Token-array inputs are valid for OpenAI but never sent by this project.
            self._record(state, 400, [], **extra)
            return _error(400, _INVALID_INPUT)

        def reject(message: str, *, param: str | None = None, code: str | None = None,
                   status: int = 400) -> JSONResponse:
            self._record(state, status, inputs, **extra)
            return _error(status, message, param=param, code=code)

        if not isinstance(model, str) or not model:
            return reject("you must provide a model parameter")
        if self.models is not None and model not in self.models:
            return reject(f"The model `{model}` does not exist or you do not have access to it.",
                          code="model_not_found", status=404)
        if fmt not in (None, "float", "base64"):
            return reject(f"Invalid value for 'encoding_format': {fmt!r}. Supported values are: 'float' and "
                          "'base64'.", param="encoding_format")
        if dims is not None:
            if not model.startswith("text-embedding-3"):
                return reject("This model does not support specifying dimensions.", param="dimensions")
            if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= self.dimensions:
                return reject(f"Invalid value for 'dimensions' = {dims}. Must be between 1 and "
                              f"{self.dimensions}.", param="dimensions")
        if not inputs:
            return reject(_INVALID_INPUT)
        if len(inputs) > self.max_inputs:
            return reject(f"'$.input' is invalid: at most {self.max_inputs} inputs per request, got "
                          f"{len(inputs)}.", param="input")
        if any(not text for text in inputs):
            return reject(_INVALID_INPUT)
        counts = [count_tokens(text) for text in inputs]
        for n in counts:
            if n > self.max_input_tokens:
                return reject(f"This model's maximum context length is {self.max_input_tokens} tokens, however "
                              f"you requested {n} tokens ({n} in your prompt; 0 for the completion). Please "
                              "reduce your prompt; or completion length.")
        total = sum(counts)
        if total > self.max_request_tokens:
            return reject(f"Requested {total} tokens, max {self.max_request_tokens} tokens per request",
                          code="max_tokens_per_request")
        with self._lock:
            poison = list(state.poison)
        for substring, message in poison:
            if any(substring in text for text in inputs):
                return reject(message)

        data = []
        for i, text in enumerate(inputs):
            vector = self.vector(text, dims)
            embedding: Any = vector
            if fmt == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        with self._lock:
            state.inputs.extend(inputs)
            state.total_tokens += total
            state.calls.append(FakeCall(status=200, inputs=inputs, **extra))
        return JSONResponse({
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        })

    def _chat(self, state: _State, raw: bytes) -> JSONResponse:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self._record_chat(state, 400, [])
            return _error(400, "We could not parse the JSON body of your request. (HINT: This likely means "
                               "you aren't using your HTTP library correctly.)")
        if not isinstance(body, dict):
            self._record_chat(state, 400, [])
            return _error(400, "The request body must be a JSON object.")
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        refused = _chat_validate(body, self.models, self.chat_context_tokens)
        if refused is not None:
            self._record_chat(state, refused.status_code, messages, body)
            return refused
        with self._lock:
            script = state.chat_script.pop(0) if state.chat_script else default_chat_reply
        content = script if isinstance(script, str) else script(messages)
        finish_reason = "stop"
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and count_tokens(content) > limit:
            content = encoding().decode(encoding().encode_ordinary(content)[:limit])
            finish_reason = "length"
        prompt_tokens = _chat_prompt_tokens(messages)
        completion_tokens = count_tokens(content)
        self._record_chat(state, 200, messages, body, reply=content)
        return JSONResponse({
            "id": f"chatcmpl-fake{next(self._completion_ids):08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": finish_reason,
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            },
            "service_tier": "default",
            "system_fingerprint": None,
        })


    def _record_chat(self, state: _State, status: int, messages: list[dict[str, Any]],
                     body: dict[str, Any] | None = None, *, reply: str | None = None) -> None:
        body = body or {}
        model = body.get("model") if isinstance(body.get("model"), str) else None
        with self._lock:
            state.chat_calls.append(ChatCall(status=status, model=model, messages=list(messages), body=body,
                                             reply=reply))


# -- chat completions ------------------------------------------------------------------------

_CHAT_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# Reasoning models: `max_tokens` and a non-default `temperature` are refused, as OpenAI does.
_REASONING_PREFIXES = ("gpt-5", "gpt-6", "o1", "o3", "o4")
_SOURCE_HEADER = re.compile(r"^\[(\d+)\] (\S+)$", re.MULTILINE)
_WORDS = re.compile(r"\w+")


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def default_chat_reply(messages: list[dict[str, Any]]) -> str:
    """A deterministic answer from the prompt: the source sharing most words with the question,
    its first sentence, cited by its number; or that the sources do not answer."""
    prompt = "\n".join(_message_text(m) for m in messages if m.get("role") == "user")
    question = prompt.rsplit("Question:", 1)[-1].split("\n\n", 1)[0]
    asked = {w.lower() for w in _WORDS.findall(question) if len(w) > 3}
    best: tuple[int, int, str] | None = None
    for match in _SOURCE_HEADER.finditer(prompt):
        number = int(match.group(1))
        body = prompt[match.end():].split("</source>", 1)[0].strip()
        overlap = len(asked & {w.lower() for w in _WORDS.findall(body)})
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, number, body)
    if best is None:
        return "The sources do not answer the question."
    sentence = re.split(r"(?<=[.!?])\s", " ".join(best[2].split()), maxsplit=1)[0]
    return f"{sentence} [{best[1]}]"


def _chat_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    # OpenAI's accounting for chat: ~3 tokens of framing per message, 3 to prime the reply.
    return sum(3 + count_tokens(_message_text(m)) + count_tokens(str(m.get("role", ""))) for m in messages) + 3


def _chat_validate(body: dict[str, Any], models: set[str] | None, context_tokens: int) -> JSONResponse | None:
    model = body.get("model")
    if "model" not in body:
        return _error(400, "you must provide a model parameter")
    if not isinstance(model, str) or not model:
        return _error(400, f"Invalid type for 'model': expected a string, but got {type(model).__name__} instead.",
                      param="model", code="invalid_type")
    if "messages" not in body:
        return _error(400, "Missing required parameter: 'messages'.", param="messages",
                      code="missing_required_parameter")
    messages = body["messages"]
    if not isinstance(messages, list):
        return _error(400, "Invalid type for 'messages': expected an array of objects.", param="messages",
                      code="invalid_type")
    if not messages:
        return _error(400, "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
                           "empty array instead.", param="messages", code="empty_array")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return _error(400, f"Invalid type for 'messages[{i}]': expected an object.", param=f"messages[{i}]",
                          code="invalid_type")
        role = message.get("role")
        if role is None:
            return _error(400, f"Missing required parameter: 'messages[{i}].role'.", param=f"messages[{i}].role",
                          code="missing_required_parameter")
        if role not in _CHAT_ROLES:
            return _error(400, f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                               "'function', 'tool', and 'developer'.", param=f"messages[{i}].role",
                          code="invalid_value")
        if "content" not in message and role != "assistant":
            return _error(400, f"Missing required parameter: 'messages[{i}].content'.",
                          param=f"messages[{i}].content", code="missing_required_parameter")
        if not isinstance(message.get("content"), (str, list, type(None))):
            return _error(400, f"Invalid type for 'messages[{i}].content': expected one of a string or array of "
                               "objects.", param=f"messages[{i}].content", code="invalid_type")
    if models is not None and model not in models:
        return _error(404, f"The model `{model}` does not exist or you do not have access to it.",
                      code="model_not_found")
    if body.get("stream"):
        return _error(400, "The fake does not stream.", param="stream", code="unsupported_value")
    if model.startswith(_REASONING_PREFIXES):
        if body.get("max_tokens") is not None:
            return _error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                               "'max_completion_tokens' instead.", param="max_tokens", code="unsupported_parameter")
        temperature = body.get("temperature")
        if temperature is not None and temperature != 1:
            return _error(400, f"Unsupported value: 'temperature' does not support {temperature} with this model. "
                               "Only the default (1) value is supported.", param="temperature",
                          code="unsupported_value")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return _error(400, f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got "
                           f"{limit} instead.", param=name, code="integer_below_min_value")
    prompt_tokens = _chat_prompt_tokens(messages)
    if prompt_tokens > context_tokens:
        return _error(400, f"This model's maximum context length is {context_tokens} tokens. However, your "
                           f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the "
                           "messages.", param="messages", code="context_length_exceeded")
    return None
