"""W3C datetimes as sitemaps write them (`2024`, `2024-05`, … `2024-05-01T10:00:00.5+02:00`), read
leniently: a bad lastmod loses the hint, never the URL."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

MAX_LASTMOD_CHARS = 64
_W3C_DATETIME = re.compile(
    r"([0-9]{4})(?:-([0-9]{2})(?:-([0-9]{2})"
    r"(?:[Tt]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?"
    r"([Zz]|[+-][0-9]{2}:?[0-9]{2})?)?)?)?"
)


def _parse_tzd(tzd: str | None) -> timezone:
    if tzd is None or tzd in "Zz":
        return timezone.utc  # A missing zone is common in the wild; UTC is the usual intent.
    digits = tzd[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if minutes > 59:
        raise ValueError("bad offset")
    offset = timedelta(hours=hours, minutes=minutes)
    return timezone(-offset if tzd[0] == "-" else offset)


def parse_lastmod(text: str) -> datetime | None:
    """Lenient on purpose: a bad lastmod loses the hint, never the URL."""
    text = text.strip()
    match = _W3C_DATETIME.fullmatch(text) if len(text) <= MAX_LASTMOD_CHARS else None
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, tzd = match.groups()
    try:
        value = datetime(
            int(year),
            int(month or 1),
            int(day or 1),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            int((fraction or "")[:6].ljust(6, "0")),
            tzinfo=_parse_tzd(tzd),
        )
        return value.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # A field out of range, or the zone crosses year 1/9999.
        return None
