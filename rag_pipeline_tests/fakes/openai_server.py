"""A loopback fake of OpenAI's /v1/embeddings that validates, fails and bills like the real one.

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
"""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rag_pipeline.core.tokens import count_tokens
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
class _Fault:
    status: int
    retry_after: float | None
    message: str | None
    code: str | None


@dataclass
class _State:
    requests: int = 0
    inputs: list[str] = field(default_factory=list)
    total_tokens: int = 0
    calls: list[FakeCall] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    poison: list[tuple[str, str]] = field(default_factory=list)
    delay_s: float = 0.0


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
    ) -> None:
        self.dimensions = dimensions
        self.api_key = api_key  # None: any non-empty bearer token is accepted
        self.models = set(models) if models is not None else None
        self.max_inputs = max_inputs
        self.max_input_tokens = max_input_tokens
        self.max_request_tokens = max_request_tokens
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
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Serve on 127.0.0.1 with an ephemeral port, in a daemon thread; return once listening."""
        self._stopping.clear()
        self._server = LoopbackServer(self.app, lifespan="off", name="fake-openai")
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
                  message: str | None = None, code: str | None = None) -> None:
        """The next ``n`` authenticated requests get ``status`` (with Retry-After headers if given)."""
        with self._lock:
            self._state.faults.extend(_Fault(status, retry_after, message, code) for _ in range(n))

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

        return app

    def _record(self, state: _State, status: int, inputs: list[str], **extra: Any) -> None:
        with self._lock:
            state.calls.append(FakeCall(status=status, inputs=inputs, **extra))

    def _handle(self, auth: str, raw: bytes) -> JSONResponse:
        # A request belongs to the state it arrived under: one still in flight across a
        # reset() records into the forgotten state, never into the next test's.
        with self._lock:
            state = self._state
            state.requests += 1
            delay_s = state.delay_s
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self._record(state, 401, [])
            return _error(401, "You didn't provide an API key. You need to provide your API key in an "
                               "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        if self.api_key is not None and token.strip() != self.api_key:
            self._record(state, 401, [])
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
        if delay_s > 0:
            self._stopping.wait(delay_s)
        with self._lock:
            fault = state.faults.pop(0) if state.faults else None
        if fault is not None:
            self._record(state, fault.status, [])
            message, type_, code = _STATUS_ERRORS.get(fault.status, (f"HTTP {fault.status}", "server_error", None))
            headers: dict[str, str] = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(int(round(fault.retry_after * 1000)))
                headers["retry-after"] = str(max(0, math.ceil(fault.retry_after)))
            return _error(fault.status, fault.message or message, type_=type_, code=fault.code or code,
                          headers=headers)
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
