"""The whole loop on real parts: receiver → deliveries → sensor → runs → pgvector → search."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.chunking import chunk_markdown
from rag_pipeline.core.text import default_boilerplate_rules, normalize_markdown
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import deliver, openai_stack

A_URL = "https://docs.example.com/guide/"
A_KEY = "https://docs.example.com/guide"
B_URL = "https://example.com/b"
C_URL = "https://example.com/c"


def section(title: str, topic: str, n: int) -> str:
    paras = [
        f"Paragraph {i} of {title} explains {topic} in detail, with the steps an operator follows, "
        f"the settings that matter and the mistakes people make when they configure {topic} "
        f"for the first time on a production cluster." * 3
        for i in range(n)
    ]
    return f"## {title}\n\n" + "\n\n".join(paras)


PAGE_A_V1 = "# Operator guide\n\n" + "\n\n".join(
    [section("Installing", "the installer", 4), section("Upgrading", "rolling upgrades", 4),
     section("Backups", "snapshot backups", 4)]
)
PAGE_A_V2 = PAGE_A_V1.replace(
    "Paragraph 2 of Upgrading explains",
    "Paragraph 2 of Upgrading now covers zebra-striped canary releases and explains",
    1,
)
PAGE_B = "# Pricing\n\nThe quokka plan costs nine dollars a month and includes unlimited widgets."


def embed_texts(markdown: str, url: str) -> set[str]:
    text = normalize_markdown(markdown, default_boilerplate_rules(), url=url)
    max_tokens, overlap = get_settings().chunk_budget()
    return {c.embed_text for c in chunk_markdown(text, max_tokens, overlap)}


@pytest.fixture
def stack(database_url, monkeypatch):
    """Real receiver on loopback, fake OpenAI on loopback, real Dagster instance."""
    with FakeOpenAI(dimensions=256) as fake, openai_stack(database_url, monkeypatch, fake) as (base, pipeline):
        yield base, fake, pipeline


def page_row(conn, url):
    return conn.execute(
        "SELECT last_verified_at, last_changed_at, deleted_at, indexed_hash FROM pages WHERE url = %s", (url,)
    ).fetchone()


def search_json(question: str, k: int = 5) -> list[dict]:
    result = CliRunner().invoke(cli, ["search", question, "--k", str(k), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["results"]


def test_deliveries_become_cited_search_results(stack, conn):
    base, fake, pipeline = stack

    # A, new: one run, every chunk embedded once.
    deliver(base, A_URL, PAGE_A_V1)
    tick = pipeline.tick()
    assert tick.partitions == [A_KEY]
    assert pipeline.partitions() == [A_KEY]
    v1_texts = embed_texts(PAGE_A_V1, A_KEY)
    assert len(v1_texts) >= 3
    assert sorted(fake.inputs) == sorted(v1_texts)
    verified_1, changed_1, _, hash_1 = page_row(conn, A_KEY)

    # A again, unchanged: no run, no embedding; verified moves, changed does not.
    deliver(base, A_URL, PAGE_A_V1 + "\n\n\n")  # trailing blank lines normalize away
    tick = pipeline.tick()
    assert tick.partitions == []
    verified_2, changed_2, _, hash_2 = page_row(conn, A_KEY)
    assert verified_2 > verified_1 and changed_2 == changed_1 and hash_2 == hash_1
    assert len(fake.inputs) == len(v1_texts)

    # A changed: one run, and the embedder sees only the chunk texts that changed.
    fake_before = len(fake.inputs)
    deliver(base, A_URL, PAGE_A_V2)
    tick = pipeline.tick()
    assert tick.partitions == [A_KEY]
    new_inputs = fake.inputs[fake_before:]
    expected_new = embed_texts(PAGE_A_V2, A_KEY) - v1_texts
    assert 1 <= len(expected_new) < len(v1_texts)
    assert sorted(new_inputs) == sorted(expected_new)
    _, changed_3, _, hash_3 = page_row(conn, A_KEY)
    assert changed_3 > changed_2 and hash_3 != hash_2

    # B, then B gone.
    deliver(base, B_URL, PAGE_B)
    assert pipeline.tick().partitions == [B_URL]
    assert any(r["url"] == B_URL for r in search_json("quokka plan price"))
    deliver(base, B_URL, "Not found", original_status=404)
    assert pipeline.tick().partitions == []
    assert page_row(conn, B_URL)[2] is not None  # deleted_at: the row stays
    assert all(r["url"] != B_URL for r in search_json("quokka plan price", k=20))
    assert conn.execute(
        "SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s", (B_URL,)
    ).fetchone()[0] == 0

    # C with a crawler failure: recorded, nothing else.
    deliver(base, C_URL, "upstream error", crawler_status=503)
    assert pipeline.tick().partitions == []
    assert conn.execute("SELECT count(*) FROM pages WHERE url = %s", (C_URL,)).fetchone()[0] == 0
    assert conn.execute("SELECT outcome FROM deliveries WHERE url = %s", (C_URL,)).fetchone()[0] == "skipped"

    # One batch run per tick that had changed pages (A, A changed, B), each page on its partition.
    runs = pipeline.instance.get_runs()
    assert len(runs) == 3
    assert all(r.status == dg.DagsterRunStatus.SUCCESS and r.job_name == "index_batch" for r in runs)
    history = pipeline.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[A_KEY]), limit=10).records
    assert len(history) == 2 and {r.run_id for r in history} <= {r.run_id for r in runs}
    assert [r.asset_materialization.metadata["status"].value for r in history] == ["switched", "switched"]

    # Search cites A's new text with both timestamps.
    hits = search_json("zebra-striped canary releases")
    # Cited as crawled (a link that opens), keyed by the normalized URL (the partition).
    assert (hits[0]["url"], hits[0]["page_url"]) == (A_URL, A_KEY)
    assert "zebra-striped" in hits[0]["excerpt"] or "zebra" in hits[0]["excerpt"]
    assert hits[0]["last_verified_at"] and hits[0]["last_changed_at"]

    outcomes = dict(conn.execute("SELECT outcome, count(*) FROM deliveries GROUP BY 1").fetchall())
    assert outcomes == {"embedded": 3, "unchanged": 1, "deleted": 1, "skipped": 1}


def test_same_delivery_five_times_concurrently_is_one_row_and_one_run(stack, conn):
    base, _, pipeline = stack
    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda _: deliver(base, A_URL, PAGE_B, rid="rid-dup"), range(5)))
    assert sorted(a.json()["status"] for a in answers) == ["duplicate"] * 4 + ["stored"]
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 1
    tick = pipeline.tick()
    assert tick.partitions == [A_KEY]
    assert pipeline.tick().partitions == []
    assert len(pipeline.instance.get_runs()) == 1


def test_a_lost_run_request_is_requested_again(stack, conn):
    base, _, pipeline = stack
    deliver(base, A_URL, PAGE_B)
    tick = pipeline.tick(execute=False)          # routed, but pretend the launch was lost
    assert tick.partitions == [A_KEY]
    assert pipeline.tick(execute=False).partitions == []   # leased to the lost batch until its lease ends
    conn.execute("UPDATE pages SET leased_until = now() - interval '1 second'")
    again = pipeline.tick()
    assert again.partitions == [A_KEY]
    # A new lease, a new run_key: the daemon would skip a key it has seen.
    assert again.result.run_requests[0].run_key != tick.result.run_requests[0].run_key
    assert conn.execute("SELECT outcome FROM deliveries").fetchone()[0] == "embedded"
    assert conn.execute("SELECT leased_until FROM pages").fetchone()[0] is None   # released when done


def test_a_page_crawled_over_http_is_cited_with_a_link_that_opens(stack, conn):
    base, _, pipeline = stack
    crawled = "http://intranet.example.com:8080/Handbook/"
    deliver(base, crawled, "# Handbook\n\nThe narwhal rota is kept on the third floor.")
    assert pipeline.tick().partitions == ["https://intranet.example.com:8080/Handbook"]
    hit = search_json("narwhal rota")[0]
    assert hit["url"] == crawled  # normalization made it https; the server speaks http
    assert hit["page_url"] == "https://intranet.example.com:8080/Handbook"
    # Recrawls push the same URL the crawler fetched.
    assert conn.execute("SELECT crawl_url FROM pages").fetchone()[0] == crawled
