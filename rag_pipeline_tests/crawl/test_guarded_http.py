"""The network guard on real loopback sockets: every hop checked, connections pinned to the
address checked, one content encoding inflated within a budget, one deadline per fetch.

Loopback sites listen on 127.0.0.2, the one address these tests allow; 127.0.0.1 stands for any
internal service a hostile redirect could point at.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import tracemalloc
import zlib
from datetime import timedelta

import httpcore
import httpx
import pytest

from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.crawl.fetching import fetch_markdown
from rag_pipeline.crawl.guarded_http import FetchError, Refused, _GuardedTransport, fetch, guarded_client
from rag_pipeline.crawl.local_crawler import LocalCrawler
from rag_pipeline.crawl.pushing import push_targets
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.store import schedule
from rag_pipeline_tests.harness import TOKEN

ALLOWED = parse_networks("127.0.0.2/32")
MB = 1024 * 1024


@pytest.fixture
def public():
    """A site on the one allowed address, standing for a public web site."""
    with LoopbackSite(host="127.0.0.2") as s:
        yield s


@pytest.fixture
def internal():
    """A service on 127.0.0.1, standing for what a redirect must never reach."""
    with LoopbackSite(host="127.0.0.1") as s:
        s.set_page("/secret", "<h1>instance credentials</h1>")
        yield s


def client(**kw) -> httpx.Client:
    return guarded_client(allowed=ALLOWED, user_agent="rag-test/1", timeout_s=5, **kw)


def test_the_transport_still_guards_httpx_s_pool():
    """httpx's private `_pool` is where the guarded backend goes: an upgrade that moves it must
    fail here, not leave fetches unguarded."""
    transport = _GuardedTransport(ALLOWED)
    assert isinstance(transport._pool, httpcore.ConnectionPool)
    assert type(transport._pool._network_backend).__name__ == "_GuardedBackend"


@pytest.mark.parametrize("target, why", [
    ("http://127.0.0.1:{port}/secret", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.0.0.7/admin", "private"),
    ("http://[::1]:{port}/secret", "loopback"),
])
def test_a_redirect_to_an_internal_address_is_refused_at_every_hop(public, internal, target, why):
    target = target.format(port=internal._server.server_address[1])
    public.redirect("/a", "/b", status=302)            # an allowed hop first, then the hostile one
    public.redirect("/b", target, status=302)
    with client() as c, pytest.raises(Refused) as refused:
        with fetch(c, public.url("/a"), deadline_s=10):
            pass
    assert why in str(refused.value) and "redirected from " + public.url("/b") in str(refused.value)
    assert internal.hits["/secret"] == 0
    assert public.hits["/a"] == public.hits["/b"] == 1


def test_a_name_resolving_to_an_internal_address_is_refused_and_never_connected():
    def resolver(host, port, **kw):
        assert host == "metadata.attacker.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    with client(resolve=resolver) as c, pytest.raises(Refused, match="resolves to 169.254.169.254 is a link-local"):
        with fetch(c, "http://metadata.attacker.test/", deadline_s=5):
            pass


def test_a_name_with_one_internal_answer_among_public_ones_is_refused(public):
    def resolver(host, port, **kw):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ("127.0.0.2", "127.0.0.1")]

    with client(resolve=resolver) as c, pytest.raises(Refused, match="127.0.0.1 is a loopback"):
        with fetch(c, f"http://mixed.test:{public._server.server_address[1]}/", deadline_s=5):
            pass
    assert public.hits["/"] == 0


def test_a_dns_answer_that_changes_after_the_check_never_reaches_the_new_address(public, internal):
    """Rebinding: the name is resolved once per connection, and the socket goes to the address
    that passed. The second answer (internal) is never connected to, only refused."""
    port = public._server.server_address[1]
    answers = iter(["127.0.0.2", "127.0.0.1", "127.0.0.1"])
    calls = []

    def resolver(host, p, **kw):
        ip = next(answers)
        calls.append(ip)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, p))]

    public.set_page("/page", "<h1>public</h1>")
    with client(resolve=resolver) as c:
        with fetch(c, f"http://rebind.test:{port}/page", deadline_s=5) as answer:
            assert answer.status == 200 and b"public" in answer.read(MB)
        assert calls == ["127.0.0.2"]                      # checked once, connected to that address
        c.close()                                          # the next fetch needs a new connection
    with client(resolve=resolver) as c2, pytest.raises(Refused, match="127.0.0.1 is a loopback"):
        with fetch(c2, f"http://rebind.test:{port}/page", deadline_s=5):
            pass
    assert calls == ["127.0.0.2", "127.0.0.1"]
    assert public.hits["/page"] == 1


def _gzip_stream(total: int, layers: int) -> bytes:
    """`total` zero bytes gzip'd `layers` times, without ever holding them uncompressed."""
    inner = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block, parts = bytes(MB), []
    for _ in range(total // MB):
        parts.append(inner.compress(block))
    parts.append(inner.flush())
    data = b"".join(parts)
    for _ in range(layers - 1):
        data = gzip.compress(data, mtime=0)
    return data


@pytest.mark.parametrize("layers, encoding, why", [
    (2, "gzip, gzip", "2 content encodings"),
    (1, "gzip", "larger than"),
])
def test_an_inflation_bomb_is_refused_with_memory_bounded(public, layers, encoding, why):
    body = _gzip_stream(200 * MB, layers)
    assert len(body) < 1 * MB
    public.set_raw("/bomb", body, content_type="text/html", headers={"Content-Encoding": encoding})
    tracemalloc.start()
    try:
        with client() as c, pytest.raises(FetchError, match=why):
            with fetch(c, public.url("/bomb"), deadline_s=30) as answer:
                answer.read(20 * MB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * MB, f"peak {peak / MB:.0f} MB while refusing a {len(body)}-byte bomb"


def test_one_gzip_encoding_is_inflated(public):
    public.set_raw("/z", gzip.compress(b"<h1>Zipped</h1>"), content_type="text/html",
                   headers={"Content-Encoding": "gzip"})
    with client() as c:
        fetched = fetch_markdown(c, public.url("/z"))
    assert (fetched.crawler_status, fetched.original_status) == (200, 200)
    assert fetched.markdown == "# Zipped\n"


def test_a_site_that_drips_its_body_is_cut_at_the_fetch_deadline(public):
    public.set_raw("/slow", b"x" * 64 * 1024, content_type="text/plain", drip_s=0.05)   # 3.2 s in all
    started = time.monotonic()
    with client() as c:
        fetched = fetch_markdown(c, public.url("/slow"), deadline_s=0.6)
    assert time.monotonic() - started < 2.5
    assert fetched.crawler_status == 520 and "deadline" in fetched.error


class DrippingServer:
    """A raw socket server on 127.0.0.2 that answers every connection with `prefix`, then one
    byte every `every_s` seconds for as long as the client stays: a response head (or a TLS
    handshake record) that does not end, each byte well within any read timeout. It hangs up
    after `gives_up_s`, so that a fetch that is not cut fails the test instead of hanging it."""

    def __init__(self, prefix: bytes, every_s: float = 0.3, gives_up_s: float = 8.0):
        self.prefix, self.every_s, self.gives_up_s = prefix, every_s, gives_up_s
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> DrippingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                conn.recv(65536)              # the request (or ClientHello)
                conn.sendall(self.prefix)
                ends = time.monotonic() + self.gives_up_s
                while not self.stop.wait(self.every_s) and time.monotonic() < ends:
                    conn.sendall(b"x")
            except OSError:                   # the client hung up: what the deadline must make it do
                return


@pytest.mark.parametrize("scheme, prefix", [
    ("http", b"HTTP/1.1 200 OK\r\nX-Slow: "),                  # a header that never ends
    ("https", b"\x16\x03\x03\x40\x00"),                         # a 16 KiB handshake record, dripped
])
def test_a_site_that_drips_its_response_head_is_cut_at_the_fetch_deadline(scheme, prefix):
    """httpx's timeouts are per read: a byte every 0.3 s never trips a 5 s read timeout, so only
    the fetch's deadline can end it, whether the head, the handshake or the body drips."""
    with DrippingServer(prefix) as server, client() as c:
        url = f"{scheme}://127.0.0.2:{server.port}/page"
        started = time.monotonic()
        with pytest.raises(FetchError, match="deadline"):
            with fetch(c, url, deadline_s=1.5):
                pass
        assert time.monotonic() - started < 2.5
        # The page fetch, as a crawler worker makes it: a failed crawl within the deadline.
        started = time.monotonic()
        fetched = fetch_markdown(c, url, deadline_s=1.5)
        assert time.monotonic() - started < 2.5
        assert fetched.crawler_status == 520 and "deadline" in fetched.error, fetched.error


def test_robots_txt_and_sitemaps_that_drip_are_cut_at_the_fetch_deadline():
    """robots.txt and sitemaps are read through the same fetch: a dripping one ends at the deadline
    (robots.txt then counts as unreachable, which disallows the site for a while)."""
    from rag_pipeline.crawl.robots_cache import RobotsCache

    with DrippingServer(b"HTTP/1.1 200 OK\r\nX-Slow: ") as server, client() as c:
        robots = RobotsCache(c, agent="rag-test/1", ttl_s=60, deadline_s=1.5)
        started = time.monotonic()
        reason = robots.why_disallowed(f"http://127.0.0.2:{server.port}/page")
        assert time.monotonic() - started < 2.5
        assert reason and "robots.txt unreachable" in reason and "deadline" in reason, reason


def test_a_redirect_loop_is_a_failed_crawl_that_names_the_loop(public):
    public.redirect("/a", "/b")
    public.redirect("/b", "/a")
    with client() as c:
        fetched = fetch_markdown(c, public.url("/a"))
    assert fetched.crawler_status == 520
    assert fetched.error == f"redirect loop: {public.url('/a')} → {public.url('/b')} → {public.url('/a')}"


def test_proxy_variables_cannot_route_around_the_guard(public, internal, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", internal.base_url)
    monkeypatch.setenv("ALL_PROXY", internal.base_url)
    public.set_page("/p", "<h1>direct</h1>")
    with client() as c:
        assert fetch_markdown(c, public.url("/p")).markdown == "# direct\n"
    assert sum(internal.hits.values()) == 0


def test_the_local_crawler_delivers_nothing_of_a_refused_redirect_and_its_push_says_why(
        public, internal, receiver, conn):
    public.redirect("/moved", internal.url("/secret"), status=302)
    crawler = LocalCrawler(callback_url=f"{receiver}/webhook?token={TOKEN}", user_agent="rag-test/1",
                           allowed_networks=ALLOWED)
    try:
        with conn.transaction():
            row = schedule.register(conn, public.url("/moved"), public.url("/moved"), timedelta(days=1),
                                    explicit=True)
        report = push_targets(conn, crawler, [schedule.Target(row.page_url, row.crawl_url)],
                              reason="seed", drain_timeout_s=20)
    finally:
        crawler.close()
    assert (report.pushed, report.failed) == (0, 1)
    assert "loopback" in report.errors[0] and internal.url("/secret") in report.errors[0]
    result, error = conn.execute("SELECT result, error FROM pushes").fetchone()
    assert result == "failed" and "redirected from " + public.url("/moved") in error
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0
    assert internal.hits["/secret"] == 0


def test_the_local_crawler_refuses_an_internal_address_at_the_push(receiver):
    crawler = LocalCrawler(callback_url=receiver + "/webhook", user_agent="rag-test/1", allowed_networks=ALLOWED)
    try:
        for url in ("http://127.0.0.1:9/x", "http://localhost/x", "http://[::ffff:169.254.169.254]/"):
            with pytest.raises(Exception, match="refused") as refused:
                crawler.push(url)
            assert refused.value.status == 403
    finally:
        crawler.close()
