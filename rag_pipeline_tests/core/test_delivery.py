"""Delivery classification: only a successful crawl of a real 404/410 may delete."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.delivery import Verdict, classify, parse_status


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("200", 200),
        (" 404 ", 404),
        ("200, 200", 200),
        ("301,200", 301),
        ("100", 100),
        ("999", 999),
    ],
)
def test_parse_status(value: str | None, expected: int | None) -> None:
    assert parse_status(value) == expected


@pytest.mark.parametrize(
    "value", ["abc", "200,abc", "200,", ",200", "+200", "2_00", "20 0", "٢٠٠", "200.0", "99", "1000", "0", "200, 1000"]
)
def test_parse_status_rejects_garbage(value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(value))):  # The message quotes the header.
        parse_status(value)


@pytest.mark.parametrize(
    ("crawler", "original", "verdict"),
    [
        (200, 200, Verdict.CONTENT),
        (200, 204, Verdict.CONTENT),
        (200, 301, Verdict.CONTENT),
        (200, 302, Verdict.CONTENT),
        (200, 404, Verdict.TOMBSTONE),
        (200, 410, Verdict.TOMBSTONE),
        (200, 403, Verdict.SKIP),
        (200, 429, Verdict.SKIP),
        (200, 500, Verdict.SKIP),
        (200, 503, Verdict.SKIP),
        (200, None, Verdict.SKIP),
        # The crawler itself failed: nothing is known about the page, nothing is deleted.
        (404, 404, Verdict.SKIP),
        (404, None, Verdict.SKIP),
        (410, 410, Verdict.SKIP),
        (500, 200, Verdict.SKIP),
        (520, 404, Verdict.SKIP),
        (None, 200, Verdict.SKIP),
        (None, 404, Verdict.SKIP),
        (None, None, Verdict.SKIP),
    ],
)
def test_classify(crawler: int | None, original: int | None, verdict: Verdict) -> None:
    assert classify(crawler, original) is verdict


def test_verdict_values_are_strings() -> None:
    assert {v.value for v in Verdict} == {"content", "tombstone", "skip"}
    assert Verdict.CONTENT == "content"


STATUS = st.one_of(st.none(), st.integers(100, 999))


@settings(max_examples=200, deadline=None)
@given(crawler=STATUS, original=STATUS)
def test_only_a_successful_crawl_changes_the_index(crawler: int | None, original: int | None) -> None:
    verdict = classify(crawler, original)
    if verdict is Verdict.TOMBSTONE:
        assert crawler == 200 and original in (404, 410)
    elif verdict is Verdict.CONTENT:
        assert crawler == 200 and original is not None and 200 <= original <= 399 and original != 304
    else:
        assert crawler != 200 or original is None or original == 304 or not (200 <= original <= 399 or original in (404, 410))


@settings(max_examples=200, deadline=None)
@given(statuses=st.lists(st.integers(100, 999), min_size=1, max_size=4), spaces=st.sampled_from(["", " ", "  "]))
def test_parse_status_takes_the_first_of_joined_values(statuses: list[int], spaces: str) -> None:
    header = ("," + spaces).join(str(s) for s in statuses)
    assert parse_status(spaces + header + spaces) == statuses[0]


def test_not_modified_is_skipped_not_content():
    assert classify(200, 304) is Verdict.SKIP
