from datetime import timedelta

import pytest
from hypothesis import given, strategies as st

from rag_pipeline.crawl.cadence import (CadenceError, format_interval, glob_to_like, load_rules,
                                        parse_interval, parse_seeds)


def test_intervals():
    assert parse_interval("1s") == timedelta(seconds=1)
    assert parse_interval("6h") == timedelta(hours=6)
    assert parse_interval("1h30m") == timedelta(minutes=90)
    assert parse_interval(" 2W ") == timedelta(weeks=2)
    for bad in ("", "6", "h", "1x", "0s", "1h 30m", "-1h"):
        with pytest.raises(CadenceError):
            parse_interval(bad)


@given(st.integers(min_value=1, max_value=10**8))
def test_format_parses_back(seconds):
    every = timedelta(seconds=seconds)
    assert parse_interval(format_interval(every)) == every


def test_seed_file():
    seeds = parse_seeds(
        "# prices change hourly\n"
        "https://shop.example.com/pricing every=1h   # hourly\n"
        "\n"
        "https://docs.example.com/guide/#install\n"
        "https://DOCS.example.com/guide   # same page as above: kept once\n"
        "http://127.0.0.1:8900/a every=1s\n"
    )
    assert [(s.url, s.every) for s in seeds] == [
        ("https://shop.example.com/pricing", timedelta(hours=1)),
        ("https://docs.example.com/guide/#install", None),
        ("http://127.0.0.1:8900/a", timedelta(seconds=1)),
    ]
    assert seeds[2].page_url == "https://127.0.0.1:8900/a"
    with pytest.raises(CadenceError, match="line 2"):
        parse_seeds("https://a.example.com\nhttps://b.example.com often=1h\n")
    with pytest.raises(CadenceError, match="line 1"):
        parse_seeds("ftp://a.example.com\n")


def test_default_rules_by_pattern(tmp_path):
    rules = load_rules()
    assert rules.every_for("https://shop.example.com/pricing") == timedelta(hours=1)
    assert rules.every_for("https://example.com/changelog/archive/2019") == timedelta(days=30)
    assert rules.every_for("https://example.com/docs/install") == timedelta(days=7)
    assert rules.every_for("https://example.com/about") == rules.default
    custom = tmp_path / "c.yaml"
    custom.write_text("default: 2d\nrules:\n  - regex: 'news'\n    every: 10m\n")
    assert load_rules(custom).every_for("https://x.example.com/news/1") == timedelta(minutes=10)
    custom.write_text("rules:\n  - every: 1h\n")
    with pytest.raises(CadenceError, match="rule 1"):
        load_rules(custom)


def test_glob_to_like():
    assert glob_to_like("https://docs.example.com/*") == "https://docs.example.com/%"
    assert glob_to_like("*/a_b%?") == "%/a\\_b\\%_"
