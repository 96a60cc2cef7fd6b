"""One phase of one peer of bench/peers.py, run by the peers' own venv (never the project's): the
corpus directory's .md files indexed into a PostgreSQL database by LangChain, LlamaIndex or
CocoIndex, each set up as its documentation sets it up for incremental indexing, embedding through
the bench's loopback OpenAI fake. Prints one JSON line: the phase's seconds (imports excluded,
table and index setup included) and what the system reports it did; on failure, `{"error": ...}`
and exit status 1.

    peers-venv/bin/python bench/peers_runner.py --system langchain --phase initial --corpus DIR \
        --database postgresql://... --openai-url http://127.0.0.1:PORT/v1 [--hnsw] \
        [--state DIR] [--chunk-tokens 512] [--overlap-tokens 64] [--chars-per-token 4.0]

The initial phase creates the tables (and, with --hnsw, the HNSW index where each system's docs
declare it: LangChain and LlamaIndex make it with the table, CocoIndex after writing the rows); the recrawl phase finds them, and each system's own change tracking (LangChain's record
manager, LlamaIndex's docstore, CocoIndex's state in --state) decides what to embed again.
"""

# No `from __future__ import annotations`: CocoIndex reads the row class's annotations (the
# vector column's embedder) with get_type_hints, which cannot see the function's locals.
import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

MODEL = "text-embedding-3-small"
API_KEY = "sk-bench"
DIMENSIONS = 256
TABLE = "bench_chunks"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    parser.add_argument("--phase", required=True, choices=("initial", "recrawl"))
    parser.add_argument("--corpus", required=True, type=Path, help="directory of the pages' .md files")
    parser.add_argument("--database", required=True, help="postgresql:// URL of this peer's own database")
    parser.add_argument("--openai-url", required=True, help="the fake's base URL (…/v1)")
    parser.add_argument("--hnsw", action="store_true", help="create an HNSW index before the load")
    parser.add_argument("--state", type=Path, help="CocoIndex's state directory (kept between phases)")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--overlap-tokens", type=int, default=64)
    parser.add_argument("--chars-per-token", type=float, default=4.0,
                        help="the corpus's characters per cl100k token (CocoIndex sizes chunks in bytes)")
    return parser.parse_args(argv)


# -- shared --------------------------------------------------------------------------------------


def driver_url(url: str, driver: str) -> str:
    """`url` for SQLAlchemy with `driver` (psycopg, psycopg2, asyncpg): the same server, user and
    database, including the embedded server's `?host=/socket/dir` form."""
    parts = urlsplit(url)
    return urlunsplit((f"postgresql+{driver}",) + tuple(parts[1:]))


def corpus_pages(corpus: Path) -> list[tuple[str, str]]:
    """(file name, text) of every page, in name order: what every system is given."""
    return [(p.name, p.read_text()) for p in sorted(corpus.glob("*.md"))]


def offline_tiktoken() -> None:
    """cl100k_base without a download (this machine has no route to its blob store): tiktoken
    reads its cache, and llama-index-core ships that file (the splitters of LangChain and
    LlamaIndex both count cl100k tokens)."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        import importlib.util
        spec = importlib.util.find_spec("llama_index.core")
        if spec and spec.origin:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(Path(spec.origin).parent / "_static" / "tiktoken_cache")


def count_rows(url: str, table: str) -> int:
    import psycopg
    with psycopg.connect(url) as conn:
        return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]


def index_names(url: str, table: str) -> list[str]:
    """The vector indexes on `table` when the phase ends: shows what "with HNSW" really built."""
    import psycopg
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef ILIKE '%%USING hnsw%%'",
                            (table,)).fetchall()
    return [r[0] for r in rows]


class IndexWatch:
    """Polls, from a thread, for the HNSW index on `table` during a load, and notes how many rows
    the table held when it first appeared (`rows_at_creation`; None: no index): `created()` then
    says whether "with HNSW" was made before the rows, part-way, or once they were all written."""

    def __init__(self, url: str, table: str, interval_s: float = 0.25):
        import threading
        self.url, self.table, self.interval_s = url, table, interval_s
        self.rows_at_creation: int | None = None
        self.seen_polling = False   # else only by the check at the end: when it came is unknown
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "IndexWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.rows_at_creation is None:   # made after the last poll
            self.rows_at_creation = self._rows_if_indexed()

    def created(self, final_rows: int) -> str | None:
        if self.rows_at_creation is None:
            return None
        if not self.seen_polling:
            return f"at an unseen moment (first seen after the load, {self.rows_at_creation} rows)"
        if self.rows_at_creation == 0:
            return "before the rows"
        if self.rows_at_creation >= final_rows:
            return f"after all {final_rows} rows were written"
        return f"part-way, at {self.rows_at_creation} of {final_rows} rows"

    def _rows_if_indexed(self, conn=None) -> int | None:
        import contextlib

        import psycopg
        # A connection passed in stays open (psycopg's `with` would close it).
        with (psycopg.connect(self.url, autocommit=True) if conn is None else contextlib.nullcontext(conn)) as c:
            if not c.execute("SELECT 1 FROM pg_indexes WHERE tablename = %s AND indexdef ILIKE '%%USING hnsw%%'",
                             (self.table,)).fetchone():
                return None
            return c.execute(f'SELECT count(*) FROM "{self.table}"').fetchone()[0]

    def _run(self) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            while self.rows_at_creation is None and not self._stop.wait(self.interval_s):
                self.rows_at_creation = self._rows_if_indexed(conn)
                self.seen_polling = self.rows_at_creation is not None


# -- LangChain -----------------------------------------------------------------------------------


def run_langchain(args: argparse.Namespace) -> dict:
    """langchain_core.indexing.index() into langchain-postgres' PGVectorStore, with a SQL record
    manager in the same database and cleanup="incremental" (the docs' choice for a loader that
    yields every page again on each crawl: changed pages' old chunks are deleted, unchanged
    chunks are skipped by their hash). Markdown separators, chunks measured in cl100k tokens."""
    from langchain_classic.indexes import SQLRecordManager
    from langchain_core.documents import Document
    from langchain_core.indexing import index
    from langchain_openai import OpenAIEmbeddings
    from langchain_postgres import PGEngine, PGVectorStore
    from langchain_postgres.v2.indexes import HNSWIndex
    from langchain_text_splitters import Language, RecursiveCharacterTextSplitter

    started = time.perf_counter()
    embeddings = OpenAIEmbeddings(model=MODEL, dimensions=DIMENSIONS, base_url=args.openai_url, api_key=API_KEY,
                                  check_embedding_ctx_length=False)
    engine = PGEngine.from_connection_string(driver_url(args.database, "psycopg"))
    if args.phase == "initial":
        engine.init_vectorstore_table(TABLE, DIMENSIONS)
    store = PGVectorStore.create_sync(engine, embedding_service=embeddings, table_name=TABLE)
    if args.phase == "initial" and args.hnsw:
        store.apply_vector_index(HNSWIndex())
    record_manager = SQLRecordManager(f"pgvector/{TABLE}", db_url=driver_url(args.database, "psycopg"))
    if args.phase == "initial":
        record_manager.create_schema()
    splitter = RecursiveCharacterTextSplitter.from_tiktoken_encoder(
        encoding_name="cl100k_base", chunk_size=args.chunk_tokens, chunk_overlap=args.overlap_tokens,
        separators=RecursiveCharacterTextSplitter.get_separators_for_language(Language.MARKDOWN))
    docs = [Document(page_content=text, metadata={"source": name}) for name, text in corpus_pages(args.corpus)]
    chunks = splitter.split_documents(docs)
    result = index(chunks, record_manager, store, cleanup="incremental", source_id_key="source")
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "pages": len(docs), "chunks_split": len(chunks), "result": dict(result),
            "rows": count_rows(args.database, TABLE), "hnsw": index_names(args.database, TABLE)}


# -- LlamaIndex ----------------------------------------------------------------------------------


def run_llamaindex(args: argparse.Namespace) -> dict:
    """An IngestionPipeline (SentenceSplitter, OpenAIEmbedding) with a PostgresDocumentStore and
    docstore_strategy=UPSERTS, writing to llama-index's PGVectorStore (hnsw_kwargs: the index is
    made with the table). Pages are Documents whose id is the file name, as SimpleDirectoryReader
    gives them with filename_as_id=True: a page whose hash changed is embedded again whole and its
    old nodes deleted, an unchanged page is skipped."""
    from llama_index.core import Document
    from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.embeddings.openai import OpenAIEmbedding
    from llama_index.storage.docstore.postgres import PostgresDocumentStore
    from llama_index.storage.kvstore.postgres import PostgresKVStore
    from llama_index.vector_stores.postgres import PGVectorStore

    started = time.perf_counter()
    sync_url, async_url = driver_url(args.database, "psycopg2"), driver_url(args.database, "asyncpg")
    hnsw = ({"hnsw_m": 16, "hnsw_ef_construction": 64, "hnsw_ef_search": 40, "hnsw_dist_method": "vector_cosine_ops"}
            if args.hnsw else None)
    vector_store = PGVectorStore(connection_string=sync_url, async_connection_string=async_url, table_name=TABLE,
                                 embed_dim=DIMENSIONS, hnsw_kwargs=hnsw)
    docstore = PostgresDocumentStore(PostgresKVStore(table_name="docstore", connection_string=sync_url,
                                                     async_connection_string=async_url))
    embed_model = OpenAIEmbedding(model=MODEL, dimensions=DIMENSIONS, api_base=args.openai_url, api_key=API_KEY)
    pipeline = IngestionPipeline(
        transformations=[SentenceSplitter(chunk_size=args.chunk_tokens, chunk_overlap=args.overlap_tokens), embed_model],
        docstore=docstore, vector_store=vector_store, docstore_strategy=DocstoreStrategy.UPSERTS)
    docs = [Document(text=text, id_=name, metadata={"file_name": name}) for name, text in corpus_pages(args.corpus)]
    nodes = pipeline.run(documents=docs)
    seconds = time.perf_counter() - started
    table = VECTOR_TABLES["llamaindex"]
    return {"seconds": seconds, "pages": len(docs), "nodes_written": len(nodes),
            "rows": count_rows(args.database, table), "hnsw": index_names(args.database, table)}


# -- CocoIndex -----------------------------------------------------------------------------------


def run_cocoindex(args: argparse.Namespace) -> dict:
    """A CocoIndex v1 app as its text_embedding example has it: localfs.walk_dir over the .md
    files, one memoized component per file, RecursiveSplitter (markdown), each chunk embedded by
    LiteLLMEmbedder (openai/, api_base = the fake) and declared as a row of a Postgres table target
    (pgvector); with --hnsw the target also declares an HNSW vector index. `update` once per phase:
    CocoIndex's state (--state, LMDB) tells it which files changed."""
    os.environ["COCOINDEX_DB"] = str(args.state)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
    app = cocoindex_app(args)
    started = time.perf_counter()
    app.update_blocking()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "rows": count_rows(args.database, TABLE), "hnsw": index_names(args.database, TABLE)}


def cocoindex_app(args: argparse.Namespace):
    """The app, defined here so that only the CocoIndex phase imports CocoIndex."""
    from collections.abc import AsyncIterator
    from dataclasses import dataclass
    from typing import Annotated

    import asyncpg
    import cocoindex as coco
    from cocoindex.connectors import localfs, postgres
    from cocoindex.ops.litellm import LiteLLMEmbedder
    from cocoindex.ops.text import RecursiveSplitter
    from cocoindex.resources.chunk import Chunk
    from cocoindex.resources.file import FileLike, PatternFilePathMatcher
    from cocoindex.resources.id import IdGenerator
    from numpy.typing import NDArray

    pg_db = coco.ContextKey[asyncpg.Pool]("bench_db")
    embedder_key = coco.ContextKey[LiteLLMEmbedder]("bench_embedder", detect_change=True)
    splitter = RecursiveSplitter()
    chunk_bytes = int(args.chunk_tokens * args.chars_per_token)
    overlap_bytes = int(args.overlap_tokens * args.chars_per_token)

    @coco.lifespan
    async def lifespan(builder: coco.EnvironmentBuilder) -> AsyncIterator[None]:
        async with asyncpg.create_pool(args.database) as pool:
            builder.provide(pg_db, pool)
            builder.provide(embedder_key, LiteLLMEmbedder(f"openai/{MODEL}", api_base=args.openai_url,
                                                          api_key=API_KEY, dimensions=DIMENSIONS))
            yield

    @dataclass
    class DocEmbedding:
        id: int
        filename: str
        text: str
        embedding: Annotated[NDArray, embedder_key]

    @coco.fn
    async def process_chunk(chunk: Chunk, filename: str, id_gen: IdGenerator,
                            table: postgres.TableTarget[DocEmbedding]) -> None:
        table.declare_row(row=DocEmbedding(id=await id_gen.next_id(chunk.text), filename=filename, text=chunk.text,
                                           embedding=await coco.use_context(embedder_key).embed(chunk.text)))

    @coco.fn(memo=True)
    async def process_file(file: FileLike, table: postgres.TableTarget[DocEmbedding]) -> None:
        text = await file.read_text()
        chunks = splitter.split(text, chunk_size=chunk_bytes, chunk_overlap=overlap_bytes, language="markdown")
        await coco.map(process_chunk, chunks, str(file.file_path.path), IdGenerator(), table)

    @coco.fn
    async def app_main(sourcedir: Path) -> None:
        table = await postgres.mount_table_target(
            pg_db, table_name=TABLE,
            table_schema=await postgres.TableSchema.from_class(DocEmbedding, primary_key=["id"]))
        if args.hnsw:
            table.declare_vector_index(column="embedding", metric="cosine", method="hnsw")
        files = localfs.walk_dir(sourcedir, recursive=True,
                                 path_matcher=PatternFilePathMatcher(included_patterns=["**/*.md"]))
        await coco.mount_each(process_file, files.items(), table)

    return coco.App(coco.AppConfig(name="BenchPeers"), app_main, sourcedir=args.corpus)


SYSTEMS = {"langchain": run_langchain, "llamaindex": run_llamaindex, "cocoindex": run_cocoindex}
# Where each system writes its vectors (llama-index's PGVectorStore prefixes its table name).
VECTOR_TABLES = {"langchain": TABLE, "llamaindex": f"data_{TABLE}", "cocoindex": TABLE}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    offline_tiktoken()
    try:
        with IndexWatch(args.database, VECTOR_TABLES[args.system]) as watch:
            result = SYSTEMS[args.system](args)
        if args.hnsw and args.phase == "initial":
            result["hnsw_created"] = watch.created(result["rows"])
    except BaseException as exc:  # noqa: BLE001 - reported to the bench, which goes on with the others
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}), flush=True)
        return 1
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
