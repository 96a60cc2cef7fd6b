"""Markdown normalization and boilerplate rules: noise is not change."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.text import (
    BoilerplateRule,
    content_hash,
    default_boilerplate_rules,
    normalize_markdown,
    parse_boilerplate_rules,
)

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


# --------------------------------------------------------------------------- normalization


def test_unicode_is_composed() -> None:
    assert normalize_markdown("Cafe\u0301") == "Caf\u00e9"


def test_line_endings_become_lf() -> None:
    assert normalize_markdown("a\r\nb\rc\n") == "a\nb\nc"


def test_trailing_spaces_and_tabs_are_stripped_but_indentation_is_kept() -> None:
    text = "    indented code  \n\tTabbed\t \nword \u00a0\n"
    assert normalize_markdown(text) == "    indented code\n\tTabbed\nword \u00a0"


def test_blank_line_runs_collapse_to_one() -> None:
    text = "\n\n  \n# Title\n\n\n\n \t \n\nBody\n\nNext\n\n\n"
    assert normalize_markdown(text) == "# Title\n\nBody\n\nNext"


def test_empty_and_blank_text() -> None:
    assert normalize_markdown("") == ""
    assert normalize_markdown(" \n\t\r\n") == ""


def test_content_hash_is_sha256_of_utf8() -> None:
    assert content_hash("") == hashlib.sha256(b"").hexdigest()
    assert content_hash("é") == hashlib.sha256("é".encode()).hexdigest()
    assert content_hash("e\u0301") != content_hash("\u00e9")
    assert content_hash(normalize_markdown("e\u0301")) == content_hash(normalize_markdown("\u00e9"))


# PostgreSQL text holds any character but U+0000; a str may also carry lone surrogates
# (a JSON escape such as "\ud800"), which have no UTF-8 form at all.
UNSTORABLE_TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udfff", "\r", "\n", " "])),
    max_size=40,
)


def test_nul_characters_are_removed() -> None:
    assert normalize_markdown("# Ti\x00tle\n\x00\n\nBody\x00\x00") == "# Title\n\nBody"
    assert normalize_markdown("a\r\x00\nb") == "a\nb"          # removed before line endings are read
    assert content_hash(normalize_markdown("a\x00b")) == content_hash(normalize_markdown("ab"))


def test_lone_surrogates_become_the_replacement_character() -> None:
    text = normalize_markdown("caf\ud800 \udfffend")
    assert text == "caf\ufffd \ufffdend"
    assert content_hash(text) == hashlib.sha256("caf\ufffd \ufffdend".encode()).hexdigest()


@PROPERTY_SETTINGS
@given(text=UNSTORABLE_TEXT)
def test_normalized_text_is_always_storable_and_a_fixed_point(text: str) -> None:
    once = normalize_markdown(text)
    assert "\x00" not in once
    once.encode("utf-8")                       # no lone surrogate left: raises otherwise
    assert normalize_markdown(once) == once


NOISY_TEXT = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.sampled_from(
            [
                "\r\n", "\r", "\n", "\n\n\n", "  ", "\t", " \n", "e\u0301", "\u212b", "#", "```",
                "Last updated: 2024-05-01", "© 2024 Example Inc.", "We use cookies to improve your experience.",
                "Page rendered in 0.23s", "Generated on 2024-05-01 10:00", "Accept all cookies",
            ]
        ),
    ),
    max_size=30,
).map("".join)


@PROPERTY_SETTINGS
@given(text=NOISY_TEXT)
def test_normalization_is_idempotent(text: str) -> None:
    once = normalize_markdown(text)
    assert normalize_markdown(once) == once
    assert "\r" not in once and "\n\n\n" not in once
    assert not once.endswith("\n") and not once.startswith("\n")
    assert all(line == line.rstrip(" \t") for line in once.split("\n"))


@PROPERTY_SETTINGS
@given(text=NOISY_TEXT)
def test_normalization_with_default_rules_is_idempotent(text: str) -> None:
    rules = default_boilerplate_rules()
    once = normalize_markdown(text, rules, url="https://example.com/a")
    assert normalize_markdown(once, rules, url="https://example.com/a") == once


def test_idempotent_even_when_a_rule_exposes_another_match() -> None:
    # Removing the inner "[x]" creates a new "[x]": a single pass would not be a fixed point.
    rule = BoilerplateRule(name="x", pattern=re.compile(r"\[x\]"))
    once = normalize_markdown("[[x]x]", [rule])
    assert once == ""
    assert normalize_markdown(once, [rule]) == once


# --------------------------------------------------------------------------- default rules

PAGE = """# Install

Run the installer, then restart.

We use cookies in the session store; see the configuration section.

Copyright 2019 amendments changed the licence terms discussed in this chapter, which the
rest of this guide explains in detail.

Updated the docs for version 2.
"""


@pytest.mark.parametrize(
    "footer",
    [
        "Last updated: 2024-05-01",
        "Last updated on May 1, 2024",
        "*Last modified: 1 May 2024 10:32 UTC*",
        "Page last updated 05/01/2024",
        "Updated: 2024-05-01T10:32:00Z",
        "© 2024 Example Inc.",
        "© 2019–2024 Example Inc. All rights reserved.",
        "Copyright (c) 2024 Example, Inc.",
        "Copyright © 2024 Example",
        "All rights reserved.",
        "Generated on 2024-05-01 10:32:11",
        "This page was generated on Mon, 6 May 2024 by Sphinx 7.2.6.",
        "Page rendered in 0.23s",
        "Page generated in 12 ms",
        "We use cookies to improve your experience. [Accept](#accept)",
        "This website uses cookies to ensure you get the best experience.",
        "By using this site, you agree to our use of cookies.",
        "Accept all cookies",
        "[Reject all](#)",
        "Cookie settings",
    ],
)
def test_default_rules_remove_footer_noise(footer: str) -> None:
    rules = default_boilerplate_rules()
    noisy = PAGE + "\n" + footer + "\n"
    assert normalize_markdown(noisy, rules) == normalize_markdown(PAGE, rules)


def test_default_rules_keep_real_content() -> None:
    rules = default_boilerplate_rules()
    normalized = normalize_markdown(PAGE, rules)
    assert normalized == normalize_markdown(PAGE)
    for line in ("We use cookies in the session store", "Copyright 2019 amendments", "Updated the docs"):
        assert line in normalized


def test_footer_timestamp_does_not_change_the_hash() -> None:
    rules = default_boilerplate_rules()
    monday = PAGE + "\n---\n\nLast updated: 2024-05-01 09:00\n\n© 2024 Example Inc.\n"
    tuesday = PAGE + "\n---\n\nLast updated: 2024-05-02 17:45\n\n© 2025 Example Inc.\n"
    assert content_hash(normalize_markdown(monday, rules)) == content_hash(normalize_markdown(tuesday, rules))
    # Without the rules it would count as a change: the test is not vacuous.
    assert content_hash(normalize_markdown(monday)) != content_hash(normalize_markdown(tuesday))


def test_footer_line_inside_a_paragraph_keeps_the_paragraph_together() -> None:
    rules = default_boilerplate_rules()
    assert normalize_markdown("Line one\nLast updated: 2024-05-01\nLine two", rules) == "Line one\nLine two"


def test_default_rules_are_cached_but_returned_as_a_fresh_list() -> None:
    first = default_boilerplate_rules()
    assert first and all(isinstance(rule, BoilerplateRule) for rule in first)
    first.clear()
    second = default_boilerplate_rules()
    assert second and second[0] is default_boilerplate_rules()[0]


# --------------------------------------------------------------------------- rule config


def test_parse_rules_with_flags_replacement_and_url_scope() -> None:
    rules = parse_boilerplate_rules(
        """
- name: promo
  pattern: '^promo: .*$'
  flags: [MULTILINE, IGNORECASE]
- name: session
  pattern: 'session=[0-9a-f]+'
  replacement: 'session=<id>'
  url_pattern: '^https://shop\\.example\\.com/'
"""
    )
    assert [rule.name for rule in rules] == ["promo", "session"]
    assert rules[0].pattern.flags & re.MULTILINE and rules[0].pattern.flags & re.IGNORECASE
    assert rules[0].url_pattern is None
    text = "PROMO: 10% off\nbody session=abc123"
    shop = normalize_markdown(text, rules, url="https://shop.example.com/cart")
    other = normalize_markdown(text, rules, url="https://example.com/cart")
    unknown = normalize_markdown(text, rules)
    assert shop == "body session=<id>"
    assert other == unknown == "body session=abc123"


def test_empty_config_means_no_rules() -> None:
    assert parse_boilerplate_rules("") == []
    assert parse_boilerplate_rules("# only a comment\n") == []


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("- name: broken\n  pattern: '([a-z'\n", r"'broken'.*invalid regex"),
        ("- name: scoped\n  pattern: 'x'\n  url_pattern: '(['\n", r"'scoped'.*url_pattern"),
        ("- name: nopattern\n", r"'nopattern' has no 'pattern'"),
        ("- pattern: 'x'\n", r"#1 has no 'name'"),
        ("- name: f\n  pattern: 'x'\n  flags: [MULTILNE]\n", r"'f'.*unknown flag"),
        ("- name: k\n  pattern: 'x'\n  replacment: ''\n", r"'k'.*unknown keys"),
        ("- name: g\n  pattern: '(a)'\n  replacement: '\\2'\n", r"'g'.*unknown group"),
        ("- name: e\n  pattern: ''\n", r"'e'.*non-empty"),
        ("- name: d\n  pattern: 'a'\n- name: d\n  pattern: 'b'\n", r"'d' is defined twice"),
        ("name: x\npattern: y\n", "must be a YAML list"),
        ("- just a string\n", "#1 must be a mapping"),
        ("- name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_rules_are_reported_by_name(config: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_boilerplate_rules(config)


def test_shipped_config_parses() -> None:
    from importlib.resources import files

    text = files("rag_pipeline").joinpath("config", "boilerplate.yaml").read_text(encoding="utf-8")
    names = [rule.name for rule in parse_boilerplate_rules(text)]
    assert names == [rule.name for rule in default_boilerplate_rules()]
    assert {"last-updated-date", "copyright-year", "cookie-banner", "render-time", "generated-on-date"} <= set(names)


def test_a_pass_in_which_no_rule_matched_is_the_last():
    """The text the rules saw is tidied already: when none matched, a second pass would give them
    the same text again, so normalization stops after one (each rule runs once per page)."""
    from rag_pipeline.core.text import BoilerplateRule

    seen = []

    class Counting:
        def __init__(self, pattern: str) -> None:
            self.pattern = re.compile(pattern, re.MULTILINE)

        def subn(self, replacement, text):
            seen.append(text)
            return self.pattern.subn(replacement, text)

    rules = [BoilerplateRule("never", Counting(r"^never here$"))]
    assert normalize_markdown("# Title  \r\n\n\n\nBody\n", rules) == "# Title\n\nBody"
    assert seen == ["# Title\n\nBody"]          # once, on the tidied text
    seen.clear()
    footer = [BoilerplateRule("footer", Counting(r"^Footer\n?"))]
    assert normalize_markdown("Body\n\nFooter\n\n\nMore", footer) == "Body\n\nMore"
    assert len(seen) == 2                         # a match: once more, to reach the fixed point


def test_tidying_scans_only_for_what_a_page_has(monkeypatch: pytest.MonkeyPatch) -> None:
    # A page's words each try `[ \t]+$`: the expressions run only where their match can be.
    from rag_pipeline.core import text as text_module

    ran: list[str] = []

    class Spy:
        def __init__(self, pattern: re.Pattern[str]) -> None:
            self.pattern = pattern

        def sub(self, replacement: str, text: str) -> str:
            ran.append(self.pattern.pattern)
            return self.pattern.sub(replacement, text)

    monkeypatch.setattr(text_module, "_TRAILING_BLANKS", Spy(text_module._TRAILING_BLANKS))
    monkeypatch.setattr(text_module, "_BLANK_LINE_RUNS", Spy(text_module._BLANK_LINE_RUNS))
    page = "# Title\n\nA page of words.\n\nAnd more words."
    assert normalize_markdown(page) == page
    assert ran == []
    assert normalize_markdown("Title \t\n\n\n\nWords\t") == "Title\n\nWords"
    assert len(ran) == 2
