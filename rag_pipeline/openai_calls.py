"""The retry loop of both OpenAI-compatible clients (embeddings, chat), around one call.

Worth another try: a timeout, a connection error, HTTP 408/409/429/5xx (but an exhausted quota),
after core/retrying's backoff or the server's Retry-After. Everything else is final, in the
client's own error type; a client first names the refusals it knows better (`refuse`).

Each client turns its transport's failures into the errors below. This module loads neither the
SDK nor an HTTP library: every batch run imports it, and `import openai` alone costs ~0.8 s of a
run's start-up.
"""

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Optional, TypeVar

from rag_pipeline.core.retrying import Backoff, is_retryable_status, parse_retry_after

T = TypeVar("T")


class StatusError(Exception):
    """An error answer: its HTTP status, the server's own words, and the error's code and param."""

    def __init__(self, status_code: int, reason: str, *, code: Optional[str] = None, param: Optional[str] = None,
                 headers: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(f"HTTP {status_code}: {reason}")
        self.status_code, self.reason, self.code, self.param = status_code, reason, code, param
        self.headers = headers or {}


class RequestTimedOut(Exception):
    """No answer within the client's timeout."""


class ConnectionFailed(Exception):
    """The server could not be reached, or the connection broke before an answer."""


class CallFailed(Exception):
    """Anything else the transport refused: final."""


Refusal = Callable[[StatusError, str], Optional[Exception]]


def _error_object(body: object) -> object:
    """What an error body says: `{"error": …}` unwrapped (the SDK hands over the inner one)."""
    return body.get("error", body) if isinstance(body, dict) else body


def error_reason(body: object, fallback: str) -> str:
    """The server's own words: an OpenAI error body's message, else the body, else `fallback`."""
    inner = _error_object(body)
    if isinstance(inner, dict) and inner.get("message"):
        return str(inner["message"])
    if isinstance(inner, str) and inner:     # `{"error": "model not found"}` (some compatible servers)
        return inner
    return str(body) if body else fallback


def error_field(body: object, name: str) -> Optional[str]:
    """`code` or `param` of an OpenAI error body, if it names one."""
    inner = _error_object(body)
    value = inner.get(name) if isinstance(inner, dict) else None
    return None if value is None else str(value)


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
            except StatusError as exc:
                status, reason = exc.status_code, exc.reason
                refused = refuse(exc, reason)
                if refused is not None:
                    raise refused from exc
                if status == 429 and exc.code == "insufficient_quota":
                    raise self.error(f"{what} refused: quota exhausted (HTTP 429 insufficient_quota): {reason}") from exc
                if not is_retryable_status(status):
                    raise self.error(f"{what} failed with HTTP {status}: {reason}") from exc
                error: Exception = exc
                description = f"HTTP {status}: {reason}"
                retry_after = parse_retry_after(exc.headers)
            except RequestTimedOut as exc:
                error, description = exc, f"timed out{f' ({self.timeout_hint})' if self.timeout_hint else ''}"
            except ConnectionFailed as exc:
                error, description = exc, f"connection error: {exc}"
            except CallFailed as exc:
                raise self.error(f"{what} failed: {exc}") from exc
            if retries >= self.max_retries:
                raise self.error(f"{what} gave up after {retries} retries{detail(tries)}: {description}") from error
            delay = self.backoff.delay(retries, retry_after, self.rng)
            self.log.warning("%s failed (%s); retry %d/%d in %.2fs", what, description, retries + 1,
                             self.max_retries, delay)
            self.sleep(delay)
            retries += 1
            tries.retries += 1
