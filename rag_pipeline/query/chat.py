"""An OpenAI-compatible chat completions client for answers, with the retries decided here.

The official client with its own retries off, its failures turned into those of the retry loop
the embedder shares (rag_pipeline/openai_calls.py), which decides what is retried and how long to
wait; 400, 401, 403 and 404 fail at once with a message that says what to change. Nothing is
streamed: the reply is parsed once whole.

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

from rag_pipeline.core.retrying import Backoff
from rag_pipeline.openai_calls import (CallFailed, ConnectionFailed, RequestTimedOut, Retrying, StatusError, Tries,
                                       error_reason)

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


def _sdk_call(call: Callable[[], Any]) -> Any:
    """One SDK call, its failures as the retry loop's."""
    try:
        return call()
    except openai.APIStatusError as exc:
        raise StatusError(exc.status_code, error_reason(exc.body, exc.message), code=exc.code, param=exc.param,
                          headers=exc.response.headers) from exc
    except openai.APITimeoutError as exc:      # before its base class, APIConnectionError
        raise RequestTimedOut() from exc
    except openai.APIConnectionError as exc:
        raise ConnectionFailed(str(exc.__cause__ or exc)) from exc
    except openai.OpenAIError as exc:
        raise CallFailed(str(exc)) from exc


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
        self.max_output_tokens = max_output_tokens
        self.retrying = Retrying("the chat request", ChatError, max_retries,
                                 Backoff(backoff_base_s, backoff_max_s, retry_after_max_s), log, sleep,
                                 rng or random.Random(), timeout_hint="ANSWER_TIMEOUT_S")
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict[str, str]]) -> ChatReply:
        """The model's reply to ``messages``, or ChatError once retries are spent or on a refusal."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.max_output_tokens is not None:
            kwargs["max_completion_tokens"] = self.max_output_tokens
        where = self.base_url or "the OpenAI API"

        def refuse(exc: StatusError, reason: str) -> Exception | None:
            status = exc.status_code
            if status in (401, 403):
                return ChatError(f"the chat endpoint at {where} refused the API key (HTTP {status}): {reason}; "
                                 "check ANSWER_API_KEY (or OPENAI_API_KEY, which it falls back to)")
            if status == 404:
                return ChatError(f"the chat endpoint at {where} answered 404 for model {self.model!r}: {reason}; "
                                 "check ANSWER_MODEL and ANSWER_BASE_URL")
            if status == 400:
                param = f", param {exc.param!r}" if exc.param else ""
                return ChatError(f"the chat request was refused (HTTP 400{param}): {reason}")
            return None

        tries = Tries()
        response = self.retrying.call(lambda: _sdk_call(lambda: self._client.chat.completions.create(**kwargs)),
                                      tries=tries,
                                      refuse=refuse, what=f"the chat request to {where}")
        return self._parse(response, tries.requests, tries.retries)

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
