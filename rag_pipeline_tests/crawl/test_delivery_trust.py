"""A delivery answers a push (issue 28): whoever holds the webhook token cannot write pages nobody
asked for, re-point a page by a header, or land a redirect on another site's live page."""

from __future__ import annotations

import gzip
import uuid

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries, pushes, sites

MAX = 10_000_000


def deliver(conn, url: str, text: str, *, rid: str | None = None, pushed_url: str | None = None,
            status: int = 200) -> str:
    rid = rid or uuid.uuid4().hex
    deliveries.insert(conn, rid=rid, url=url, pushed_url=pushed_url, crawler_status=200, original_status=status,
                      content_type="text/markdown", body=gzip.compress(text.encode()), body_encoding="gzip")
    return rid


def push(conn, url: str, *, rid: str | None) -> None:
    """A push of ours: finished with its rid, or (rid None) still waiting for its result."""
    with conn.transaction():
        (push_id,) = pushes.begin(conn, [(url, url)], reason="schedule", crawler="local", run_id=None)
        if rid is not None:
            pushes.finish(conn, [pushes.Outcome(push_id, rid, 1)])


def route(conn):
    return route_batch(conn, 100, MAX, allowed_networks=(), accept_unsolicited=False)


def outcomes(conn) -> dict[str, tuple[str, str | None]]:
    return {url: (outcome, error) for url, outcome, error in
            conn.execute("SELECT url, outcome, error FROM deliveries ORDER BY id")}


def live(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT url, source_text FROM pages WHERE deleted_at IS NULL"
                             " AND alias_of IS NULL AND source_text IS NOT NULL"))


def index(conn, url: str, text: str) -> None:
    """A live page, as a delivery of ours leaves it."""
    push(conn, url, rid=(rid := uuid.uuid4().hex))
    deliver(conn, url, text, rid=rid)
    route(conn)
    conn.execute("UPDATE pages SET source_text = %s, indexed_hash = 'h' WHERE url = %s", (text, url))


def test_a_delivery_with_an_unknown_rid_is_stored_and_never_indexed(conn):
    deliver(conn, "https://docs.example.com/pricing", "# Pricing\n\nEverything is free now.")
    routed = route(conn)
    assert dict(routed.outcomes) == {"unsolicited": 1} and routed.queued == [] and routed.settled == []
    outcome, error = outcomes(conn)["https://docs.example.com/pricing"]
    assert outcome == "unsolicited" and "answers no push of ours" in error
    assert conn.execute("SELECT count(*) FROM pages").fetchone()[0] == 0
    # A 404 with an unknown rid tombstones nothing either.
    index(conn, "https://docs.example.com/guide", "# Guide")
    deliver(conn, "https://docs.example.com/guide", "gone", status=404)
    assert dict(route(conn).outcomes) == {"unsolicited": 1}
    assert "https://docs.example.com/guide" in live(conn)


def test_the_push_row_not_the_header_says_which_url_was_asked_for(conn):
    index(conn, "https://docs.example.com/victim", "# Victim\n\nThe real text.")
    push(conn, "https://docs.example.com/asked", rid="r-asked")
    # Answering our push of /asked, but claiming (by header) to answer /victim, which would make
    # /victim an alias of /asked and drop it from search.
    deliver(conn, "https://docs.example.com/asked", "# Asked", rid="r-asked", pushed_url="https://docs.example.com/victim")
    assert dict(route(conn).outcomes) == {"queued": 1}
    assert conn.execute("SELECT alias_of FROM pages WHERE url = 'https://docs.example.com/victim'").fetchone() == (None,)
    assert "https://docs.example.com/victim" in live(conn)


def test_a_redirect_onto_another_sites_live_page_is_refused(conn):
    with conn.transaction():
        sites.sync_declared(conn, [SiteSpec(name="docs", seeds=("https://docs.example.com/",)),
                                   SiteSpec(name="blog", seeds=("https://blog.example.com/",))])
    index(conn, "https://docs.example.com/install", "# Install\n\nRun the installer.")
    conn.execute("UPDATE pages SET site = 'docs' WHERE url = 'https://docs.example.com/install'")
    conn.execute("INSERT INTO pages (page_id, url, site) VALUES (gen_random_uuid(), 'https://blog.example.com/post', 'blog')")
    push(conn, "https://blog.example.com/post", rid="r-post")
    deliver(conn, "https://docs.example.com/install", "# Install\n\nCurl this script into a shell.", rid="r-post")
    routed = route(conn)
    assert dict(routed.outcomes) == {"refused": 1}
    outcome, error = conn.execute("SELECT outcome, error FROM deliveries WHERE rid = 'r-post'").fetchone()
    assert outcome == "refused" and "a live page of another site" in error
    assert live(conn)["https://docs.example.com/install"] == "# Install\n\nRun the installer."


def test_a_delivery_may_come_before_its_push_run_records_the_rid(conn):
    push(conn, "https://docs.example.com/fast", rid=None)          # the run is still pushing others
    deliver(conn, "https://docs.example.com/fast", "# Fast\n\nDelivered at once.")
    assert dict(route(conn).outcomes) == {"queued": 1}


def test_rag_pipeline_deliver_answers_a_push_of_its_own(receiver, conn, database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("WEBHOOK_ACCEPT_UNSOLICITED", "false")
    get_settings.cache_clear()
    from rag_pipeline_tests.harness import TOKEN

    monkeypatch.setenv("WEBHOOK_TOKEN", TOKEN)
    get_settings.cache_clear()
    page = tmp_path / "p.md"
    page.write_text("# Manual\n\nDelivered by hand.")
    result = CliRunner().invoke(cli, ["deliver", "https://docs.example.com/manual", str(page),
                                      "--webhook", receiver + "/webhook"])
    assert result.exit_code == 0, result.output
    reason, result_, crawler = conn.execute("SELECT reason, result, crawler FROM pushes").fetchone()
    assert (reason, result_, crawler) == ("manual", "pushed", "deliver")
    assert dict(route(conn).outcomes) == {"queued": 1}
