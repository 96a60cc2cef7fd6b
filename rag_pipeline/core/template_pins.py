"""Pins: an operator's word on a block, which beats what learning found.

A site's YAML will pin a block as content (never template: a licence text the operator wants in
every page's passages) or as template (always template: a banner seen on too few pages to be
learned). A pin matches a block's text with its whitespace collapsed, by exact text, by a glob
(``fnmatch``, case-sensitive, on the whole text) or by a regular expression (``re.search``).
When a content pin and a template pin both match, content wins: nothing is removed on a doubt.
Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rag_pipeline.core.template_blocks import normalize_space

__all__ = ["Pin", "parse_pins", "pinned_role", "pins_rows"]

ROLES = ("content", "template")
HOWS = ("text", "glob", "regex")


@dataclass(frozen=True)
class Pin:
    role: str  # "content" or "template"
    how: str  # "text", "glob" or "regex"
    pattern: str
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a pin is 'content' or 'template', not {self.role!r}")
        if self.how not in HOWS:
            raise ValueError(f"a pin matches by text, glob or regex, not {self.how!r}")
        if not isinstance(self.pattern, str) or not self.pattern.strip():
            raise ValueError(f"a {self.role} pin needs a non-empty {self.how}")
        if self.how == "text":
            regex = re.compile(re.escape(normalize_space(self.pattern)) + r"\Z")
        elif self.how == "glob":
            regex = re.compile(fnmatch.translate(normalize_space(self.pattern)))
        else:
            try:
                regex = re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"a {self.role} pin's regex {self.pattern!r} is invalid: {exc}") from None
        object.__setattr__(self, "_regex", regex)

    def matches(self, text: str) -> bool:
        """Whether the pin names this block (``text`` whitespace-collapsed, as blocks carry it)."""
        if self.how == "regex":
            return self._regex.search(text) is not None
        return self._regex.match(text) is not None


def parse_pins(items: Sequence[Mapping[str, object]] | None) -> tuple[Pin, ...]:
    """Pins from the site YAML's list: ``{as: content|template, text|glob|regex: "…"}``.

    A bad entry raises ValueError with one line naming it (#position), so the site fails with a
    reason instead of silently learning without the operator's pin."""
    if items is None:
        return ()
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise ValueError("template pins must be a list of {as: content|template, text|glob|regex: ...}")
    pins = []
    for position, item in enumerate(items, start=1):
        if not isinstance(item, Mapping):
            raise ValueError(f"template pin #{position} must be a mapping, got {type(item).__name__}")
        unknown = sorted(set(item) - {"as", *HOWS})
        if unknown:
            raise ValueError(f"template pin #{position}: unknown keys {unknown} (allowed: as, text, glob, regex)")
        role = item.get("as")
        if role not in ROLES:
            raise ValueError(f"template pin #{position}: 'as' must be content or template, got {role!r}")
        hows = [how for how in HOWS if how in item]
        if len(hows) != 1:
            raise ValueError(f"template pin #{position}: give exactly one of text, glob or regex")
        pattern = item[hows[0]]
        if not isinstance(pattern, str):
            raise ValueError(f"template pin #{position}: {hows[0]} must be a string")
        try:
            pins.append(Pin(role=str(role), how=hows[0], pattern=pattern))
        except ValueError as exc:
            raise ValueError(f"template pin #{position}: {exc}") from None
    return tuple(pins)


def pinned_role(pins: Sequence[Pin], text: str) -> str | None:
    """"content" if a content pin matches, else "template" if a template pin does, else None."""
    matched = {pin.role for pin in pins if pin.matches(text)}
    if "content" in matched:
        return "content"
    return "template" if matched else None


def pins_rows(pins: Sequence[Pin]) -> list[dict[str, str]]:
    """Pins in the site YAML's own form (``{as: role, text|glob|regex: pattern}``), as stored:
    read back through the same ``parse_pins``."""
    return [{"as": pin.role, pin.how: pin.pattern} for pin in pins]
