from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, strategies as st

from rag_pipeline.crawl.cadence_rules import (CadenceError, check_honourable, describe_time, format_interval,
                                        glob_to_like, load_rules, parse_interval, parse_seeds)


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


def test_seed_file_reports_every_bad_line_at_once():
    text = (
        "https://ok.example.com/a every=1h\n"             # 1 fine
        "https://ok.example.com/b every=often\n"          # 2 bad interval
        "foo bar\n"                                       # 3 not a URL at all
        "https://ok.example.com/c often=1h\n"             # 4 unknown option
        "ftp://files.example.com/x\n"                     # 5 not http(s)
        "# a comment, then a blank line\n"
        "\n"
        "https://OK.example.com/a/ every=1d\n"            # 8 same page as line 1, another cadence
        "example.com/docs\n"                              # 9 no scheme
        "https://ok.example.com/d every=1h every=2h\n"    # 10 every= twice
        "https://ok.example.com/e every=\n"               # 11 empty interval
    )
    with pytest.raises(CadenceError) as info:
        parse_seeds(text)
    assert [line for line, _ in info.value.problems] == [2, 3, 4, 5, 8, 9, 10, 11]
    lines = str(info.value).splitlines()
    assert lines[0] == "8 bad lines:"
    assert lines[1:] == [
        "  line 2: cannot read interval 'often': use e.g. 30s, 15m, 6h, 1d, 2w or 1h30m",
        "  line 3: 'foo bar' is not a URL (expected http(s)://…)",
        "  line 4: unknown option 'often=1h' (the only option is every=INTERVAL, e.g. every=6h)",
        "  line 5: only http and https URLs can be indexed, got 'ftp://files.example.com/x'",
        "  line 8: https://ok.example.com/a is already on line 1 with every=1h, here every=1d",
        "  line 9: 'example.com/docs' is not a URL (expected http(s)://…)",
        "  line 10: every= given twice",
        "  line 11: cannot read interval '': use e.g. 30s, 15m, 6h, 1d, 2w or 1h30m",
    ]


def test_one_bad_seed_line_is_one_line():
    with pytest.raises(CadenceError) as info:
        parse_seeds("https://a.example.com\nnot-a-url\n")
    assert str(info.value) == "line 2: 'not-a-url' is not a URL (expected http(s)://…)"


def test_a_repeated_seed_takes_the_cadence_given_on_either_line():
    seeds = parse_seeds("https://a.example.com/x\n"
                        "https://A.example.com/x/ every=6h\n"
                        "https://a.example.com/x every=6h\n")
    assert [(s.page_url, s.every, s.line) for s in seeds] == [("https://a.example.com/x", timedelta(hours=6), 1)]


def test_a_cadence_below_the_sensor_interval_is_refused():
    check_honourable(timedelta(minutes=1), timedelta(seconds=60))
    check_honourable(timedelta(hours=6), timedelta(seconds=60))
    with pytest.raises(CadenceError, match=r"every 1s is shorter than the recrawl sensor's interval \(1m\)"):
        check_honourable(timedelta(seconds=1), timedelta(seconds=60))
    with pytest.raises(CadenceError, match="use 1m30s or more"):
        check_honourable(timedelta(minutes=1), timedelta(seconds=90))


def test_times_are_shown_readably():
    now = datetime(2026, 12, 1, 7, 40, 0, tzinfo=timezone.utc)
    assert describe_time(None, now) == "never"
    assert describe_time(None, now, missing="not scheduled") == "not scheduled"
    assert describe_time(now, now) == "2026-12-01 07:40:00 UTC (now)"
    assert describe_time(now - timedelta(seconds=42), now) == "2026-12-01 07:39:18 UTC (42s ago)"
    assert describe_time(now + timedelta(minutes=2, seconds=5), now) == "2026-12-01 07:42:05 UTC (in 2m)"
    assert describe_time(now - timedelta(hours=5, minutes=3), now) == "2026-12-01 02:37:00 UTC (5h 3m ago)"
    assert describe_time(now + timedelta(days=3, hours=4, minutes=9), now) == "2026-12-04 11:49:00 UTC (in 3d 4h)"
    # Another time zone is shown in UTC, microseconds dropped.
    paris = timezone(timedelta(hours=1))
    assert describe_time(datetime(2026, 12, 1, 8, 40, 0, 999, tzinfo=paris), now) == "2026-12-01 07:40:00 UTC (now)"


def test_seed_cadence_below_the_sensor_interval_is_reported_with_its_line():
    from datetime import timedelta

    from rag_pipeline.crawl.cadence_rules import SeedFileError, parse_seeds

    text = "https://a.example.com/ok every=5m\nhttps://a.example.com/fast every=1s\n"
    with pytest.raises(SeedFileError) as caught:
        parse_seeds(text, timedelta(minutes=1))
    assert caught.value.problems == [(2, "every 1s is shorter than the recrawl sensor's interval (1m): "
                                         "it cannot be honoured; use 1m or more")]
    assert [s.every for s in parse_seeds(text, timedelta(seconds=1))] == [timedelta(minutes=5), timedelta(seconds=1)]
