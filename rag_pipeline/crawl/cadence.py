"""Recrawl cadences: intervals like `6h`, defaults by URL pattern, and seed files. Pure, no I/O
beyond reading the config file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from rag_pipeline.core.urls import InvalidURL, normalize_url

DEFAULT_CADENCE_FILE = Path(__file__).resolve().parents[1] / "config" / "cadence.yaml"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_COMMENT = re.compile(r"(^|\s)#.*$")


class CadenceError(ValueError):
    """An interval, a rule or a seed line that cannot be read; the message says which."""


def parse_interval(text: str) -> timedelta:
    """`90s`, `15m`, `6h`, `1d`, `2w`, `1h30m` → timedelta (at least one second)."""
    raw = text.strip().lower()
    pos, seconds = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw):
        raise CadenceError(f"cannot read interval {text!r}: use e.g. 30s, 15m, 6h, 1d, 2w or 1h30m")
    if seconds < 1:
        raise CadenceError(f"interval {text!r} is shorter than one second")
    return timedelta(seconds=seconds)


def format_interval(every: timedelta) -> str:
    seconds = int(every.total_seconds())
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Rule:
    every: timedelta
    glob: str | None = None
    regex: re.Pattern | None = None

    def matches(self, url: str) -> bool:
        if self.glob is not None:
            return fnmatchcase(url, self.glob)
        return bool(self.regex and self.regex.search(url))


@dataclass(frozen=True)
class CadenceRules:
    default: timedelta
    tombstone_recheck: timedelta
    rules: tuple[Rule, ...] = ()

    def every_for(self, normalized_url: str) -> timedelta:
        for rule in self.rules:
            if rule.matches(normalized_url):
                return rule.every
        return self.default


def load_rules(path: Path | None = None) -> CadenceRules:
    path = path or DEFAULT_CADENCE_FILE
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CadenceError(f"cannot read cadence file {path}: {exc}") from exc
    rules = []
    for n, item in enumerate(data.get("rules") or [], 1):
        if not isinstance(item, dict) or "every" not in item or ("glob" in item) == ("regex" in item):
            raise CadenceError(f"{path}: rule {n} needs `every` and exactly one of `glob` or `regex`")
        if "glob" in item:
            rules.append(Rule(parse_interval(str(item["every"])), glob=str(item["glob"])))
        else:
            try:
                pattern = re.compile(str(item["regex"]))
            except re.error as exc:
                raise CadenceError(f"{path}: rule {n}: bad regex: {exc}") from exc
            rules.append(Rule(parse_interval(str(item["every"])), regex=pattern))
    return CadenceRules(
        default=parse_interval(str(data.get("default", "7d"))),
        tombstone_recheck=parse_interval(str(data.get("tombstone_recheck", "30d"))),
        rules=tuple(rules),
    )


@dataclass(frozen=True)
class Seed:
    url: str                       # as written: this is what gets crawled
    page_url: str                  # normalized: the page's identity
    every: timedelta | None        # None: the default for its pattern
    line: int


def parse_seeds(text: str) -> list[Seed]:
    """One URL per line, `#` comments, optional `every=6h`. Errors name the line."""
    seeds: list[Seed] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        # A comment starts with `#` at the start of a line or after a space (a URL's own #fragment stays).
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        fields = line.split()
        url, every = fields[0], None
        for extra in fields[1:]:
            key, sep, value = extra.partition("=")
            if key != "every" or not sep:
                raise CadenceError(f"line {n}: unknown field {extra!r} (only every=INTERVAL)")
            try:
                every = parse_interval(value)
            except CadenceError as exc:
                raise CadenceError(f"line {n}: {exc}") from exc
        try:
            page_url = normalize_url(url)
        except InvalidURL as exc:
            raise CadenceError(f"line {n}: {exc}") from exc
        if page_url in seen:
            continue
        seen.add(page_url)
        seeds.append(Seed(url=url, page_url=page_url, every=every, line=n))
    return seeds


def glob_to_like(pattern: str) -> str:
    """Shell glob → SQL LIKE (backslash escapes), for `recrawl now` patterns."""
    out = []
    for ch in pattern:
        if ch in "\\%_":
            out.append("\\" + ch)
        elif ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)
