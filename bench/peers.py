"""Peers: the same generated corpus through this project and through the libraries a user would
pick instead for incremental RAG indexing into PostgreSQL/pgvector, in one run: each system's
initial-load pages per minute and the tokens its recrawl embeds, side by side (issue 24, point 5).

The corpus is pipeline_throughput's (`make_corpus`: documentation pages of 300 to 5,000 tokens,
log-uniform; `edit_paragraphs`: the recrawl rewrites one paragraph of `--changed-fraction` of
them), written to a temporary directory as one .md file a page; the recrawl rewrites the changed
files in place, so every system reads the same text. Every system embeds through the one loopback
OpenAI fake of the tests (served from this process; 256 dimensions), whose counters give each
phase's requests and billed tokens the same way for all. One PostgreSQL server for all (the
embedded one of bench/database.py, or DATABASE_URL's), a fresh database per system and
configuration. Chunks of ~512 cl100k tokens with 64 of overlap everywhere (ours: its default budget).

  ours        the project's own functions in a plain loop, no Dagster, in a subprocess of the
              project's venv: every page stored as a delivery (`deliveries.insert`, gzip'd
              markdown), then route_batch → queued_work → apply_batch in the sensor's bounds until
              nothing is left, the BATCH_SPREAD batches of a pass applied side by side in worker
              processes (as the runs of one delivery_sensor tick are, one a core). "HNSW": the production policy: before each pass the space's index is
              dropped when IndexPolicy(HNSW_DEFER_RATIO 0.3, HNSW_DEFER_FLOOR 2000).defer(indexed,
              backlog) says so, and built once at the end (`build_index_concurrently`), the build
              counted in the load; "no HNSW": the index dropped before the load, never built.
  langchain   langchain_core.indexing.index() with a SQLRecordManager, cleanup="incremental",
              into langchain-postgres' PGVectorStore; RecursiveCharacterTextSplitter (markdown
              separators, tiktoken lengths); OpenAIEmbeddings(base_url=fake,
              check_embedding_ctx_length=False)
  llamaindex  IngestionPipeline(SentenceSplitter, OpenAIEmbedding(api_base=fake)) with a
              PostgresDocumentStore, docstore_strategy=UPSERTS, into llama-index's PGVectorStore
  cocoindex   a CocoIndex v1 app (its text_embedding example): localfs.walk_dir, RecursiveSplitter
              (markdown), LiteLLMEmbedder(openai/…, api_base=fake), a Postgres table target; one
              `update` for the load, another after the files changed

Peers run with and without an HNSW index (with: configured before the load, as their docs do;
LangChain and LlamaIndex then make it before the first row, CocoIndex once its rows are written:
the notes under the table say when each came, from a poll of the catalog every 0.25 s), each
phase as a subprocess of their own venv (`--venv`, made once with pinned versions and reused; the
peers are never dependencies of the project) running bench/peers_runner.py; its seconds exclude
the interpreter's imports. Our seconds run from the first delivery stored to the last page applied
(and the index built). The recrawl gives every page again (changed or not), and each system's own
change tracking decides what to embed.

    .venv/bin/python bench/peers.py [--pages 2000 | --docs salt] [--changed-fraction 0.1] [--seed 7]
        [--only ours,langchain,llamaindex,cocoindex] [--venv ~/.cache/rag-pipeline-bench/peers-venv]
        [--timeout 3600] [--keep] [--repeat 1]

With --docs NAME the corpus is a real documentation site instead of generated pages:
bench/labelled/NAME_docs.py's pages (`salt`: Salt 3008.5's docs from its source release, 562
pages; `django`: Django 5.2.19's, 255), one .md file a page, each file named for its URL; the
recrawl edits one paragraph of `--changed-fraction` of them as it does the generated ones
(`edit_paragraphs`: a block that opens with a letter, rewritten). --pages is then ignored.

With --repeat N each system and configuration is tried N times, round-robin (every system once,
then again), and the table shows the try of median load time; the tries' seconds are listed above
it. On these shared 2-core machines one try's load time moves by up to ~40% between runs.

Ours also says where its load's time went (the JSON line after its phase): storing the deliveries
(`store_s`), the routing pass (`route_s`, one process, as a sensor tick), the index policy
(`upkeep_s`), the batches (`apply_s`), each index build (`hnsw_build_s`, `gin_build_s`); outside the
clock, starting the worker processes (`workers_start_s`); and, added up over the batches
(`workers`), each worker's fixed part (loading the tokenizer, making the embedder, connecting) and
its batch in wall, CPU and its PostgreSQL backend's CPU seconds. Every system's table row has the
CPU the loopback embedder spent on its load (`embedder CPU s`: this process serves it, on the same
two cores).

A peer that fails is reported (its error, the tail of its traceback) and marked failed in the
table; the others go on, and the exit status is 1. The last line is `PEERS ours=<pages/min>
fastest_peer=<name> <pages/min> ratio=<x.xx> recrawl_tokens ours=<n> best_peer=<n>`: ours with
HNSW (the production configuration: the index present at the end) against the fastest peer
configuration of either kind, and the fewest tokens any peer's recrawl embedded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from bench.corpus import render  # noqa: E402
from bench.database import bench_database  # noqa: E402
from bench.pipeline_throughput import (  # noqa: E402
    DIMENSIONS,
    Page,
    base_env,
    edit_paragraphs,
    make_corpus,
    percentile,
)
from rag_pipeline.store import db, schema  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "peers_runner.py"
DEFAULT_VENV = Path.home() / ".cache" / "rag-pipeline-bench" / "peers-venv"
# The peers as a user would install them today, pinned so that runs compare; asyncpg, psycopg2
# and pgvector come with the postgres integrations, litellm with CocoIndex's extra.
PEER_PINS = (
    "langchain-core==1.8.1", "langchain-classic==1.0.8", "langchain-postgres==0.0.19",
    "langchain-openai==1.7.4", "langchain-text-splitters==1.1.3",
    "llama-index-core==0.14.25", "llama-index-vector-stores-postgres==0.9.0",
    "llama-index-storage-docstore-postgres==0.6.0", "llama-index-embeddings-openai==0.7.0",
    "cocoindex[postgres,litellm]==1.0.26", "psycopg[binary]==3.3.9",
)
PEERS = ("langchain", "llamaindex", "cocoindex")
SYSTEMS = ("ours", *PEERS)
CONFIGS = (False, True)   # with an HNSW index?
URL_PREFIX = "https://docs.example.com/guide/"   # make_corpus's page URLs: <prefix><5 digits>
CHUNK_TOKENS, OVERLAP_TOKENS = 512, 64


@dataclass
class Phase:
    seconds: float = 0.0
    tokens: int = 0
    requests: int = 0
    fake_cpu_s: float = 0.0   # the loopback embedder's CPU seconds (this process's threads) in the phase
    detail: dict = field(default_factory=dict)


@dataclass
class Run:
    system: str
    hnsw: bool
    initial: Phase | None = None
    recrawl: Phase | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.system}/{'hnsw' if self.hnsw else 'no-hnsw'}"

    def pages_per_min(self, pages: int) -> float:
        return pages / self.initial.seconds * 60 if self.initial and self.initial.seconds else 0.0


class PhaseFailed(RuntimeError):
    """A system's phase failed: the message is its error, the tail of its output."""


# -- the peers' venv -----------------------------------------------------------------------------


def ensure_peers_venv(venv: Path) -> Path:
    """The peers' own interpreter: a venv made once with PEER_PINS and reused while its recorded
    pins match (the project's venv never gets them)."""
    python = venv / "bin" / "python"
    marker = venv / "bench-pins.txt"
    wanted = "\n".join(PEER_PINS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"making the peers' venv in {venv} (pip install of {len(PEER_PINS)} pinned packages)…", flush=True)
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PINS], check=True)
    marker.write_text(wanted)
    return python


def peer_versions(python: Path) -> dict[str, str]:
    """Installed versions of the packages that make each peer (for the report; a missing one is
    named as such, not left out)."""
    names = ("langchain-core", "langchain-classic", "langchain-postgres", "langchain-openai",
             "langchain-text-splitters", "llama-index-core", "llama-index-vector-stores-postgres",
             "llama-index-storage-docstore-postgres", "llama-index-embeddings-openai", "cocoindex", "litellm",
             "openai", "SQLAlchemy", "psycopg", "psycopg2-binary", "asyncpg", "pgvector")
    code = ("import json, importlib.metadata as m, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = 'not installed'\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


# -- corpus --------------------------------------------------------------------------------------


def file_name(url: str) -> str:
    if not url.startswith(URL_PREFIX):   # a real site's page (--docs): its path, flattened
        return url.split("://", 1)[1].split("/", 1)[1].replace("/", "__") + ".md"
    return url.removeprefix(URL_PREFIX) + ".md"


def page_url(name: str, urls: dict[str, str] | None = None) -> str:
    """The URL a corpus file stands for: a real site's from the map its corpus was written with."""
    if urls is not None:
        return urls[name]
    return URL_PREFIX + name.removesuffix(".md")


def docs_pages(name: str) -> list[Page]:
    """A real documentation site's pages (bench/labelled/<name>_docs.py: `corpus(fetch())`, URL →
    markdown) as blocks, like make_corpus's: a page's text is render(blocks) of its own text."""
    import importlib

    from rag_pipeline.core.tokens import count_tokens
    from rag_pipeline.core.urls import normalize_url
    try:
        module = importlib.import_module(f"bench.labelled.{name}_docs")
    except ModuleNotFoundError:
        raise SystemExit(f"--docs {name}: no bench/labelled/{name}_docs.py") from None
    pages = []
    for url, text in module.corpus(module.fetch()).items():
        blocks = text.removesuffix("\n").split("\n\n")
        pages.append(Page(url, normalize_url(url), blocks, count_tokens(render(blocks))))
    return pages


def write_files(corpus: Path, texts: dict[str, str]) -> None:
    """Write the files whose text differs from what is there (a recrawl rewrites only the changed
    pages, as a crawler's sync of a docs folder would)."""
    for name, text in texts.items():
        path = corpus / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


# -- databases -----------------------------------------------------------------------------------


def create_peer_database(server_url: str, name: str) -> str:
    """A new database on the bench's server, with pgvector, for one peer configuration."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = db.with_database(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return url


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# -- running a phase -----------------------------------------------------------------------------


def run_phase(cmd: list[str], env: dict[str, str], fake, timeout: float) -> Phase:
    """One phase as a subprocess printing one JSON line; the fake's counters around it."""
    before = (fake.total_tokens, fake.requests)
    cpu = time.process_time()   # this process only serves the fake meanwhile: its CPU is the fake's
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        raise PhaseFailed(f"timed out after {timeout:.0f} s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or "error" in result or not lines:
        tail = result.get("traceback") or (done.stderr or done.stdout)[-3000:]
        raise PhaseFailed(f"{result.get('error') or f'exit status {done.returncode}'}\n{tail.rstrip()}")
    return Phase(seconds=result.pop("seconds"), tokens=fake.total_tokens - before[0],
                 requests=fake.requests - before[1], fake_cpu_s=time.process_time() - cpu, detail=result)


def ours_command(phase: str, corpus: Path, hnsw: bool, urls: Path | None) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--ours-phase", phase, "--corpus", str(corpus),
            *(["--hnsw"] if hnsw else []), *(["--urls", str(urls)] if urls else [])]


def peer_command(python: Path, system: str, phase: str, corpus: Path, url: str, fake_url: str, hnsw: bool,
                 state: Path, chars_per_token: float) -> list[str]:
    return [str(python), str(RUNNER), "--system", system, "--phase", phase, "--corpus", str(corpus),
            "--database", url, "--openai-url", fake_url, "--state", str(state),
            "--chunk-tokens", str(CHUNK_TOKENS), "--overlap-tokens", str(OVERLAP_TOKENS),
            "--chars-per-token", f"{chars_per_token:.3f}", *(["--hnsw"] if hnsw else [])]


def run_system(run: Run, commands: dict[str, list[str]], env: dict[str, str], corpus: Path,
               texts: tuple[dict[str, str], dict[str, str]], fake, timeout: float) -> None:
    """The initial load from the initial files, then the recrawl after the changed files are
    written; a failure ends this system's run (recorded in `run.error`), not the bench."""
    initial, recrawl = texts
    try:
        write_files(corpus, initial)
        print(f"  {run.name}: initial load…", flush=True)
        run.initial = run_phase(commands["initial"], env, fake, timeout)
        print(f"    {run.initial.seconds:.1f} s, {run.initial.tokens:,} tokens, {run.initial.requests} requests, "
              f"embedder CPU {run.initial.fake_cpu_s:.1f} s "
              f"{json.dumps(run.initial.detail, default=str)}", flush=True)
        write_files(corpus, recrawl)
        print(f"  {run.name}: recrawl…", flush=True)
        run.recrawl = run_phase(commands["recrawl"], env, fake, timeout)
        print(f"    {run.recrawl.seconds:.1f} s, {run.recrawl.tokens:,} tokens, {run.recrawl.requests} requests "
              f"{json.dumps(run.recrawl.detail, default=str)}", flush=True)
    except PhaseFailed as exc:
        run.error = str(exc)
        print(f"  {run.name} FAILED: {exc}", flush=True)


# -- ours, in its subprocess ---------------------------------------------------------------------


def ours_phase_main(args: argparse.Namespace) -> int:
    """The subprocess of our phase (DATABASE_URL and the embedder from the environment): prints
    one JSON line like peers_runner's."""
    import traceback
    try:
        urls = json.loads(args.urls.read_text()) if args.urls else None
        result = ours_phase(args.ours_phase, args.corpus, args.hnsw, urls)
    except BaseException as exc:  # noqa: BLE001 - reported to the bench
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def ours_phase(phase: str, corpus: Path, hnsw: bool, urls: dict[str, str] | None = None) -> dict:
    """Store every page as a delivery, then route → queued_work → apply_batch until nothing is
    left, with the HNSW policy of production around it; the index build, if any, counts."""
    from rag_pipeline.core.batch_sizing import plan_batches
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.settings import get_settings
    from rag_pipeline.store import deliveries, spaces, text_search

    settings = get_settings()
    embedder = make_embedder(settings)
    pages = [(page_url(p.name, urls), p.read_text()) for p in sorted(corpus.glob("*.md"))]
    workers = ProcessPoolExecutor(settings.batch_spread, mp_context=multiprocessing.get_context("spawn"))
    t = time.perf_counter()
    list(workers.map(apply_in_worker, [[]] * settings.batch_spread))   # started before the clock
    workers_start_s = time.perf_counter() - t
    started = time.perf_counter()
    with workers, db.connection(settings.database_url) as conn:
        store_deliveries(conn, pages)
        store_s = time.perf_counter() - started
        space = spaces.ensure_active(conn, embedder.model, embedder.dimensions)
        if not hnsw:
            spaces.drop_index(conn, space)
        passes, applied, failed, dropped = 0, 0, [], False
        route_s = apply_s = upkeep_s = 0.0
        in_workers: list[dict] = []
        while True:
            t = time.perf_counter()
            routed = route(conn, settings)
            route_s += time.perf_counter() - t
            t = time.perf_counter()
            dropped |= index_upkeep(conn, space, settings, hnsw)
            work = deliveries.queued_work(conn, settings.sensor_batch_size)
            upkeep_s += time.perf_counter() - t
            if not routed.routed and not work:
                break
            passes += 1
            # The batches of a pass side by side, one process each, as delivery_sensor's runs of
            # one tick work at once (BATCH_SPREAD, one a core).
            batches = plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens, settings.batch_spread)
            t = time.perf_counter()
            for done in workers.map(apply_in_worker, batches):
                failed += done.pop("failed")
                in_workers.append(done)
            apply_s += time.perf_counter() - t
            applied += sum(len(batch) for batch in batches)
            if failed:
                raise RuntimeError(f"{len(failed)} page(s) failed, first: {failed[0]}")
        build_s = hnsw_build_s = gin_build_s = None
        t = time.perf_counter()
        if hnsw and spaces.index_state(conn, space) != "valid":
            spaces.build_index_concurrently(conn, space, settings.space_build_memory, settings.hnsw_build_workers,
                                            settings.space_build_memory_max)
            build_s = hnsw_build_s = time.perf_counter() - t
        if text_search.index_state(conn) != "valid":    # lexical search's index, in both configurations
            text_search.build_index_concurrently(conn, settings.hnsw_build_workers)
            build_s = time.perf_counter() - t
            gin_build_s = build_s - (hnsw_build_s or 0.0)
        seconds = time.perf_counter() - started
        rows = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        index = spaces.index_state(conn, space)
    return {"seconds": seconds, "pages": len(pages), "store_s": round(store_s, 2), "route_s": round(route_s, 2),
            "upkeep_s": round(upkeep_s, 2), "apply_s": round(apply_s, 2), "passes": passes,
            "applied": applied, "rows": rows, "index_dropped": dropped,
            "index_build_s": None if build_s is None else round(build_s, 2),
            "hnsw_build_s": None if hnsw_build_s is None else round(hnsw_build_s, 2),
            "gin_build_s": None if gin_build_s is None else round(gin_build_s, 2), "hnsw": index,
            "workers_start_s": round(workers_start_s, 2), "workers": worker_breakdown(in_workers)}


def worker_breakdown(runs: list[dict]) -> dict:
    """What the apply workers' batches spent, added up over them: the fixed part of each (the
    tokenizer's tables, the embedder, the first connection) and the batch itself, in wall and in
    this process's CPU seconds (the rest of its wall time: waiting on PostgreSQL and the embedder),
    and its PostgreSQL backend's CPU seconds (not counting the connection that caches vectors)."""
    keys = ("tokenizer_s", "embedder_s", "connect_s", "batch_s", "batch_cpu_s", "postgres_cpu_s")
    return {"batches": len(runs), **{k: round(sum(r[k] for r in runs), 2) for k in keys}}


def apply_in_worker(batch) -> dict:
    """One batch applied in a worker process (its own connection and embedder): the reasons of
    the pages that failed (`failed`), and where its time went."""
    from rag_pipeline.core.tokens import encoding
    from rag_pipeline.embedders.factory import indexing_chunk_budget, make_embedder
    from rag_pipeline.ingest.batch_apply import Failed, RetryPolicy, apply_batch
    from rag_pipeline.settings import get_settings

    if not batch:
        return {"failed": []}
    t = time.perf_counter()
    encoding()   # loaded once a process, at its first count: timed apart
    tokenizer_s = time.perf_counter() - t
    settings = get_settings()
    embedder = make_embedder(settings)
    embedder_s = time.perf_counter() - t - tokenizer_s
    t = time.perf_counter()
    with db.connection(settings.database_url) as conn:
        connect_s = time.perf_counter() - t
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        t, cpu, server_cpu = time.perf_counter(), time.process_time(), process_cpu(backend)
        events = list(apply_batch(conn, batch, batch_key=None, embedder_for=lambda _space: embedder,
                                  chunk_budget=lambda space: indexing_chunk_budget(settings, space),
                                  max_page_bytes=settings.webhook_max_page_bytes,
                                  retry=RetryPolicy.from_settings(settings)))
        batch_s, batch_cpu_s = time.perf_counter() - t, time.process_time() - cpu
        server_cpu_s = process_cpu(backend) - server_cpu
    return {"failed": [e.failure.reason for e in events if isinstance(e, Failed)], "tokenizer_s": tokenizer_s,
            "embedder_s": embedder_s, "connect_s": connect_s, "batch_s": batch_s, "batch_cpu_s": batch_cpu_s,
            "postgres_cpu_s": server_cpu_s}


def process_cpu(pid: int) -> float:
    """CPU seconds of a process of this machine (a PostgreSQL backend), from /proc; 0 where the
    server is elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_deliveries(conn, pages: list[tuple[str, str]]) -> None:
    """Every page as the webhook stores a crawler's POST: gzip'd markdown under a new rid."""
    from rag_pipeline.store import deliveries
    with conn.transaction():
        for url, markdown in pages:
            deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                              original_status=200, content_type="text/markdown",
                              body=gzip.compress(markdown.encode()), body_encoding="gzip")


def route(conn, settings):
    from rag_pipeline.ingest.routing import route_batch
    return route_batch(conn, settings.sensor_batch_size, settings.webhook_max_page_bytes)


def index_upkeep(conn, space, settings, hnsw: bool) -> bool:
    """delivery_sensor's drop (defs/index/bulk_index.py), without Dagster: the indexes make way
    when the backlog is large against what is indexed. Returns whether it dropped them."""
    from rag_pipeline.core.bulk_load import IndexPolicy, backlog_rows, chars_per_vector
    from rag_pipeline.store import deliveries, spaces, text_search
    if text_search.index_state(conn) != "valid" or (hnsw and spaces.index_state(conn, space) != "valid"):
        return False
    policy = IndexPolicy(settings.hnsw_defer_ratio, settings.hnsw_defer_floor)
    per_vector = chars_per_vector(*spaces.source_per_chunk_sample(conn))
    if not policy.defer(spaces.indexed_rows(conn, space), backlog_rows(deliveries.queued_chars(conn), per_vector)):
        return False
    if hnsw:
        spaces.drop_index(conn, space)
    text_search.drop_index(conn)
    return True


# -- report --------------------------------------------------------------------------------------


def print_table(runs: list[Run], pages: int, changed: int, corpus: str | None = None) -> None:
    named = f"{corpus}: " if corpus else ""
    print(f"\n== {named}{pages} pages; recrawl: every page again, {changed} changed by one paragraph ==")
    head = (f"{'system':<11} {'HNSW':<8} {'load s':>8} {'pages/min':>10} {'load tokens':>12} {'embedder CPU s':>15} "
            f"{'rows':>7} {'recrawl tokens':>15} {'recrawl s':>10}")
    print(head)
    print("-" * len(head))
    for run in runs:
        config = "with" if run.hnsw else "without"
        if run.initial is None:
            print(f"{run.system:<11} {config:<8} {'FAILED':>8}")
            continue
        i, r = run.initial, run.recrawl
        recrawl = f"{r.tokens:>15,} {r.seconds:>10.1f}" if r else f"{'FAILED':>15} {'':>10}"
        print(f"{run.system:<11} {config:<8} {i.seconds:>8.1f} {run.pages_per_min(pages):>10.0f} {i.tokens:>12,} "
              f"{i.fake_cpu_s:>15.1f} {i.detail.get('rows', 0):>7,} {recrawl}")


def median_runs(runs: list[Run], repeat: int) -> list[Run]:
    """Of each system and configuration's tries, the one of median load time (a failed try
    counts as failed)."""
    if repeat == 1:
        return runs
    chosen = []
    for system, hnsw in dict.fromkeys((r.system, r.hnsw) for r in runs):
        tries = [r for r in runs if (r.system, r.hnsw) == (system, hnsw)]
        done = sorted((r for r in tries if r.initial and not r.error), key=lambda r: r.initial.seconds)
        chosen.append(done[(len(done) - 1) // 2] if len(done) == len(tries) else next(r for r in tries if r.error
                                                                                      or not r.initial))
    return chosen


def print_tries(tries: list[Run], chosen: list[Run], pages: int) -> None:
    print("tries (initial load seconds; the median's is used below):")
    for run in chosen:
        seconds = [f"{r.initial.seconds:.1f}" if r.initial else "FAILED" for r in tries
                   if (r.system, r.hnsw) == (run.system, run.hnsw)]
        print(f"  {run.name:<22} {' '.join(seconds)}")


def print_index_notes(runs: list[Run]) -> None:
    """When each "with HNSW" index was made: configured is not always what happens."""
    for run in runs:
        if not run.hnsw or run.initial is None:
            continue
        d = run.initial.detail
        if run.system == "ours":
            how = (f"dropped for the load by the policy, built at the end in {d['index_build_s']:.1f} s (counted)"
                   if d.get("index_build_s") is not None else "kept through the load (backlog under the policy's threshold)")
        else:
            how = f"created {d.get('hnsw_created') or 'never (no HNSW index found)'}"
        print(f"  {run.name}: HNSW index {how}")


def summary_line(runs: list[Run], pages: int) -> str:
    """The PEERS line: ours with HNSW against the fastest peer configuration, and recrawl tokens
    against the peers' fewest."""
    ours = next((r for r in runs if r.system == "ours" and r.hnsw and r.initial), None)
    peers = [r for r in runs if r.system != "ours" and r.initial]
    fastest = max(peers, key=lambda r: r.pages_per_min(pages), default=None)
    recrawls = [r.recrawl.tokens for r in peers if r.recrawl]
    ours_ppm = f"{ours.pages_per_min(pages):.0f}" if ours else "n/a"
    peer = f"{fastest.name} {fastest.pages_per_min(pages):.0f}" if fastest else "n/a n/a"
    ratio = (f"{ours.pages_per_min(pages) / fastest.pages_per_min(pages):.2f}"
             if ours and fastest and fastest.pages_per_min(pages) else "n/a")
    ours_recrawl = ours.recrawl.tokens if ours and ours.recrawl else "n/a"
    return (f"PEERS ours={ours_ppm} fastest_peer={peer} ratio={ratio} recrawl_tokens ours={ours_recrawl} "
            f"best_peer={min(recrawls) if recrawls else 'n/a'}")


def print_ratios(runs: list[Run], pages: int) -> None:
    """Ours against the fastest peer of the same kind (with HNSW, without)."""
    for hnsw in CONFIGS:
        ours = next((r for r in runs if r.system == "ours" and r.hnsw == hnsw and r.initial), None)
        peers = [r for r in runs if r.system != "ours" and r.hnsw == hnsw and r.initial]
        if ours and peers:
            best = max(peers, key=lambda r: r.pages_per_min(pages))
            print(f"{'with' if hnsw else 'without'} HNSW: ours {ours.pages_per_min(pages):.0f} pages/min vs "
                  f"{best.name} {best.pages_per_min(pages):.0f} (x{ours.pages_per_min(pages) / best.pages_per_min(pages):.2f})")


# -- main ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--docs", metavar="NAME",
                        help="a real documentation site (bench/labelled/NAME_docs.py, e.g. salt) instead of --pages")
    parser.add_argument("--changed-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the peers' venv (made if missing)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one phase of one system may take")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (corpus, CocoIndex state)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="tries of each system and configuration, round-robin; the median load is reported")
    parser.add_argument("--ours-phase", choices=("initial", "recrawl"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--hnsw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--urls", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) in --only: {', '.join(sorted(unknown))}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    if args.ours_phase:
        return ours_phase_main(args)
    from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

    pages = docs_pages(args.docs) if args.docs else make_corpus(args.pages, args.seed)
    corpus_name = f"{args.docs} docs" if args.docs else None
    changed = edit_paragraphs(pages, args.changed_fraction, args.seed)
    initial = {file_name(p.url): render(p.blocks) for p in pages}
    recrawl = {file_name(p.url): render(changed.get(p.key, p.blocks)) for p in pages}
    if len(initial) != len(pages):
        raise SystemExit(f"{len(pages)} pages but {len(initial)} file names: two URLs flatten to one name")
    tokens = [p.tokens for p in pages]
    chars_per_token = sum(map(len, initial.values())) / sum(tokens)
    named = f"{corpus_name}, " if corpus_name else ""
    print(f"peers: {named}{len(pages)} pages, {sum(tokens):,} tokens (median {int(percentile(tokens, 50))}), "
          f"{len(changed)} changed in the recrawl; {chars_per_token:.2f} characters a token")
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    python = None
    if set(args.only) & set(PEERS):
        python = ensure_peers_venv(args.venv)
        versions = peer_versions(python)
        print("peer versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))

    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    corpus = work / "corpus"
    corpus.mkdir()
    urls = None
    if args.docs:   # a real site's file names do not give its URLs back: ours reads them from a map
        urls = work / "urls.json"
        urls.write_text(json.dumps({file_name(p.url): p.url for p in pages}))
    runs: list[Run] = []
    try:
        with ExitStack() as stack:
            fake = stack.enter_context(FakeOpenAI(dimensions=DIMENSIONS))
            ours_url = stack.enter_context(bench_database("bench_peers"))
            base = conninfo_dbname(ours_url)
            made: list[str] = []
            stack.callback(lambda: [drop_database(ours_url, name) for name in made])
            # Repeats go round every system before the next: a slow minute of the machine falls
            # on one try of several systems, not on every try of one.
            for system, hnsw, rep in [(s, h, r) for r in range(args.repeat) for s in SYSTEMS if s in args.only
                                      for h in CONFIGS]:
                run = Run(system, hnsw)
                runs.append(run)
                name = f"{base}_{system}_{'hnsw' if hnsw else 'flat'}" + (f"_{rep}" if rep else "")
                made.append(name)
                if system == "ours":
                    url = db.with_database(ours_url, name)
                    schema.prepare(url)
                    env = base_env(url, work / f"rag_home_{name}", fake.base_url, ROOT)
                    env["WEBHOOK_ACCEPT_UNSOLICITED"] = "true"
                    commands = {phase: ours_command(phase, corpus, hnsw, urls) for phase in ("initial", "recrawl")}
                else:
                    url = create_peer_database(ours_url, name)
                    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHONPATH"))}
                    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
                    commands = {phase: peer_command(python, system, phase, corpus, url, fake.base_url, hnsw,
                                                    work / f"state_{name}", chars_per_token)
                                for phase in ("initial", "recrawl")}
                run_system(run, commands, env, corpus, (initial, recrawl), fake, args.timeout)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    tries = runs
    runs = median_runs(runs, args.repeat)
    if args.repeat > 1:
        print_tries(tries, runs, len(pages))
    print_table(runs, len(pages), len(changed), corpus_name)
    print_index_notes(runs)
    print()
    print_ratios(runs, len(pages))
    failed = [r for r in tries if r.error]
    for run in failed:
        print(f"FAILED {run.name}: {run.error.splitlines()[0]}")
    print(summary_line(runs, len(pages)))
    return 1 if failed else 0


def conninfo_dbname(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict
    return conninfo_to_dict(url)["dbname"]


if __name__ == "__main__":
    sys.exit(main())
