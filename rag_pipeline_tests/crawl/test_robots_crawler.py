"""robots.txt in the local crawler, on real loopback sockets: a disallowed hop is never requested
and its push says the rule (`disallowed`, not failed: test_robots_disallowed follows its page), the file is fetched once per origin and TTL, an unreachable one
blocks its site for a short while only, and fetches of one origin start Crawl-delay apart.

Sites listen on 127.0.0.2, the one address these tests allow, as in test_guarded_http.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest

from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.core.robots import MAX_ROBOTS_BYTES
from rag_pipeline.crawl.base import RobotsRefusal
from rag_pipeline.crawl.guarded_http import Disallowed, Refused, fetch, guarded_client
from rag_pipeline.crawl.local_crawler import LocalCrawler
from rag_pipeline.crawl.pushing import push_targets
from rag_pipeline.crawl.robots_cache import UNREACHABLE_TTL_S, RobotsCache
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.store import schedule
from rag_pipeline_tests.harness import TOKEN

ALLOWED = parse_networks("127.0.0.2/32")
AGENT = "rag-test/1"


class TimedSite(LoopbackSite):
    """A site that notes when each request arrived (the handler looks every page up first)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.started: list[tuple[str, float]] = []

    def lookup(self, path):
        self.started.append((path, time.monotonic()))
        return super().lookup(path)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def public():
    with TimedSite(host="127.0.0.2") as s:
        yield s


def robots(site: LoopbackSite, text: str, **kw) -> None:
    site.set_page("/robots.txt", text, content_type="text/plain", **kw)


def local(receiver: str, **kw) -> LocalCrawler:
    kw.setdefault("user_agent", AGENT)
    return LocalCrawler(callback_url=f"{receiver}/webhook?token={TOKEN}", allowed_networks=ALLOWED, **kw)


def push_all(conn, crawler: LocalCrawler, urls: list[str]):
    """Pushed as the push job does, so that each failure lands on its pushes row."""
    with conn.transaction():
        rows = [schedule.register(conn, u, u, timedelta(days=1), explicit=True) for u in urls]
    try:
        return push_targets(conn, crawler, [schedule.Target(r.page_url, r.crawl_url) for r in rows],
                            reason="seed", drain_timeout_s=30)
    finally:
        crawler.close()


def push_rows(conn) -> dict[str, tuple[str, str | None]]:
    rows = conn.execute("SELECT url, result, error FROM pushes").fetchall()
    return {url: (result, error) for url, result, error in rows}


def delivered(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT pushed_url FROM deliveries")}


def cache(clock=time.monotonic, ttl_s: float = 3600) -> tuple[RobotsCache, httpx.Client]:
    client = guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=5)
    return RobotsCache(client, agent=AGENT, ttl_s=ttl_s, deadline_s=5, clock=clock), client


def test_a_disallowed_page_is_never_fetched_and_its_push_says_which_rule(public, receiver, conn):
    robots(public, "User-agent: *\nDisallow: /private/\nAllow: /private/open\n")
    for path in ("/private/secret", "/private/open.html", "/public"):
        public.set_page(path, f"<h1>{path}</h1>")
    urls = {p: public.url(p) for p in ("/private/secret", "/private/open.html", "/public")}
    report = push_all(conn, local(receiver), list(urls.values()))
    assert (report.pushed, report.failed, report.disallowed) == (2, 0, 1)   # a verdict, no crawler failure
    rows = push_rows(conn)
    assert rows[urls["/private/secret"]] == (
        "disallowed", "robots.txt: Disallow: /private/ (group for '*')")
    assert rows[urls["/public"]][0] == rows[urls["/private/open.html"]][0] == "pushed"
    assert public.hits["/private/secret"] == 0
    assert public.hits["/public"] == public.hits["/private/open.html"] == 1   # Allow: the longer match
    assert delivered(conn) == {urls["/public"], urls["/private/open.html"]}


def test_a_redirect_into_a_disallowed_path_is_not_followed(public, receiver, conn):
    robots(public, "User-agent: *\nDisallow: /private/\n")
    public.redirect("/moved", "/private/target", status=302)
    public.set_page("/private/target", "<h1>secret</h1>")
    report = push_all(conn, local(receiver), [public.url("/moved")])
    assert (report.pushed, report.failed, report.disallowed) == (0, 0, 1)
    result, error = push_rows(conn)[public.url("/moved")]
    assert result == "disallowed"
    assert error == ("robots.txt: Disallow: /private/ (group for '*') "
                     f"(redirected from {public.url('/moved')})")
    assert public.hits["/moved"] == 1 and public.hits["/private/target"] == 0
    assert delivered(conn) == set()


def test_the_hook_sees_every_hop_before_it_is_requested(public):
    public.redirect("/a", "/b", status=302)
    public.set_page("/b", "<h1>B</h1>")
    seen: list[str] = []
    with guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=5) as client:
        with fetch(client, public.url("/a"), deadline_s=5, check=lambda u: seen.append(u)) as answer:
            assert answer.status == 200
        with pytest.raises(Disallowed, match=r"^no B \(redirected from "):
            with fetch(client, public.url("/a"), deadline_s=5,
                       check=lambda u: "no B" if u.endswith("/b") else None):
                pass
    assert seen == [public.url("/a"), public.url("/b")]
    assert public.hits["/a"] == 2 and public.hits["/b"] == 1


def test_robots_txt_is_fetched_once_for_many_pages_of_a_site(public, receiver, conn):
    robots(public, "User-agent: *\nDisallow: /nothing-here\n", delay_s=0.3)   # slow: all workers ask at once
    urls = [public.url(f"/p{i}") for i in range(10)]
    for i in range(10):
        public.set_page(f"/p{i}", f"<h1>Page {i}</h1>")
    report = push_all(conn, local(receiver, workers=8, per_host=8), urls)
    assert (report.pushed, report.failed) == (10, 0)
    assert public.hits["/robots.txt"] == 1
    assert delivered(conn) == set(urls)


def test_concurrent_askers_share_one_fetch_and_the_ttl_ends_it(public):
    robots(public, "User-agent: *\nDisallow: /private/\n", delay_s=0.3)
    clock = FakeClock()
    rules, client = cache(clock, ttl_s=60)
    with client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: rules.why_disallowed(public.url(f"/private/{i}")), range(8)))
        assert public.hits["/robots.txt"] == 1
        assert answers == ["robots.txt: Disallow: /private/ (group for '*')"] * 8
        clock.now += 59
        assert rules.rules_for(public.url("/x")) is not None and public.hits["/robots.txt"] == 1
        robots(public, "User-agent: *\nAllow: /\n")
        clock.now += 2
        assert rules.why_disallowed(public.url("/private/1")) is None
        assert public.hits["/robots.txt"] == 2


def test_a_missing_robots_txt_allows_everything(public, receiver, conn):
    public.set_page("/page", "<h1>Page</h1>")      # no /robots.txt: the site answers 404
    report = push_all(conn, local(receiver), [public.url("/page")])
    assert (report.pushed, report.failed) == (1, 0)
    assert public.hits["/robots.txt"] == 1 and public.hits["/page"] == 1
    assert delivered(conn) == {public.url("/page")}


def test_an_unreachable_robots_txt_blocks_the_site_and_says_so(public, receiver, conn):
    robots(public, "down for maintenance", status=500)
    public.set_page("/page", "<h1>Page</h1>")
    report = push_all(conn, local(receiver), [public.url("/page")])
    assert (report.pushed, report.failed) == (0, 1)
    result, error = push_rows(conn)[public.url("/page")]
    assert result == "failed" and error.startswith("robots.txt unreachable (answered 500): nothing on ")
    assert public.hits["/page"] == 0 and delivered(conn) == set()


@pytest.mark.parametrize("status", [503, 429])
def test_an_unreachable_robots_txt_is_asked_again_after_a_short_while(public, status):
    robots(public, "down", status=status)
    clock = FakeClock()
    rules, client = cache(clock, ttl_s=86400)
    with client:
        assert f"answered {status}" in rules.why_disallowed(public.url("/page"))
        clock.now += UNREACHABLE_TTL_S - 1
        assert f"answered {status}" in rules.why_disallowed(public.url("/page"))
        assert public.hits["/robots.txt"] == 1
        robots(public, "User-agent: *\nDisallow:\n")
        clock.now += 2
        assert rules.why_disallowed(public.url("/page")) is None
        assert public.hits["/robots.txt"] == 2


def test_a_robots_txt_past_the_size_limit_is_read_up_to_it(public):
    padding = "# filler line to make the file large\n" * (MAX_ROBOTS_BYTES // 30)
    robots(public, "User-agent: *\nDisallow: /private/\n" + padding + "Disallow: /late/\n")
    rules, client = cache()
    with client:
        assert rules.why_disallowed(public.url("/private/x")) is not None
        assert rules.why_disallowed(public.url("/late/x")) is None       # past the limit: not read


@pytest.fixture
def internal():
    """A service on 127.0.0.1, an address the guard refuses (what a hostile redirect points at)."""
    with LoopbackSite(host="127.0.0.1") as s:
        s.set_page("/robots.txt", "User-agent: *\nDisallow:\n", content_type="text/plain")
        yield s


def test_a_robots_txt_redirected_to_a_refused_address_disallows_the_site(public, internal, receiver, conn):
    """RFC 9309 2.3.1.4: a robots.txt that cannot be had disallows everything. One redirected to
    an address the guard refuses was taken for "no robots.txt", and every page was crawled; and
    it was asked again for every hop of every page."""
    public.redirect("/robots.txt", internal.url("/robots.txt"), status=301)
    for i in range(3):
        public.set_page(f"/p{i}", f"<h1>Page {i}</h1>")
    urls = [public.url(f"/p{i}") for i in range(3)]
    report = push_all(conn, local(receiver, workers=1), urls)
    assert (report.pushed, report.failed) == (0, 3)
    for url in urls:
        result, error = push_rows(conn)[url]
        assert result == "failed" and error.startswith("robots.txt unreachable (refused "), error
        assert "loopback" in error and f"nothing on {public.base_url.rstrip('/')} is fetched" in error, error
    assert all(public.hits[f"/p{i}"] == 0 for i in range(3)) and delivered(conn) == set()
    assert public.hits["/robots.txt"] == 1 and internal.hits["/robots.txt"] == 0


def test_a_refused_robots_txt_is_remembered_like_an_answer(public, internal):
    public.redirect("/robots.txt", internal.url("/robots.txt"), status=302)
    clock = FakeClock()
    rules, client = cache(clock, ttl_s=3600)
    with client:
        for _ in range(3):
            assert "robots.txt unreachable (refused" in rules.why_disallowed(public.url("/page"))
            with pytest.raises(Refused, match="loopback"):     # a reading names why
                rules.rules_for(public.url("/page"))
        clock.now += UNREACHABLE_TTL_S + 1          # not an outage: the guard's verdict holds the TTL
        assert rules.why_disallowed(public.url("/page"))
        assert public.hits["/robots.txt"] == 1
        clock.now += 3600
        rules.why_disallowed(public.url("/page"))
        assert public.hits["/robots.txt"] == 2
    assert internal.hits["/robots.txt"] == 0


def test_robots_txt_of_a_refused_origin_leaves_the_refusal_to_the_hop():
    """The origin itself refused: its pages are refused as they connect, with the guard's reason
    naming the page; robots.txt is asked once, its refusal remembered for a reading to report."""
    rules, client = cache()
    with client:
        for _ in range(2):
            assert rules.why_disallowed("http://127.0.0.1:9/page") is None
            with pytest.raises(Refused, match="loopback"):
                rules.rules_for("http://127.0.0.1:9/page")


def test_fetches_of_one_site_start_crawl_delay_apart(public, receiver, conn):
    robots(public, "User-agent: *\nCrawl-delay: 1\n")
    urls = [public.url(f"/d{i}") for i in range(3)]
    for i in range(3):
        public.set_page(f"/d{i}", f"<h1>D{i}</h1>")
    report = push_all(conn, local(receiver, per_host=2), urls)
    assert (report.pushed, report.failed) == (3, 0)
    starts = sorted(t for path, t in public.started if path.startswith("/d"))
    assert len(starts) == 3
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:])]
    assert min(gaps) >= 0.9, gaps


def test_the_group_for_the_agent_s_product_token_is_the_one_obeyed(public, receiver, conn):
    robots(public, "User-agent: rag-test\nDisallow: /\n\nUser-agent: *\nAllow: /\n")
    public.set_page("/page", "<h1>Page</h1>")
    blocked = local(receiver, user_agent="rag-test/1")
    other = local(receiver, user_agent="other/1")
    try:
        mine, theirs = blocked.push(public.url("/page")), other.push(public.url("/page"))
        assert blocked.drain(20) == 0 and other.drain(20) == 0
        assert blocked.delivery_failures([mine.rid]) == {}      # not fetched, reported apart: no failure
        assert blocked.robots_refusals([mine.rid]) == {
            mine.rid: RobotsRefusal("robots.txt: Disallow: / (group for 'rag-test')", 3600.0, public.url("/page"))}
        assert other.delivery_failures([theirs.rid]) == other.robots_refusals([theirs.rid]) == {}
    finally:
        blocked.close()
        other.close()
    assert public.hits["/page"] == 1 and delivered(conn) == {public.url("/page")}


def test_obey_robots_off_fetches_a_disallowed_page(public, receiver, conn):
    robots(public, "User-agent: *\nDisallow: /\n")
    public.set_page("/page", "<h1>Page</h1>")
    report = push_all(conn, local(receiver, obey_robots=False), [public.url("/page")])
    assert (report.pushed, report.failed) == (1, 0)
    assert public.hits["/page"] == 1 and public.hits["/robots.txt"] == 0
    assert delivered(conn) == {public.url("/page")}


def test_the_settings_reach_the_local_crawler():
    from rag_pipeline.crawl.factory import make_crawler
    from rag_pipeline.settings import Settings

    crawler = make_crawler(Settings(CRAWLER="local", CRAWLER_OBEY_ROBOTS="false"))
    try:
        assert crawler._robots is None
    finally:
        crawler.close()
    crawler = make_crawler(Settings(CRAWLER="local", CRAWLER_ROBOTS_TTL_S="90"))
    try:
        assert crawler._robots is not None and crawler._robots.ttl_s == 90
    finally:
        crawler.close()
