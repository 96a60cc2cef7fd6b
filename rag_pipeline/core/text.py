"""Markdown normalization and hashing: noise must not count as change."""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "BoilerplateRule",
    "normalize_markdown",
    "content_hash",
    "parse_boilerplate_rules",
    "default_boilerplate_rules",
]

_TRAILING_BLANKS = re.compile(r"[ \t]+$", re.MULTILINE)
# Lone surrogates (a JSON escape like "\ud800") have no UTF-8 form: hashing or storing them fails.
_LONE_SURROGATES = re.compile("[\ud800-\udfff]")
_BLANK_LINE_RUNS = re.compile(r"\n{3,}")
_TEMPLATE_REF = re.compile(r"\\(?:g<([^>]*)>|([1-9][0-9]?))")

_FLAG_NAMES: dict[str, re.RegexFlag] = {
    "MULTILINE": re.MULTILINE,
    "IGNORECASE": re.IGNORECASE,
    "DOTALL": re.DOTALL,
    "VERBOSE": re.VERBOSE,
    "ASCII": re.ASCII,
}
_RULE_KEYS = frozenset({"name", "pattern", "replacement", "url_pattern", "flags"})

# A replacement that keeps re-creating its own match must not loop forever; real rules
# settle in one or two passes.
_MAX_PASSES = 10


@dataclass(frozen=True)
class BoilerplateRule:
    """A regex whose matches are page noise (footer dates, banners), optionally scoped to some URLs."""

    name: str
    pattern: re.Pattern[str]
    replacement: str = ""
    url_pattern: re.Pattern[str] | None = None

    def applies_to(self, url: str | None) -> bool:
        if self.url_pattern is None:
            return True
        return url is not None and self.url_pattern.search(url) is not None


def storable(text: str) -> str:
    """Text PostgreSQL can store and UTF-8 can encode: NUL removed (text columns refuse U+0000),
    lone surrogates replaced with U+FFFD. A page is never refused for a byte it did not mean."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _LONE_SURROGATES.sub("\ufffd", text)


def _tidy(text: str) -> str:
    # Each expression only where it can match: a scan for its literal costs a page a fraction of
    # what the expression's own scan does (every space tries `[ \t]+$`), and most pages have neither.
    if " \n" in text or "\t\n" in text or text.endswith((" ", "\t")):
        text = _TRAILING_BLANKS.sub("", text)
    if "\n\n\n" in text:
        text = _BLANK_LINE_RUNS.sub("\n\n", text)
    return text.strip("\n")


def _one_pass(text: str, rules: Sequence[BoilerplateRule]) -> tuple[str, bool]:
    """The text tidied, then the rules applied (and tidied again if one matched: rules may leave
    trailing blanks or new blank lines behind); and whether a rule matched."""
    text = storable(text)
    text = unicodedata.normalize("NFC", text)
    text = _tidy(text.replace("\r\n", "\n").replace("\r", "\n"))
    matched = False
    for rule in rules:
        text, n = rule.pattern.subn(rule.replacement, text)
        matched = matched or n > 0
    return (_tidy(text) if matched else text), matched


def normalize_markdown(
    text: str, rules: Sequence[BoilerplateRule] = (), url: str | None = None
) -> str:
    """Canonical text, so that the content hash moves only when the content does.

    Idempotent: the passes repeat until the text is a fixed point, so a rule whose
    match only appears after another rule (or after blank-line collapsing) still
    gives the same result when applied to already normalized text. A pass in which no
    rule matched ends it: the rules saw the tidied text, which the next pass would give
    them again unchanged (every step before them is idempotent), so it is a fixed point
    without a second pass to prove it (half of the work, at every delivery routed).
    """
    active = [rule for rule in rules if rule.applies_to(url)]
    for _ in range(_MAX_PASSES):
        result, matched = _one_pass(text, active)
        if not matched or result == text:
            return result
        text = result
    return text


def content_hash(text: str) -> str:
    """Hex SHA-256 of the UTF-8 bytes: the page and embed-text identity."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def embed_hash(text: str) -> bytes:
    """SHA-256 of the exact text sent to the embedder: the address of its vector."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def _check_template(name: str, pattern: re.Pattern[str], replacement: str) -> None:
    # re only reports a bad group reference at the first match, i.e. in production;
    # catch it when the config is loaded instead.
    for match in _TEMPLATE_REF.finditer(replacement):
        ref = match.group(1) if match.group(1) is not None else match.group(2)
        if ref.isdigit():
            ok = 0 <= int(ref) <= pattern.groups
        else:
            ok = ref in pattern.groupindex
        if not ok:
            raise ValueError(
                f"boilerplate rule {name!r}: replacement refers to unknown group {ref!r}"
            )


def _compile(name: str, field: str, source: Any, flags: int) -> re.Pattern[str]:
    if not isinstance(source, str) or not source:
        raise ValueError(f"boilerplate rule {name!r}: {field!r} must be a non-empty string")
    try:
        return re.compile(source, flags)
    except re.error as exc:
        raise ValueError(f"boilerplate rule {name!r}: invalid regex in {field!r}: {exc}") from exc


def _parse_rule(position: int, item: Any) -> BoilerplateRule:
    if not isinstance(item, dict):
        raise ValueError(f"boilerplate rule #{position} must be a mapping, got {type(item).__name__}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"boilerplate rule #{position} has no 'name'")
    unknown = set(item) - _RULE_KEYS
    if unknown:
        # A misspelt key ("replacment") would otherwise be silently ignored.
        raise ValueError(f"boilerplate rule {name!r}: unknown keys {sorted(unknown)}")
    if "pattern" not in item:
        raise ValueError(f"boilerplate rule {name!r} has no 'pattern'")

    flag_names = item.get("flags") or []
    if isinstance(flag_names, str):
        flag_names = [flag_names]
    if not isinstance(flag_names, list):
        raise ValueError(f"boilerplate rule {name!r}: 'flags' must be a list")
    flags = 0
    for flag in flag_names:
        if not isinstance(flag, str) or flag.upper() not in _FLAG_NAMES:
            raise ValueError(
                f"boilerplate rule {name!r}: unknown flag {flag!r} "
                f"(allowed: {', '.join(sorted(_FLAG_NAMES))})"
            )
        flags |= _FLAG_NAMES[flag.upper()]

    pattern = _compile(name, "pattern", item["pattern"], flags)
    replacement = item.get("replacement", "")
    if replacement is None:
        replacement = ""
    if not isinstance(replacement, str):
        raise ValueError(f"boilerplate rule {name!r}: 'replacement' must be a string")
    _check_template(name, pattern, replacement)
    url_pattern = None
    if item.get("url_pattern") is not None:
        url_pattern = _compile(name, "url_pattern", item["url_pattern"], 0)
    return BoilerplateRule(name=name, pattern=pattern, replacement=replacement, url_pattern=url_pattern)


def parse_boilerplate_rules(yaml_text: str) -> list[BoilerplateRule]:
    """Rules live in config so a site's noise can be silenced without a code change."""
    try:
        data = yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        raise ValueError(f"boilerplate rules are not valid YAML: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValueError("boilerplate rules must be a YAML list of rules")
    rules = [_parse_rule(position, item) for position, item in enumerate(data, start=1)]
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise ValueError(f"boilerplate rule {rule.name!r} is defined twice")
        seen.add(rule.name)
    return rules


@functools.cache
def _default_rules() -> tuple[BoilerplateRule, ...]:
    resource = importlib.resources.files("rag_pipeline").joinpath("config", "boilerplate.yaml")
    return tuple(parse_boilerplate_rules(resource.read_text(encoding="utf-8")))


def default_boilerplate_rules() -> list[BoilerplateRule]:
    """The shipped rules, parsed once; a fresh list so callers may extend it safely."""
    return list(_default_rules())
