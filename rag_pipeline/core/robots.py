"""robots.txt rules (RFC 9309), read defensively because strangers write the file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

__all__ = [
    "MAX_ROBOTS_BYTES",
    "Rule",
    "Group",
    "Robots",
    "parse_robots",
    "ALLOW_ALL",
    "DISALLOW_ALL",
]

MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB; the rest is ignored.
MAX_RULES = 10_000
MAX_PATTERN_CHARS = 2_000
MAX_CRAWL_DELAY = 60.0

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# RFC 9309 product tokens are letters, "_" and "-"; digits are common enough to allow too.
_PRODUCT_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_DELAY = re.compile(r"[0-9]{1,10}(?:\.[0-9]{0,10})?|\.[0-9]{1,10}")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Printable ASCII (existing escapes included) stays as written; anything else is UTF-8 escaped.
_PRINTABLE_ASCII = "".join(chr(code) for code in range(0x21, 0x7F))


def _canonical(text: str) -> str:
    # One spelling per octet, on rules and paths alike: %7E and ~ match, %2f and %2F match,
    # and "ツ" matches "%E3%83%84" (RFC 9309 2.2.2).
    text = quote(text, safe=_PRINTABLE_ASCII, errors="surrogatepass")
    return _ESCAPE.sub(_canonical_escape, text)


def _canonical_escape(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else match.group(0).upper()


def _product_token(agent: str) -> str:
    match = _PRODUCT_TOKEN.match(agent.strip())
    return match.group(0).lower() if match else ""


@dataclass(frozen=True)
class Rule:
    """One Allow or Disallow line, split at its wildcards once so that matching is cheap."""

    allow: bool
    pattern: str  # As written, for messages.
    segments: tuple[str, ...]  # The canonical pattern split at "*".
    anchored: bool  # Ended in "$": the path must end where the pattern does.
    specificity: int  # RFC 9309 2.2.2: the match with the most octets wins.

    @classmethod
    def parse(cls, allow: bool, pattern: str) -> Rule | None:
        """None for a rule that matches nothing (an empty Disallow allows everything)."""
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            return None
        canonical = _canonical(pattern)
        if not canonical.startswith(("/", "*")):
            canonical = "/" + canonical  # Paths are absolute; a bare "private" means "/private".
        anchored = canonical.endswith("$")
        body = canonical[:-1] if anchored else canonical
        return cls(allow, pattern, tuple(body.split("*")), anchored, len(canonical))

    def matches(self, path: str) -> bool:
        """A glob with leftmost str.find per segment: linear-ish, no backtracking blowup.

        Taking each segment's leftmost occurrence is always safe with "*" as the only
        wildcard: it leaves the most room for the segments after it.
        """
        first, *rest = self.segments
        if not path.startswith(first):
            return False
        if not rest:
            return not self.anchored or len(path) == len(first)
        start, end = len(first), len(path)
        if self.anchored:
            *rest, last = rest
            end -= len(last)
            if end < start or not path.endswith(last):
                return False
        for segment in rest:
            found = path.find(segment, start, end)
            if found < 0:
                return False
            start = found + len(segment)
        return True


@dataclass(frozen=True)
class Group:
    """The rules under one run of User-agent lines."""

    agents: tuple[str, ...]  # Lower-case product tokens, or "*".
    rules: tuple[Rule, ...]
    crawl_delay: float | None = None


@dataclass(frozen=True)
class Robots:
    """A parsed robots.txt: answers per agent, explains refusals, lists its sitemaps."""

    groups: tuple[Group, ...]
    sitemaps: tuple[str, ...]

    def _select(self, agent: str) -> tuple[str, list[Group]]:
        # RFC 9309 2.2.1: the groups naming the product token, merged; else the "*" groups.
        token = _product_token(agent)
        if token:
            named = [group for group in self.groups if token in group.agents]
            if named:
                return token, named
        return "*", [group for group in self.groups if "*" in group.agents]

    def why_disallowed(self, url_or_path: str, agent: str) -> str | None:
        """The rule that forbids the URL, worded for a crawl report; None when allowed."""
        path = _request_path(url_or_path)
        if path.partition("?")[0] == "/robots.txt":
            return None  # RFC 9309 2.2.2: the file itself is always allowed.
        label, groups = self._select(agent)
        best: Rule | None = None
        for group in groups:
            for rule in group.rules:
                if (
                    best is None or (rule.specificity, rule.allow) > (best.specificity, best.allow)
                ) and rule.matches(path):
                    best = rule
        if best is None or best.allow:
            return None
        return f"robots.txt: Disallow: {best.pattern} (group for {label!r})"

    def allowed(self, url_or_path: str, agent: str) -> bool:
        return self.why_disallowed(url_or_path, agent) is None

    def crawl_delay(self, agent: str) -> float | None:
        """Seconds between requests from the selected group (non-standard, capped)."""
        _, groups = self._select(agent)
        return next((g.crawl_delay for g in groups if g.crawl_delay is not None), None)


def _request_path(url_or_path: str) -> str:
    """Path and query of a URL, as robots rules see them."""
    target = url_or_path.partition("#")[0]
    if not target.startswith("/"):
        try:
            parts = urlsplit(target)
        except ValueError:  # A broken URL (bad IPv6 host): match what we have, do not crash.
            pass
        else:
            target = parts.path + (f"?{parts.query}" if parts.query else "")
        if not target.startswith("/"):
            target = "/" + target
    return _canonical(target)


def _crawl_delay(value: str) -> float | None:
    if not _DELAY.fullmatch(value):
        return None
    return min(float(value), MAX_CRAWL_DELAY)


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_ROBOTS_BYTES:
        data = data[:MAX_ROBOTS_BYTES]
        # The last line was cut mid-way: a shortened rule could mean something else.
        data = data[: max(data.rfind(b"\n"), data.rfind(b"\r")) + 1]
    return data.decode("utf-8", "replace").removeprefix("\ufeff")


class _GroupBuilder:
    def __init__(self) -> None:
        self.agents: list[str] = []
        self.rules: list[Rule] = []
        self.crawl_delay: float | None = None

    def build(self) -> Group:
        return Group(tuple(self.agents), tuple(self.rules), self.crawl_delay)


def parse_robots(data: bytes | str) -> Robots:
    """Never raises: garbage lines are skipped, as RFC 9309 asks of crawlers."""
    builders: list[_GroupBuilder] = []
    current: _GroupBuilder | None = None
    in_agent_lines = False
    sitemaps: dict[str, None] = {}  # Ordered and deduplicated.
    rule_count = 0
    for line in _LINE_BREAK.split(_decode(data)):
        field, colon, value = line.partition("#")[0].partition(":")
        if not colon:
            continue
        field, value = field.strip().lower(), value.strip()
        if field == "user-agent":
            if current is None or not in_agent_lines:  # Consecutive lines share one group.
                current = _GroupBuilder()
                builders.append(current)
                in_agent_lines = True
            # An unreadable name still opens the group, so its rules attach to nobody.
            token = "*" if value.startswith("*") else _product_token(value)
            if token:
                current.agents.append(token)
        elif field == "sitemap":
            if value:
                sitemaps.setdefault(value)
        elif field in ("allow", "disallow") and current is not None:
            in_agent_lines = False
            rule = Rule.parse(field == "allow", value)
            if rule is not None and rule_count < MAX_RULES:
                current.rules.append(rule)
                rule_count += 1
        elif field == "crawl-delay" and current is not None:
            in_agent_lines = False
            if current.crawl_delay is None:
                current.crawl_delay = _crawl_delay(value)
    return Robots(tuple(b.build() for b in builders), tuple(sitemaps))


# RFC 9309 2.3.1.3: robots.txt "unavailable" (4xx) means no restrictions.
ALLOW_ALL = Robots(groups=(), sitemaps=())
# RFC 9309 2.3.1.4: "unreachable" (5xx, network error) means assume complete disallow.
_DISALLOW_ROOT = Rule.parse(False, "/")
assert _DISALLOW_ROOT is not None
DISALLOW_ALL = Robots(groups=(Group(("*",), (_DISALLOW_ROOT,)),), sitemaps=())
