"""What a crawler delivery means for the index, decided from its two status codes."""

from __future__ import annotations

import re
from enum import StrEnum

__all__ = ["Verdict", "parse_status", "classify"]

_DIGITS = re.compile(r"[0-9]+")


class Verdict(StrEnum):
    CONTENT = "content"
    TOMBSTONE = "tombstone"
    SKIP = "skip"


def parse_status(value: str | None) -> int | None:
    """Header values arrive repeated or comma-joined by proxies; a garbled one must not pass as a status."""
    if value is None or not value.strip():
        return None
    statuses: list[int] = []
    for part in value.split(","):
        part = part.strip()
        # Only ASCII digits: int() would also accept "+200", "2_00" or non-Latin digits.
        if not _DIGITS.fullmatch(part):
            raise ValueError(f"status header {value!r} is not a (comma-separated) list of integers")
        status = int(part)
        if not 100 <= status <= 999:
            raise ValueError(f"status {status} in header {value!r} is outside 100..999")
        statuses.append(status)
    return statuses[0]


def classify(crawler_status: int | None, original_status: int | None) -> Verdict:
    """Only a successful crawl may change the index, and only a real 404/410 may delete."""
    if crawler_status != 200:
        # A crawler 404 or 5xx means the crawl failed, not that the page is gone.
        return Verdict.SKIP
    if original_status is None:
        return Verdict.SKIP
    if original_status == 304:
        # Not Modified carries no body: nothing to index, and no proof of change.
        return Verdict.SKIP
    if 200 <= original_status <= 399:
        # 3xx: the crawler followed the redirect and the body is the final page.
        return Verdict.CONTENT
    if original_status in (404, 410):
        return Verdict.TOMBSTONE
    return Verdict.SKIP
