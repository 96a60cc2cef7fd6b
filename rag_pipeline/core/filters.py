"""Search filters as a person types them (`--max-age 7d`, `--changed-since 2026-11-01`,
`--site 'https://docs.example.com/*'`), parsed into values the index scan can apply."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta


class FilterError(ValueError):
    """A filter that cannot be understood; the message says what is accepted."""


# PostgreSQL's text cannot hold U+0000: a NUL sent as a parameter fails the statement
# (psycopg.DataError), so it is refused here, with a reason, before any query is made.
_NUL = "\x00"


def parse_question(text: str) -> str:
    """The question as typed, refused when it cannot be searched: blank, or holding a NUL
    character. Refused, not stripped: a question quietly searched as another is a wrong answer."""
    if not (text or "").strip():
        raise FilterError("the question is empty")
    if _NUL in text:
        raise FilterError("the question contains a NUL character (\\u0000), which cannot be searched: remove it")
    return text


_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Older than any page: a larger age would overflow Python's timedelta or PostgreSQL's timestamps.
MAX_AGE = timedelta(days=100 * 365)


def parse_age(text: str) -> timedelta:
    """`90s`, `30m`, `12h`, `7d`, `2w`, up to 100 years."""
    match = _AGE.match(text or "")
    if match is None:
        raise FilterError(f"cannot read age {text!r}: use a number and a unit s, m, h, d or w (e.g. 7d)")
    shown = text.strip() if len(text.strip()) <= 40 else text.strip()[:40] + "…"
    try:
        age = timedelta(**{_UNITS[match.group(2).lower()]: float(match.group(1))})
    except OverflowError:
        age = None
    if age is None or age > MAX_AGE:
        raise FilterError(f"age {shown!r} is more than 100 years: no page is that old")
    if age <= timedelta(0):
        raise FilterError(f"age {text!r} must be more than zero")
    return age


def parse_since(text: str) -> datetime:
    """An ISO date (midnight UTC) or date and time (UTC unless it names its offset)."""
    raw = (text or "").strip()
    try:
        if len(raw) == 10:
            day = date.fromisoformat(raw)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise FilterError(f"cannot read date {text!r}: use YYYY-MM-DD or an ISO date and time "
                          "(e.g. 2026-11-01T09:30:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


_SCHEME = re.compile(r"^(https?)://", re.IGNORECASE)


def site_pattern(glob: str) -> str:
    """A URL glob (`*` any run of characters, `?` one) as a SQL LIKE pattern over the pages'
    normalized URLs: those are https, with a lowercase host and no trailing slash, so the glob's
    scheme and host are read the same way (`http://Docs.Example.com/*` finds them too)."""
    raw = (glob or "").strip()
    if not raw:
        raise FilterError("the site pattern is empty: give a URL glob such as 'https://docs.example.com/*'")
    if _NUL in raw:
        raise FilterError(f"site pattern {glob!r} contains a NUL character (\\u0000): remove it")
    scheme = _SCHEME.match(raw)
    if scheme is None:
        if "://" in raw:
            raise FilterError(f"site pattern {glob!r}: only http and https URLs are indexed")
        rest = raw
    else:
        rest = raw[scheme.end():]
    host, slash, path = rest.partition("/")
    if not host:
        raise FilterError(f"site pattern {glob!r} has no host: give e.g. 'https://docs.example.com/*'")
    if any(ch.isspace() for ch in host):
        raise FilterError(f"site pattern {glob!r}: the host contains whitespace")
    return _like(f"https://{host.lower()}{slash}{path}")


def site_patterns(glob: str) -> tuple[str, ...]:
    """site_pattern, and for a glob ending in `/*` its bare prefix too: normalized URLs have no
    trailing slash, so `https://docs.example.com/*` must find the home page `https://docs.example.com`,
    and `…/guide/*` the page `…/guide` itself."""
    pattern = site_pattern(glob)
    if pattern.endswith("/%"):     # `/` is never escaped, so this `%` is the glob's `*`
        return pattern, pattern[:-2]
    return (pattern,)


def _like(normalized: str) -> str:
    out = []
    for ch in normalized:
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch in "%_\\":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True)
class SearchFilters:
    """What a passage's page must be to be returned; the default lets every live page through."""

    verified_within: timedelta | None = None     # last_verified_at no older than this
    changed_since: datetime | None = None        # last_changed_at at or after this
    sites: tuple[str, ...] = ()                  # LIKE patterns (site_patterns); any one matches

    def __bool__(self) -> bool:
        return self.verified_within is not None or self.changed_since is not None or bool(self.sites)

    @classmethod
    def parse(cls, max_age: str | None = None, changed_since: str | None = None,
              sites: tuple[str, ...] | list[str] = ()) -> SearchFilters:
        return cls(
            verified_within=parse_age(max_age) if max_age else None,
            changed_since=parse_since(changed_since) if changed_since else None,
            sites=tuple(p for s in sites for p in site_patterns(s)),
        )
