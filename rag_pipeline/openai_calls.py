"""The retry loop of both OpenAI-compatible clients (embeddings, chat), around one SDK call.

Worth another try: a timeout, a connection error, HTTP 408/409/429/5xx (but an exhausted quota),
after core/retrying's backoff or the server's Retry-After. Everything else is final, in the
client's own error type; a client first names the refusals it knows better (`refuse`).
"""

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, TypeVar

import openai

from rag_pipeline.core.retrying import Backoff, is_retryable_status, parse_retry_after

T = TypeVar("T")
Refusal = Callable[[openai.APIStatusError, str], Optional[Exception]]


def error_reason(exc: openai.APIStatusError) -> str:
    """The server's own words: the error body's message, else the body, else the SDK's summary."""
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(body) if body else exc.message


@dataclass
class Tries:
    """Requests sent and retries made, across calls: a client's counters for its metadata."""

    requests: int = 0
    retries: int = 0


@dataclass
class Retrying:
    what: str                               # "embedding request": how messages name the call
    error: type[Exception]                  # the client's error type for final failures
    max_retries: int
    backoff: Backoff
    log: logging.Logger
    sleep: Callable[[float], None]
    rng: random.Random
    timeout_hint: str = ""                  # the setting that bounds a request, for its timeouts

    def call(self, request: Callable[[], T], *, tries: Tries, refuse: Refusal = lambda exc, reason: None,
             what: Optional[str] = None, detail: Callable[[Tries], str] = lambda tries: "") -> T:
        what = what or self.what
        retries = 0
        while True:
            tries.requests += 1
            retry_after: Optional[float] = None
            try:
                return request()
            except openai.APIStatusError as exc:
                status, reason = exc.status_code, error_reason(exc)
                refused = refuse(exc, reason)
                if refused is not None:
                    raise refused from exc
                if status == 429 and exc.code == "insufficient_quota":
                    raise self.error(f"{what} refused: quota exhausted (HTTP 429 insufficient_quota): {reason}") from exc
                if not is_retryable_status(status):
                    raise self.error(f"{what} failed with HTTP {status}: {reason}") from exc
                error: Exception = exc
                description = f"HTTP {status}: {reason}"
                retry_after = parse_retry_after(exc.response.headers)
            except openai.APITimeoutError as exc:
                error, description = exc, f"timed out{f' ({self.timeout_hint})' if self.timeout_hint else ''}"
            except openai.APIConnectionError as exc:
                error, description = exc, f"connection error: {exc.__cause__ or exc}"
            except openai.OpenAIError as exc:
                raise self.error(f"{what} failed: {exc}") from exc
            if retries >= self.max_retries:
                raise self.error(f"{what} gave up after {retries} retries{detail(tries)}: {description}") from error
            delay = self.backoff.delay(retries, retry_after, self.rng)
            self.log.warning("%s failed (%s); retry %d/%d in %.2fs", what, description, retries + 1,
                             self.max_retries, delay)
            self.sleep(delay)
            retries += 1
            tries.retries += 1
