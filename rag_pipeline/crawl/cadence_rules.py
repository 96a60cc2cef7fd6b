"""Recrawl cadences: intervals like `6h`, defaults by URL pattern, and seed files. Pure, no I/O
beyond reading the config file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from rag_pipeline.core.urls import InvalidURL, normalize_url

DEFAULT_CADENCE_FILE = Path(__file__).resolve().parents[1] / "config" / "cadence.yaml"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_COMMENT = re.compile(r"(^|\s)#.*$")
_HAS_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")


class CadenceError(ValueError):
    """An interval, a rule or a seed line that cannot be read; the message says which."""


class SeedFileError(CadenceError):
    """Every bad line of a seed file at once, so one edit fixes them all: `problems` is
    [(line number, message)], in file order."""

    def __init__(self, problems: list[tuple[int, str]]):
        self.problems = problems
        if len(problems) == 1:
            n, message = problems[0]
            text = f"line {n}: {message}"
        else:
            text = "\n".join([f"{len(problems)} bad lines:", *(f"  line {n}: {m}" for n, m in problems)])
        super().__init__(text)


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
    if seconds > 60:
        return f"{format_interval(timedelta(seconds=seconds - seconds % 60))}{seconds % 60}s"
    return f"{seconds}s"


def check_honourable(every: timedelta, sensor_interval: timedelta) -> None:
    """recrawl_sensor looks for due pages only once per interval, so a shorter cadence would
    silently be crawled at the sensor's pace: refuse it rather than promise it."""
    if every < sensor_interval:
        floor = format_interval(sensor_interval)
        raise CadenceError(f"every {format_interval(every)} is shorter than the recrawl sensor's interval "
                           f"({floor}): it cannot be honoured; use {floor} or more")


def _span(seconds: int) -> str:
    for size, unit, sub_size, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit} {seconds % size // sub_size}{sub_unit}"
    return f"{seconds // 60}m" if seconds >= 60 else f"{seconds}s"


def describe_time(at: datetime | None, now: datetime, missing: str = "never") -> str:
    """`2026-12-01 07:40:00 UTC (5m ago)`: an operator reads when, and how far off, at a glance."""
    if at is None:
        return missing
    seconds = int((at - now).total_seconds())
    relative = "now" if seconds == 0 else (f"in {_span(seconds)}" if seconds > 0 else f"{_span(-seconds)} ago")
    return f"{at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC ({relative})"


@dataclass(frozen=True)
class Rule:
    every: timedelta
    glob: str | None = None
    regex: re.Pattern | None = None
    # The adaptive cadence stays within [min, max] (default every/4 and 4×every); adapt: false pins it.
    min: timedelta | None = None
    max: timedelta | None = None
    adapt: bool = True

    def matches(self, url: str) -> bool:
        if self.glob is not None:
            return fnmatchcase(url, self.glob)
        return bool(self.regex and self.regex.search(url))

    @property
    def label(self) -> str:
        return f"glob {self.glob}" if self.glob is not None else f"regex {self.regex.pattern if self.regex else ''}"

    @property
    def floor(self) -> timedelta:
        return self.min if self.min is not None else self.every / 4

    @property
    def ceiling(self) -> timedelta:
        return self.max if self.max is not None else self.every * 4


@dataclass(frozen=True)
class CadenceRules:
    default: timedelta
    tombstone_recheck: timedelta
    rules: tuple[Rule, ...] = ()
    default_min: timedelta | None = None
    default_max: timedelta | None = None
    adaptive: bool = True          # off: every page keeps its rule's interval, as before

    def rule_for(self, normalized_url: str) -> Rule:
        for rule in self.rules:
            if rule.matches(normalized_url):
                return rule
        return Rule(self.default, glob="*", min=self.default_min, max=self.default_max)

    def every_for(self, normalized_url: str) -> timedelta:
        return self.rule_for(normalized_url).every


def load_rules(path: Path | None = None) -> CadenceRules:
    path = path or DEFAULT_CADENCE_FILE
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CadenceError(f"cannot read cadence file {path}: {exc}") from exc
    return rules_from(data, path)


def rules_from(data: dict, path) -> CadenceRules:
    """Rules in cadence.yaml's form, from a file or a site's `cadence:` block (`path` names it)."""
    if not isinstance(data, dict):
        raise CadenceError(f"{path}: cadence rules must be a mapping (default, rules, …)")
    rules = []
    for n, item in enumerate(data.get("rules") or [], 1):
        if not isinstance(item, dict) or "every" not in item or ("glob" in item) == ("regex" in item):
            raise CadenceError(f"{path}: rule {n} needs `every` and exactly one of `glob` or `regex`")
        unknown = set(item) - {"glob", "regex", "every", "min", "max", "adapt"}
        if unknown:
            raise CadenceError(f"{path}: rule {n}: unknown key(s) {', '.join(sorted(unknown))} "
                               "(a rule has glob or regex, every, and optionally min, max, adapt)")
        bounds = {k: parse_interval(str(item[k])) for k in ("min", "max") if k in item}
        kind = {"glob": str(item["glob"])} if "glob" in item else {"regex": _regex(item["regex"], path, n)}
        rule = Rule(parse_interval(str(item["every"])), **kind, **bounds, adapt=_flag(item, "adapt", path, n))
        _check_bounds(rule, f"{path}: rule {n}")
        rules.append(rule)
    loaded = CadenceRules(
        default=parse_interval(str(data.get("default", "7d"))),
        tombstone_recheck=parse_interval(str(data.get("tombstone_recheck", "30d"))),
        rules=tuple(rules),
        default_min=parse_interval(str(data["default_min"])) if "default_min" in data else None,
        default_max=parse_interval(str(data["default_max"])) if "default_max" in data else None,
        adaptive=_flag(data, "adaptive", path, None),
    )
    _check_bounds(loaded.rule_for(""), f"{path}: default")
    return loaded


def _regex(text, path: Path, n: int) -> re.Pattern:
    try:
        return re.compile(str(text))
    except re.error as exc:
        raise CadenceError(f"{path}: rule {n}: bad regex: {exc}") from exc


def _flag(item: dict, key: str, path: Path, n: int | None) -> bool:
    value = item.get(key, True)
    if not isinstance(value, bool):
        where = f"rule {n}: " if n is not None else ""
        raise CadenceError(f"{path}: {where}`{key}` must be true or false, not {value!r}")
    return value


def _check_bounds(rule: Rule, where: str) -> None:
    if not rule.floor <= rule.every <= rule.ceiling:
        raise CadenceError(f"{where}: needs min <= every <= max, not min {format_interval(rule.floor)}, "
                           f"every {format_interval(rule.every)}, max {format_interval(rule.ceiling)}")


@dataclass(frozen=True)
class Seed:
    url: str                       # as written: this is what gets crawled
    page_url: str                  # normalized: the page's identity
    every: timedelta | None        # None: the default for its pattern
    line: int


def _parse_seed_line(line: str) -> tuple[str, str | None, timedelta | None, list[str]]:
    """(url, normalized url or None, every, problems) of one non-empty seed line."""
    fields = line.split()
    if not _HAS_SCHEME.match(fields[0]):
        return fields[0], None, None, [f"{line!r} is not a URL (expected http(s)://…)"]
    url, page_url, every, problems = fields[0], None, None, []
    try:
        page_url = normalize_url(url)
    except InvalidURL as exc:
        problems.append(str(exc))
    given = False
    for extra in fields[1:]:
        key, sep, value = extra.partition("=")
        if key != "every" or not sep:
            problems.append(f"unknown option {extra!r} (the only option is every=INTERVAL, e.g. every=6h)")
        elif given:
            problems.append("every= given twice")
        else:
            given = True
            try:
                every = parse_interval(value)
            except CadenceError as exc:
                problems.append(str(exc))
    return url, page_url, every, problems


def parse_seeds(text: str, min_every: timedelta | None = None) -> list[Seed]:
    """One URL per line, `#` comments, optional `every=6h`. Every bad line is reported at once
    (SeedFileError), and then nothing is returned: a file is registered as written or not at all.
    A page listed twice is kept once, with the cadence either line gives; two different ones
    are an error. A cadence below `min_every` (the recrawl sensor's interval) cannot be honoured."""
    seeds: dict[str, Seed] = {}
    problems: list[tuple[int, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        # A comment starts with `#` at the start of a line or after a space (a URL's own #fragment stays).
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        url, page_url, every, line_problems = _parse_seed_line(line)
        if every is not None and min_every is not None:
            try:
                check_honourable(every, min_every)
            except CadenceError as exc:
                line_problems.append(str(exc))
        if line_problems:
            problems.append((n, "; ".join(line_problems)))
            continue
        first = seeds.get(page_url)
        if first is None:
            seeds[page_url] = Seed(url=url, page_url=page_url, every=every, line=n)
        elif every is not None and first.every is not None and every != first.every:
            problems.append((n, f"{page_url} is already on line {first.line} with "
                                f"every={format_interval(first.every)}, here every={format_interval(every)}"))
        elif first.every is None and every is not None:
            seeds[page_url] = Seed(url=first.url, page_url=page_url, every=every, line=first.line)
    if problems:
        raise SeedFileError(problems)
    return list(seeds.values())


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
