"""One retry policy for every outbound call (embeddings, chat, crawler pushes, deliveries):
exponential backoff with full jitter, the server's Retry-After honoured (capped) when it sends one,
and the same statuses worth another try. Pure: the clients own their loops and their clocks."""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass


def is_retryable_status(status: int) -> bool:
    """Worth another try: 0 (unreachable), timeouts, lock conflicts, rate limits, server errors (the
    set the official OpenAI client retries). Any other answer is the server's final word."""
    return status == 0 or status in (408, 409, 429) or status >= 500


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.5
    cap_s: float = 30.0
    retry_after_cap_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds before retry ``attempt`` (0-based): the server's Retry-After when given (capped),
        else a uniform draw in [0, min(cap, base·2^attempt)] (full jitter: clients that failed
        together do not come back together)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap_s)
        return (rng or random).uniform(0.0, min(self.cap_s, self.base_s * (2.0 ** attempt)))


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, else `retry-after` (seconds or HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# A site reading that met a problem (a sitemap down, robots.txt unreachable) is tried again this
# soon, doubling with each such reading in a row up to an hour, and never later than the site's own
# cadence: a passing fault must not leave a daily site unread, and unlisted pages unjudged, for a day.
READING_RETRY_FIRST_S = 120.0
READING_RETRY_CAP_S = 3600.0


def reading_retry_s(every_s: float, failures: int) -> float:
    """Seconds until the next reading after `failures` incomplete readings in a row (≥ 1)."""
    return min(every_s, READING_RETRY_CAP_S, READING_RETRY_FIRST_S * 2.0 ** max(0, failures - 1))
