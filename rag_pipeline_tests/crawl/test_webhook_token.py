"""The generated token in $RAG_HOME/webhook_token: the receiver, `seed` (through the local crawler)
and `deliver` all find it without WEBHOOK_TOKEN in the environment, and a refused delivery fails."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline_tests.harness import TOKEN
from rag_pipeline_tests.servers import serve
from webhook_sensor.app import create_app


def write_token_file(token: str) -> None:
    path = get_settings().rag_home / "webhook_token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")


@pytest.fixture
def local_seed(receiver, site, database_url, monkeypatch, tmp_path):
    """The CLI's environment as in the user's own shell after `make run`: no WEBHOOK_TOKEN, the
    local crawler delivering to the receiver on WEBHOOK_PORT."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("WEBHOOK_PORT", str(urlsplit(receiver).port))
    monkeypatch.setenv("CRAWLER_DELIVERY_RETRIES", "3")
    get_settings.cache_clear()
    site.set_page("/a", "<h1>Alpha</h1><p>first page</p>")
    site.set_page("/b", "<h1>Beta</h1><p>second page</p>")
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"{site.url('/a')} every=1d\n{site.url('/b')} every=1d\n")
    return seeds


def refusals(receiver: str) -> int:
    text = httpx.get(receiver + "/metrics", headers={"X-Webhook-Token": TOKEN}, timeout=5).text
    found = re.search(r'^webhook_refusals_total\{reason="bad_token"\} (\S+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0



def token_receiver(seen: list, where):
    """A bare ASGI receiver that answers `stored` and records (where(scope), its X-Webhook-Token)."""
    async def receiver(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        seen.append((where(scope), headers.get("x-webhook-token")))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"status": "stored"}'})

    return receiver

def test_seed_delivers_with_the_token_file_when_webhook_token_is_unset(local_seed, conn):
    write_token_file(TOKEN)
    result = CliRunner().invoke(cli, ["seed", str(local_seed), "--wait", "30"])
    assert result.exit_code == 0, result.output
    assert "pushed 2, failed 0" in result.output
    pushed = dict(conn.execute("SELECT rid, result FROM pushes").fetchall())
    delivered = {r[0] for r in conn.execute("SELECT rid FROM deliveries").fetchall()}
    assert set(pushed.values()) == {"pushed"} and delivered == set(pushed)


def test_seed_fails_when_the_receiver_refuses_the_token(local_seed, receiver, site, conn):
    write_token_file("not-the-receivers-token")
    result = CliRunner().invoke(cli, ["seed", str(local_seed), "--wait", "30"])
    assert result.exit_code == 1, result.output
    assert "pushed 0, failed 2" in result.output
    assert "receiver refused the delivery: 401 missing or wrong token" in result.output
    rows = conn.execute("SELECT result, error FROM pushes").fetchall()
    assert [r[0] for r in rows] == ["failed", "failed"]
    assert all("receiver refused the delivery: 401 missing or wrong token" in r[1] for r in rows)
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0
    assert refusals(receiver) == 2                      # a refusal is final: never retried
    assert site.hits["/a"] == 1 and site.hits["/b"] == 1
    # Due again like any failed push (5 minutes), not a whole cadence (1 day) later.
    waits = [r[0] for r in conn.execute("SELECT next_crawl_at - now() FROM pages").fetchall()]
    assert len(waits) == 2 and all(w <= timedelta(minutes=5) for w in waits)


def test_receiver_reads_the_token_file_when_webhook_token_is_unset(database_url, conn, tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)     # `deliver` records the push it answers
    get_settings.cache_clear()
    write_token_file(TOKEN)
    page = tmp_path / "page.md"
    page.write_text("# Page\n\ntext\n")
    with serve(create_app(Settings(), database_url=database_url), health_path="/healthz") as base:
        ok = CliRunner().invoke(cli, ["deliver", "https://example.com/p", str(page),
                                      "--webhook", base + "/webhook", "--rid", "r-ok"])
        assert ok.exit_code == 0, ok.output
        assert '"status":"stored"' in ok.output
        write_token_file("wrong")
        bad = CliRunner().invoke(cli, ["deliver", "https://example.com/p", str(page),
                                       "--webhook", base + "/webhook", "--rid", "r-bad"])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == ["Error: webhook answered 401: missing or wrong token"]
    assert [r[0] for r in conn.execute("SELECT rid FROM deliveries").fetchall()] == ["r-ok"]
    # Each delivery answers a manual push: the refused one failed, with the receiver's reason.
    assert conn.execute("SELECT rid, result, error FROM pushes ORDER BY push_id").fetchall() == [
        ("r-ok", "pushed", None), (None, "failed", "webhook answered 401: missing or wrong token")]


def test_deliver_sends_the_token_in_a_header_never_in_the_url(database_url, tmp_path, monkeypatch):
    """URLs end up in proxies' and access logs: `deliver` sends X-Webhook-Token, as the local crawler does."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("WEBHOOK_TOKEN", "header-only-token")
    get_settings.cache_clear()
    page = tmp_path / "page.md"
    page.write_text("# Page\n")
    seen: list[tuple[str, str | None]] = []
    receiver = token_receiver(seen, lambda scope: scope["query_string"].decode())

    with serve(receiver) as base:
        result = CliRunner().invoke(cli, ["deliver", "https://example.com/p", str(page), "--webhook", base + "/webhook"])
    assert result.exit_code == 0, result.output
    assert seen == [("", "header-only-token")]


def test_deliver_reports_a_non_json_refusal_on_one_line(database_url, tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    page = tmp_path / "page.md"
    page.write_text("# Page\n")

    async def proxy(scope, receive, send):  # a proxy in front of a dead receiver
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b"<html>\n<body>\n<h1>502 Bad Gateway</h1>\n</body>\n</html>\n"
        await send({"type": "http.response.start", "status": 502,
                    "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": body})

    write_token_file(TOKEN)
    with serve(proxy) as base:
        result = CliRunner().invoke(cli, ["deliver", "https://example.com/p", str(page),
                                          "--webhook", base + "/webhook"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: webhook answered 502: 502 Bad Gateway"]


def test_a_delivery_that_never_got_through_fails_its_push_unless_it_was_stored(receiver, site, conn):
    """5xx answers are retried, then the push fails; but a delivery the receiver stored before its
    answer was lost is delivered, and its push stays `pushed`."""
    from rag_pipeline.core.addresses import parse_networks
    from rag_pipeline.crawl.local_crawler import LocalCrawler
    from rag_pipeline.crawl.pushing import push_targets
    from rag_pipeline.store import schedule

    mode = {"store": False}

    async def front(scope, receive, send):  # answers 503 always, after forwarding when asked to
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while (message := await receive()).get("more_body"):
            body += message.get("body", b"")
        body += message.get("body", b"")
        if mode["store"]:
            headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in (b"host", b"content-length")}
            async with httpx.AsyncClient() as client:
                await client.post(f"{receiver}/webhook?token={TOKEN}", headers=headers, content=body)
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": "receiver down"}'})

    site.set_page("/down", "<h1>Down</h1>")
    site.set_page("/lost", "<h1>Lost answer</h1>")
    with serve(front) as base:
        crawler = LocalCrawler(callback_url=base + "/webhook", user_agent="rag-test/1", delivery_retries=1,
                               delivery_backoff_s=0.01, allowed_networks=parse_networks("127.0.0.0/8"))
        try:
            reports = {}
            for path in ("/down", "/lost"):
                mode["store"] = path == "/lost"
                with conn.transaction():
                    row = schedule.register(conn, site.url(path), site.url(path), timedelta(days=1), explicit=True)
                reports[path] = push_targets(conn, crawler, [schedule.Target(row.page_url, row.crawl_url)],
                                             reason="seed", drain_timeout_s=20)
        finally:
            crawler.close()
    assert (reports["/down"].pushed, reports["/down"].failed) == (0, 1)
    assert reports["/down"].errors == [
        f"{site.url('/down')}: delivery failed after 2 attempt(s): receiver answered 503 receiver down"]
    assert site.hits["/down"] == 1                    # fetched once, its delivery tried twice
    assert (reports["/lost"].pushed, reports["/lost"].failed) == (1, 0)
    # The push run's metadata names what it pushed, and what failed with why.
    assert reports["/lost"].as_metadata()["pushed_urls"] == site.url("/lost")
    assert reports["/down"].as_metadata()["pushed_urls"] == "" and site.url("/down") in reports["/down"].as_metadata()["errors"]
    results = dict(conn.execute("SELECT url, result FROM pushes").fetchall())
    assert results == {site.url("/down"): "failed", site.url("/lost"): "pushed"}


def test_the_local_crawler_sends_the_token_in_a_header_never_in_the_url(site, monkeypatch):
    """URLs end up in proxies' and access logs: the receiver's token rides in X-Webhook-Token."""
    from rag_pipeline.crawl.factory import make_crawler

    seen: list[tuple[str, str | None]] = []
    receiver = token_receiver(seen, lambda scope: scope["path"] + "?" + scope["query_string"].decode())

    site.set_page("/p", "<h1>P</h1>")
    with serve(receiver) as base:
        monkeypatch.delenv("CRAWLER_CALLBACK_URL", raising=False)
        monkeypatch.setenv("WEBHOOK_PORT", str(urlsplit(base).port))
        monkeypatch.setenv("WEBHOOK_TOKEN", "header-only-token")
        get_settings.cache_clear()
        crawler = make_crawler(get_settings())
        try:
            crawler.push(site.url("/p"))
            assert crawler.drain(20) == 0
        finally:
            crawler.close()
    assert seen == [("/webhook?", "header-only-token")]
