"""Bulk loads without per-row index upkeep: delivery_sensor drops the active space's HNSW index and
the GIN index of lexical search while a large backlog is written, search stays exact (and says so)
meanwhile, and a `space_index` run builds both again once the backlog has drained; a trickle of
recrawls never drops them."""

from __future__ import annotations

import json

import dagster as dg
import psutil
import psycopg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core import build_memory
from rag_pipeline.core.bulk_load import IndexPolicy
from rag_pipeline.defs.index import bulk_index
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, spaces, text_search
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import configure, deliver, openai_stack


def page(n: int, extra: str = "") -> str:
    body = " ".join(f"Heron gate {n} sentence {i} about tides and locks{extra}." for i in range(40))
    return f"# Gate {n}\n\n{body}\n"


@pytest.fixture
def stack(database_url, monkeypatch):
    with FakeOpenAI(dimensions=256) as fake, openai_stack(database_url, monkeypatch, fake) as (base, pipeline):
        # A floor of 20 vectors (a page here is ~2 vectors' worth of text), defer at half the indexed.
        configure(monkeypatch, HNSW_DEFER_FLOOR="20", HNSW_DEFER_RATIO="0.5", SENSOR_BATCH_SIZE="100")
        yield base, pipeline


def scan(conn) -> str:
    return spaces.search_scan(conn)


def lexical(conn) -> str:
    return text_search.lexical_scan(conn)


def test_the_index_makes_way_for_a_bulk_load_and_comes_back(stack, conn, database_url, monkeypatch):
    base, pipeline = stack
    deliver(base, "https://docs.example.com/first", page(0))
    pipeline.tick()                       # a first page: the space is made, with its index
    assert (scan(conn), lexical(conn)) == ("hnsw", "gin")

    for n in range(1, 41):                # an initial load: ~80 vectors against 2 indexed
        deliver(base, f"https://docs.example.com/p{n}", page(n))
    tick = pipeline.tick(execute=False)   # routes them; the backlog is big: the index is dropped
    assert scan(conn) == "exact (HNSW index dropped for a bulk load)"
    assert lexical(conn) == "exact (GIN index dropped for a bulk load)"
    assert all(r.job_name == "index_batch" for r in tick.result.run_requests)
    configure(monkeypatch, DATABASE_URL=database_url)
    hits = CliRunner().invoke(cli, ["search", "heron gate tides", "--json"])
    assert '"vector_scan": "exact (HNSW index dropped for a bulk load)"' in hits.output
    assert '"lexical_scan": "exact (GIN index dropped for a bulk load)"' in hits.output

    for request in tick.result.run_requests:          # the batches write without the indexes
        pipeline.defs.resolve_job_def("index_batch").execute_in_process(
            run_config=request.run_config, instance=pipeline.instance, tags=request.tags)
    assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash IS NOT NULL").fetchone()[0] == 41
    # Lexical search without its index reads every passage: the same answer it gives with it. The
    # words' weights come from the table's statistics: settled first, so that autovacuum's ANALYZE
    # cannot land between the two searches (seen under load).
    conn.execute("ANALYZE chunks")
    words = CliRunner().invoke(cli, ["search", "heron gate 17 tides", "--mode", "lexical", "--json"])
    assert words.exit_code == 0, words.output
    without_index = json.loads(words.output)["results"]
    assert without_index and without_index[0]["url"] == "https://docs.example.com/p17"
    rebuild = pipeline.tick()             # drained: a space_index run builds them again
    assert [r.job_name for r in rebuild.runs] == ["space_index"]
    assert (scan(conn), lexical(conn)) == ("hnsw", "gin")
    again = CliRunner().invoke(cli, ["search", "heron gate 17 tides", "--mode", "lexical", "--json"])
    assert json.loads(again.output)["results"] == without_index
    active = spaces.active(conn)
    vectors = conn.execute(f"SELECT count(*) FROM space_vectors_{active.space_id}").fetchone()[0]
    said = [e.user_message for e in pipeline.instance.all_logs(rebuild.runs[0].run_id)]
    # SPACE_BUILD_MEMORY=auto: these few vectors get the floor, in which their graph fits.
    assert any(f"built over {vectors:,} vectors" in m and "maintenance_work_mem 64MB:" in m for m in said), said
    assert any(m.startswith("GIN index of chunks.text_search built") for m in said), said
    assert spaces.indexed_rows(conn, active) == conn.execute(
        f"SELECT count(*) FROM space_vectors_{active.space_id}").fetchone()[0]

    for n in range(1, 4):                 # a trickle of recrawls: 3 changed pages against ~80
        deliver(base, f"https://docs.example.com/p{n}", page(n, " again"))
    assert [r.job_name for r in pipeline.tick().runs] == ["index_batch"]
    assert (scan(conn), lexical(conn)) == ("hnsw", "gin")


@pytest.mark.parametrize("indexed, backlog, defer", [
    (0, 19, False), (0, 20, True), (100, 49, False), (100, 50, True), (100_000, 2_000, False),
    (100_000, 50_000, True)])
def test_the_policy(indexed, backlog, defer):
    policy = IndexPolicy(ratio=0.5, floor=20)
    assert policy.defer(indexed, backlog) is defer
    assert policy.rebuild(9) and not policy.rebuild(10)


def test_a_failed_build_still_builds_the_other_index_and_is_not_retried_on_every_tick(stack, conn, monkeypatch):
    base, pipeline = stack
    deliver(base, "https://docs.example.com/first", page(0))
    pipeline.tick()
    for n in range(1, 41):
        deliver(base, f"https://docs.example.com/p{n}", page(n))
    tick = pipeline.tick(execute=False)                 # the indexes make way
    for request in tick.result.run_requests:
        pipeline.defs.resolve_job_def("index_batch").execute_in_process(
            run_config=request.run_config, instance=pipeline.instance, tags=request.tags)

    def no_room(*args, **kwargs):
        raise psycopg.errors.DiskFull("could not resize shared memory segment: No space left on device")

    monkeypatch.setattr(spaces, "build_index_concurrently", no_room)
    failed = pipeline.tick(expect_success=False)        # drained: space_index runs, its HNSW build fails
    assert [(r.job_name, r.status) for r in failed.runs] == [("space_index", dg.DagsterRunStatus.FAILURE)]
    assert (scan(conn), lexical(conn)) == ("exact (HNSW index dropped for a bulk load)", "gin")
    assert not pipeline.tick().runs                     # not again at once: after REBUILD_BACKOFF_S


def test_whichever_index_still_stands_makes_way_and_a_long_transaction_only_puts_off_its_drop(
        stack, conn, database_url, monkeypatch):
    base, pipeline = stack
    deliver(base, "https://docs.example.com/first", page(0))
    pipeline.tick()
    text_search.drop_index(conn)            # as a GIN build that failed leaves it: only HNSW stands
    for n in range(1, 41):
        deliver(base, f"https://docs.example.com/p{n}", page(n))
    route_batch(conn, 100, 10_000_000)      # queued: the backlog delivery_sensor would see
    monkeypatch.setattr(bulk_index, "DROP_LOCK_TIMEOUT", "1s")
    table = f"space_vectors_{spaces.active(conn).space_id}"
    with psycopg.connect(database_url) as reader:           # a transaction left open on the table
        reader.execute(f"SELECT count(*) FROM {table}").fetchone()
        rebuild, said = bulk_index.index_upkeep(pipeline.instance, conn, get_settings())
        assert rebuild is None
        assert "dropping the HNSW index waited over 1s for transactions open on its table" in said, said
        # Half-dropped: no longer read by search, and not forgotten.
        assert scan(conn) == "exact (HNSW index being built or dropped)"
    assert conn.execute("SHOW lock_timeout").fetchone()[0] == "0"   # the tick's connection goes back as it came
    rebuild, said = bulk_index.index_upkeep(pipeline.instance, conn, get_settings())
    assert rebuild is None and "the HNSW index is dropped until the backlog is written" in said, said
    assert (scan(conn), lexical(conn)) == ("exact (HNSW index dropped for a bulk load)",
                                           "exact (GIN index dropped for a bulk load)")
    load = pipeline.tick()                  # the batches write without either index
    assert load.runs and {r.job_name for r in load.runs} == {"index_batch"}
    assert [r.job_name for r in pipeline.tick().runs] == ["space_index"]
    assert (scan(conn), lexical(conn)) == ("hnsw", "gin")


@pytest.mark.parametrize("local", [True, False])
def test_auto_build_memory_is_capped_by_the_machine_the_server_runs_on(stack, conn, monkeypatch, local):
    base, pipeline = stack
    deliver(base, "https://docs.example.com/first", page(0))
    pipeline.tick()
    space = spaces.active(conn)
    spaces.drop_index(conn, space)
    asked = {}
    real = build_memory.build_memory

    def noted(setting, vectors, dimensions, bytes_per_dimension, cap_bytes):
        asked["cap"] = cap_bytes
        return real(setting, vectors, dimensions, bytes_per_dimension, cap_bytes)

    monkeypatch.setattr(build_memory, "build_memory", noted)
    monkeypatch.setattr(db, "server_is_local", lambda _conn: local)
    built = spaces.build_index_concurrently(conn, space, "auto", 0)
    sized = conn.execute("SELECT greatest(pg_size_bytes(current_setting('shared_buffers')),"
                         " pg_size_bytes(current_setting('maintenance_work_mem')))").fetchone()[0]
    assert asked["cap"] == (psutil.virtual_memory().total // 4 if local else sized)
    assert (built.maintenance_work_mem, built.fits, scan(conn)) == ("64MB", True, "hnsw")


def test_the_test_server_is_on_this_machine(conn):
    assert db.server_is_local(conn)


def test_the_backlog_is_counted_in_the_indexed_pages_own_vectors_per_character(conn):
    """Issue 44, point 1: the offline model's small chunks are ~4 times as many vectors per
    character as the default estimate assumes; once pages are indexed, their own ratio counts."""
    from rag_pipeline.core.bulk_load import CHARS_PER_VECTOR, backlog_rows, chars_per_vector
    from rag_pipeline.ingest.routing import route_batch
    from rag_pipeline.store import spaces
    from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, index, put

    assert chars_per_vector(*spaces.source_per_chunk_sample(conn)) == CHARS_PER_VECTOR   # nothing indexed
    text = "# Handbook\n\n" + "\n\n".join(f"## Part {i}\n\n" + " ".join(f"Sentence {j} of part {i}." for j in range(25))
                                          for i in range(12))
    for n in range(8):
        put(conn, f"https://small.example.org/p{n}", text.replace("Handbook", f"Handbook {n}"))
    for item in route_batch(conn, 100, MAX).queued:
        index(conn, item.page_url, CountingEmbedder(), max_tokens=160, overlap=20)
    source_chars, chunks = spaces.source_per_chunk_sample(conn)
    stored = conn.execute("SELECT sum(length(source_text)), (SELECT count(*) FROM chunks) FROM pages").fetchone()
    assert (source_chars, chunks) == (stored[0], stored[1]) and chunks >= 50
    measured = chars_per_vector(source_chars, chunks)
    assert measured < CHARS_PER_VECTOR / 2          # 160-token chunks: far fewer characters a vector
    queued = 1_000_000
    assert backlog_rows(queued, measured) > 2 * backlog_rows(queued)
    assert chars_per_vector(source_chars, 10) == CHARS_PER_VECTOR   # too few chunks to measure


def test_an_initial_load_into_an_empty_index_is_a_bulk_load_from_its_first_batch(stack, conn):
    """Issue 44, point 1: on a fresh database the first batch makes the space; when what is queued
    is already a bulk load, it makes it without its HNSW index (no batch writes through it), and the
    next tick's upkeep leaves search exact until the backlog is written, then builds both once."""
    base, pipeline = stack
    for n in range(40):                   # ~80 vectors queued, nothing indexed: a bulk load
        deliver(base, f"https://docs.example.com/p{n}", page(n))
    first = pipeline.tick(execute=False)
    batches = [r for r in first.result.run_requests if r.job_name == "index_batch"]
    pipeline.defs.resolve_job_def("index_batch").execute_in_process(
        run_config=batches[0].run_config, instance=pipeline.instance, tags=batches[0].tags)
    active = spaces.active(conn)
    assert spaces.index_state(conn, active) == "missing"
    assert scan(conn) == "exact (HNSW index dropped for a bulk load)"
    for request in batches[1:]:
        pipeline.defs.resolve_job_def("index_batch").execute_in_process(
            run_config=request.run_config, instance=pipeline.instance, tags=request.tags)
    while conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'queued'").fetchone()[0]:
        pipeline.tick()
    assert [r.job_name for r in pipeline.tick().runs] == ["space_index"]
    assert (scan(conn), lexical(conn)) == ("hnsw", "gin")


def test_a_small_first_load_makes_the_space_with_its_index(stack, conn):
    base, pipeline = stack
    deliver(base, "https://docs.example.com/first", page(0))
    pipeline.tick()
    assert spaces.index_state(conn, spaces.active(conn)) == "valid"


def test_the_hnsw_graph_is_built_with_the_chosen_parameters(stack, conn):
    """Issue 45, point 5: the index's m and ef_construction are the project's choice
    (spaces.HNSW_BUILD), and a build may ask for others (bench/search_quality.py --builds)."""
    base, pipeline = stack
    deliver(base, "https://docs.example.com/hnsw", "# HNSW\n\nOne page, one index.\n")
    pipeline.tick()
    space = spaces.active(conn)

    def options() -> set[str]:
        return set(conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s",
                                (space.index_name(),)).fetchone()[0] or [])

    chosen = spaces.HNSW_BUILD
    assert options() == {f"m={chosen.m}", f"ef_construction={chosen.ef_construction}"}
    spaces.drop_index(conn, space)
    spaces.build_index_concurrently(conn, space, "auto", 0, build=spaces.HnswBuild(m=8, ef_construction=40))
    assert options() == {"m=8", "ef_construction=40"} and scan(conn) == "hnsw"
