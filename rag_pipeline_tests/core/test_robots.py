"""robots.txt per RFC 9309: which group applies, which rule wins, and no input can hurt."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_pipeline.core.robots import (
    ALLOW_ALL,
    DISALLOW_ALL,
    MAX_ROBOTS_BYTES,
    Robots,
    parse_robots,
)

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
AGENT = "rag-pipeline-crawler/0.1 (+local)"


def rules_for_all(*lines: str) -> Robots:
    return parse_robots("User-agent: *\n" + "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- rule matching


@pytest.mark.parametrize(
    ("lines", "path", "allowed"),
    [
        # RFC 9309 2.2.2 / 5.2: the longest match wins, whichever kind it is.
        (["Allow: /example/page/", "Disallow: /example/page/x.gif"], "/example/page/", True),
        (["Allow: /example/page/", "Disallow: /example/page/x.gif"], "/example/page/x.gif", False),
        (["Disallow: /example/", "Allow: /example/page"], "/example/page/x", True),
        (["Disallow: /example/", "Allow: /example/page"], "/example/other", False),
        # Equal length: Allow wins, whatever the order.
        (["Disallow: /page", "Allow: /page"], "/page", True),
        (["Allow: /page", "Disallow: /page"], "/page", True),
        (["Disallow: /*.php", "Allow: /a.php"], "/a.php", True),
        # "$" anchors the end; "*" matches any run of characters, including none.
        (["Disallow: /*.gif$"], "/images/x.gif", False),
        (["Disallow: /*.gif$"], "/images/x.gif?size=2", True),
        (["Disallow: /*.gif$"], "/images/x.gifs", True),
        (["Disallow: /fish*"], "/fish", False),
        (["Disallow: /fish*"], "/fishheads/yummy.html", False),
        (["Disallow: /fish*"], "/Fish.asp", True),
        (["Disallow: /*/private/"], "/a/b/private/x", False),
        (["Disallow: /*/private/"], "/private/x", True),
        (["Disallow: /$"], "/", False),
        (["Disallow: /$"], "/page", True),
        (["Disallow: /a$b"], "/a$b", False),  # A "$" that is not last is literal.
        (["Disallow: /*?session="], "/page?session=1", False),
        (["Disallow: /*?session="], "/page?other=1", True),
        (["Disallow: /private"], "/private", False),
        (["Disallow: /private"], "/privateer", False),  # Prefix match, as the RFC says.
        (["Disallow: /private"], "/public", True),
        (["Disallow: *"], "/anything", False),
        (["Disallow: private"], "/private/x", False),  # A missing leading "/" is supplied.
        (["Disallow:"], "/anything", True),  # Empty Disallow allows everything.
        (["Disallow: ", "Allow:"], "/x", True),
        ([], "/x", True),
    ],
)
def test_rule_matching(lines: list[str], path: str, allowed: bool) -> None:
    assert rules_for_all(*lines).allowed(path, AGENT) is allowed


@pytest.mark.parametrize(
    ("rule", "path"),
    [
        ("/a%2fb", "/a%2Fb"),
        ("/a%2Fb", "/a%2fb"),
        ("/%7Euser/", "/~user/x"),
        ("/~user/", "/%7euser/x"),
        ("/%62%61%7A", "/baz"),
        ("/ツ", "/%E3%83%84"),
        ("/%E3%83%84", "/ツ"),
        ("/a b", "/a%20b"),
    ],
)
def test_percent_encoding_is_normalized_on_both_sides(rule: str, path: str) -> None:
    assert not rules_for_all(f"Disallow: {rule}").allowed(path, AGENT)


def test_encoded_slash_is_not_a_slash() -> None:
    assert rules_for_all("Disallow: /a/b").allowed("/a%2Fb", AGENT)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://example.com/private/x", False),
        ("https://example.com/public?q=/private/", True),
        ("https://example.com/search?q=1", False),
        ("https://example.com/search#q=1", True),
        ("https://example.com", True),
        ("http://[bad", True),
    ],
)
def test_full_urls_match_on_path_and_query(url: str, allowed: bool) -> None:
    robots = rules_for_all("Disallow: /private/", "Disallow: /search?")
    assert robots.allowed(url, AGENT) is allowed


def test_robots_txt_itself_is_always_allowed() -> None:
    assert DISALLOW_ALL.allowed("https://example.com/robots.txt", AGENT)
    assert rules_for_all("Disallow: /robots.txt").allowed("/robots.txt", AGENT)
    assert not DISALLOW_ALL.allowed("/robots.txt.bak", AGENT)


def test_allow_all_and_disallow_all() -> None:
    assert ALLOW_ALL.allowed("/anything", AGENT) and ALLOW_ALL.crawl_delay(AGENT) is None
    assert not DISALLOW_ALL.allowed("/", AGENT)
    assert not DISALLOW_ALL.allowed("https://example.com/a?b", "SomeOtherBot")


def test_why_disallowed_names_the_rule_and_group() -> None:
    robots = parse_robots(
        "User-agent: *\nDisallow: /\n\nUser-agent: rag-pipeline-crawler\nDisallow: /private/\n"
    )
    assert robots.why_disallowed("https://example.com/private/a", AGENT) == (
        "robots.txt: Disallow: /private/ (group for 'rag-pipeline-crawler')"
    )
    assert robots.why_disallowed("/public", AGENT) is None
    assert robots.why_disallowed("/public", "OtherBot/2.0") == (
        "robots.txt: Disallow: / (group for '*')"
    )


# --------------------------------------------------------------------------- groups


GROUPS = """\
User-agent: *
Disallow: /everyone-but-named/

User-agent: Rag-Pipeline-Crawler
Disallow: /ours-1/

User-agent: googlebot
User-agent: bingbot
Disallow: /search-engines/

user-agent: rag-pipeline-crawler
disallow: /ours-2/
"""


def test_named_group_replaces_star_group() -> None:
    robots = parse_robots(GROUPS)
    assert robots.allowed("/everyone-but-named/x", AGENT)
    assert not robots.allowed("/everyone-but-named/x", "UnknownBot")


def test_groups_for_the_same_agent_are_merged() -> None:
    robots = parse_robots(GROUPS)
    assert not robots.allowed("/ours-1/x", AGENT)
    assert not robots.allowed("/ours-2/x", AGENT)
    assert robots.allowed("/search-engines/x", AGENT)


def test_agent_matching_uses_the_product_token_case_insensitively() -> None:
    robots = parse_robots(GROUPS)
    for agent in ("rag-pipeline-crawler", "RAG-PIPELINE-CRAWLER/2", " rag-pipeline-crawler/0.1"):
        assert not robots.allowed("/ours-1/", agent)
    # Another product whose name merely starts with ours is not ours.
    assert robots.allowed("/ours-1/", "rag-pipeline-crawler-ng/1.0")
    assert not robots.allowed("/everyone-but-named/", "rag-pipeline-crawler-ng/1.0")


def test_consecutive_user_agent_lines_share_one_group() -> None:
    robots = parse_robots(GROUPS)
    assert not robots.allowed("/search-engines/", "Googlebot/2.1")
    assert not robots.allowed("/search-engines/", "bingbot")
    assert robots.allowed("/ours-1/", "bingbot")


def test_user_agent_line_with_version_names_the_product() -> None:
    robots = parse_robots("User-agent: rag-pipeline-crawler/0.1\nDisallow: /x\n")
    assert not robots.allowed("/x", AGENT)


def test_no_matching_group_and_no_star_allows_everything() -> None:
    robots = parse_robots("User-agent: googlebot\nDisallow: /\n")
    assert robots.allowed("/anything", AGENT)
    assert not robots.allowed("/anything", "Googlebot")


def test_rules_before_any_user_agent_are_ignored() -> None:
    robots = parse_robots("Disallow: /early/\nCrawl-delay: 9\nUser-agent: *\nDisallow: /late/\n")
    assert robots.allowed("/early/x", AGENT)
    assert not robots.allowed("/late/x", AGENT)
    assert robots.crawl_delay(AGENT) is None


def test_unreadable_user_agent_does_not_leak_rules_into_the_previous_group() -> None:
    robots = parse_robots("User-agent: *\nDisallow: /a\n\nUser-agent: ???\nDisallow: /b\n")
    assert robots.allowed("/b", AGENT)
    assert not robots.allowed("/a", AGENT)


# --------------------------------------------------------------------------- other fields


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5", 5.0), ("0.5", 0.5), (".5", 0.5), ("0", 0.0), ("3600", 60.0), ("-1", None),
     ("abc", None), ("nan", None), ("inf", None), ("1e3", None), ("", None)],
)
def test_crawl_delay(value: str, expected: float | None) -> None:
    robots = parse_robots(f"User-agent: rag-pipeline-crawler\nCrawl-delay: {value}\nDisallow: /x\n")
    assert robots.crawl_delay(AGENT) == expected


def test_crawl_delay_comes_from_the_selected_group() -> None:
    robots = parse_robots(
        "User-agent: *\nCrawl-delay: 10\n\nUser-agent: other\nCrawl-delay: 2\n\n"
        "User-agent: rag-pipeline-crawler\nDisallow: /x\n\n"
        "User-agent: rag-pipeline-crawler\nCrawl-delay: 3\n"
    )
    assert robots.crawl_delay(AGENT) == 3.0
    assert robots.crawl_delay("other") == 2.0
    assert robots.crawl_delay("nobody") == 10.0


def test_sitemaps_are_collected_in_order_without_duplicates() -> None:
    robots = parse_robots(
        "Sitemap: https://example.com/a.xml\nUser-agent: *\nsitemap: https://example.com/b.xml\n"
        "Disallow: /x\nSITEMAP:https://example.com/a.xml\nSitemap:\n"
        "Sitemap: https://example.com/c.xml # comment\n"
    )
    assert robots.sitemaps == (
        "https://example.com/a.xml",
        "https://example.com/b.xml",
        "https://example.com/c.xml",
    )
    assert not robots.allowed("/x", AGENT)  # A Sitemap line does not end the group.


def test_bom_crlf_comments_garbage_and_no_final_newline() -> None:
    data = (
        b"\xef\xbb\xbf# robots for example.com\r\n"
        b"USER-AGENT : *   # everyone\r\n"
        b"this line is garbage\r\n"
        b"\xff\xfe\x00 more garbage: \x80\r"
        b"Disallow: /private/ # not for you\r\n"
        b"Allow:/private/open"
    )
    robots = parse_robots(data)
    assert not robots.allowed("/private/x", AGENT)
    assert robots.allowed("/private/open", AGENT)
    assert robots.allowed("/public", AGENT)


def test_str_input_is_accepted() -> None:
    assert not parse_robots("User-agent: *\nDisallow: /ツ\n").allowed("/%E3%83%84", AGENT)


def test_content_past_the_size_limit_is_ignored() -> None:
    head = "User-agent: *\nDisallow: /kept\n"
    padding = "#" * (MAX_ROBOTS_BYTES - len(head) - 1) + "\n"
    robots = parse_robots(head + padding + "Disallow: /dropped\n")
    assert not robots.allowed("/kept", AGENT)
    assert robots.allowed("/dropped", AGENT)


def test_a_line_cut_by_the_size_limit_is_dropped() -> None:
    # Cut to "Allow: /p", the Allow would open far more than it says.
    head = "User-agent: *\nDisallow: /\n"
    padding = "#" * (MAX_ROBOTS_BYTES - len(head) - len("\nAllow: /p")) + "\n"
    robots = parse_robots(head + padding + "Allow: /public-but-long\n")
    assert not robots.allowed("/p", AGENT)
    assert not robots.allowed("/public-but-long", AGENT)


def test_overlong_patterns_and_excess_rules_are_ignored() -> None:
    many = "".join(f"Disallow: /r{i}$\n" for i in range(10_001))
    robots = parse_robots("User-agent: *\nDisallow: /" + "a" * 2_000 + "\n" + many)
    assert robots.allowed("/" + "a" * 2_000, AGENT)
    assert not robots.allowed("/r9998", AGENT)
    assert robots.allowed("/r10000", AGENT)


# --------------------------------------------------------------------------- robustness


def test_pathological_wildcards_are_fast() -> None:
    robots = rules_for_all("Disallow: /" + "*a" * 500, "Allow: /" + "*a" * 499 + "*b$")
    near_miss = "/" + "a" * 499 + "b" * 1500
    started = time.perf_counter()
    for _ in range(20):
        assert robots.allowed(near_miss, AGENT)
        assert not robots.allowed("/" + "ba" * 1000, AGENT)
    assert time.perf_counter() - started < 1.0


def _reference(pattern: str, path: str) -> bool:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return bool((re.fullmatch if anchored else re.match)(regex, path, re.DOTALL))


@given(
    st.from_regex(r"/[ab*$/]{0,8}", fullmatch=True),
    st.from_regex(r"/[ab$/]{0,10}", fullmatch=True),
)
@PROPERTY_SETTINGS
def test_wildcard_matching_agrees_with_a_regex_reference(pattern: str, path: str) -> None:
    robots = rules_for_all(f"Disallow: {pattern}")
    assert robots.allowed(path, AGENT) is not _reference(pattern, path)


@given(st.binary(max_size=2_000))
@PROPERTY_SETTINGS
def test_parse_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    robots = parse_robots(data)
    assert isinstance(robots.allowed("/", AGENT), bool)


ANY_CHARACTER = st.characters(exclude_categories=())  # Lone surrogates included.
ROBOTS_LINES = st.lists(
    st.tuples(
        st.sampled_from(["User-agent", "Allow", "Disallow", "Crawl-delay", "Sitemap", "Other"]),
        st.text(max_size=20),
    ),
    max_size=20,
).map(lambda pairs: "\n".join(f"{field}: {value}" for field, value in pairs))


@given(ROBOTS_LINES, st.text(ANY_CHARACTER, max_size=60), st.text(ANY_CHARACTER, max_size=30))
@PROPERTY_SETTINGS
def test_queries_never_raise(text: str, url_or_path: str, agent: str) -> None:
    robots = parse_robots(text)
    allowed = robots.allowed(url_or_path, agent)
    assert allowed is (robots.why_disallowed(url_or_path, agent) is None)
    delay = robots.crawl_delay(agent)
    assert delay is None or 0 <= delay <= 60
