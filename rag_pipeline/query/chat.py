"""An OpenAI-compatible chat completions client for answers, with the retries decided here.

Configured like the embedder (rag_pipeline/embedders/openai_embedder.py): the official client
with its own retries off, so one place decides what is retried and how long to wait. 408, 409,
429 and 5xx answers, timeouts and connection errors are retried with exponential backoff and full
jitter, or after the server's Retry-After; a 429 for an exhausted quota, and 400/401/403/404, fail
at once with a message that says what to change. Nothing is streamed: the reply is parsed once whole.

Only what every compatible server accepts is sent (`model`, `messages`, and
`max_completion_tokens` when asked for): reasoning models refuse `temperature` and `max_tokens`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from rag_pipeline.core.retrying import Backoff, is_retryable_status, parse_retry_after

log = logging.getLogger(__name__)


class ChatError(RuntimeError):
    """No usable reply; the message says why and, where it can, what to set."""


@dataclass(frozen=True)
class ChatReply:
    content: str
    model: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    requests: int
    retries: int

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


def _is_retryable_status(status: int) -> bool:
    return status in (408, 409, 429) or status >= 500


def _reason(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(body) if body else exc.message


class OpenAIChat:
    """`complete(messages)` against /v1/chat/completions, retried and counted here."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        max_output_tokens: int | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 20.0,
        retry_after_max_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not api_key:
            raise ChatError("the chat endpoint needs an API key (ANSWER_API_KEY or OPENAI_API_KEY)")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.model = model
        self.base_url = base_url
        self.max_retries = max_retries
        self.max_output_tokens = max_output_tokens
        self.backoff = Backoff(backoff_base_s, backoff_max_s, retry_after_max_s)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict[str, str]]) -> ChatReply:
        """The model's reply to ``messages``, or ChatError once retries are spent or on a refusal."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.max_output_tokens is not None:
            kwargs["max_completion_tokens"] = self.max_output_tokens
        where = self.base_url or "the OpenAI API"
        requests = retries = 0
        while True:
            requests += 1
            retry_after: float | None = None
            try:
                response = self._client.chat.completions.create(**kwargs)
                return self._parse(response, requests, retries)
            except openai.APIStatusError as exc:
                status, reason = exc.status_code, _reason(exc)
                if status in (401, 403):
                    raise ChatError(
                        f"the chat endpoint at {where} refused the API key (HTTP {status}): {reason}; "
                        "check ANSWER_API_KEY (or OPENAI_API_KEY, which it falls back to)"
                    ) from exc
                if status == 404:
                    raise ChatError(
                        f"the chat endpoint at {where} answered 404 for model {self.model!r}: {reason}; "
                        "check ANSWER_MODEL and ANSWER_BASE_URL"
                    ) from exc
                if status == 400:
                    param = f", param {exc.param!r}" if exc.param else ""
                    raise ChatError(f"the chat request was refused (HTTP 400{param}): {reason}") from exc
                if status == 429 and exc.code == "insufficient_quota":
                    raise ChatError(f"chat quota exhausted (HTTP 429 insufficient_quota): {reason}") from exc
                if not is_retryable_status(status):
                    raise ChatError(f"the chat request failed with HTTP {status}: {reason}") from exc
                error: Exception = exc
                description = f"HTTP {status}: {reason}"
                retry_after = parse_retry_after(exc.response.headers)
            except openai.APITimeoutError as exc:
                error, description = exc, "timed out (ANSWER_TIMEOUT_S)"
            except openai.APIConnectionError as exc:
                error, description = exc, f"connection error: {exc.__cause__ or exc}"
            except openai.OpenAIError as exc:
                raise ChatError(f"the chat request failed: {exc}") from exc
            if retries >= self.max_retries:
                raise ChatError(
                    f"the chat request to {where} gave up after {retries} retries: {description}"
                ) from error
            delay = self.backoff.delay(retries, retry_after, self._rng)
            log.warning("chat request failed (%s); retry %d/%d in %.2fs",
                        description, retries + 1, self.max_retries, delay)
            self._sleep(delay)
            retries += 1

    def _parse(self, response: Any, requests: int, retries: int) -> ChatReply:
        choices = list(getattr(response, "choices", None) or [])
        if not choices:
            raise ChatError("the chat endpoint returned no choices")
        choice = choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise ChatError(f"the model declined to answer: {refusal}")
        content = (message.content or "").strip()
        if not content:
            if choice.finish_reason == "length":
                raise ChatError("the model ran out of output tokens before answering: raise "
                                "ANSWER_MAX_OUTPUT_TOKENS (reasoning models spend some before they write)")
            raise ChatError(f"the chat endpoint returned an empty reply (finish_reason {choice.finish_reason!r})")
        usage = getattr(response, "usage", None)

        def figure(name: str) -> int | None:
            value = getattr(usage, name, None) if usage is not None else None
            return value if isinstance(value, int) else None

        return ChatReply(
            content=content,
            model=getattr(response, "model", None) or self.model,
            finish_reason=choice.finish_reason,
            prompt_tokens=figure("prompt_tokens"),
            completion_tokens=figure("completion_tokens"),
            total_tokens=figure("total_tokens"),
            requests=requests,
            retries=retries,
        )
