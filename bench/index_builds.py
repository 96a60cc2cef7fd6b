"""What the search indexes cost around a bulk load (issue 24): the HNSW build with too little and
with enough `maintenance_work_mem`, and the GIN index of lexical search kept up row by row
against built once afterwards.

  hnsw   N random unit vectors of D dims (generated in SQL), then `CREATE INDEX CONCURRENTLY … USING
         hnsw (embedding vector_cosine_ops)` (the project's opclass, pgvector's default m=16 and
         ef_construction=64, max_parallel_maintenance_workers 1) with each memory of --memories;
         `auto` is core/build_memory.py's size for N vectors. pgvector's notice when the graph
         stops fitting is printed with the tuples it held.
  ef     With --ef-constructions (e.g. 64,40,32; at least 2 x m = 32) and --types (vector, halfvec: the
         float32 vectors indexed by their half-precision cast): the same vectors indexed with `auto` memory and
         each ef_construction in turn (pgvector's default is 64), each build timed and its recall@10
         measured against an exact scan for --queries random query vectors (hnsw.ef_search at
         pgvector's default 40). On uniformly random vectors every neighbour is about as far as
         any other, and recall says nothing (0.12-0.15 at every setting); with --clusters K the
         vectors (and queries) lie around K random centres with uniform noise: a cluster's members
         are all about as near a query, so its recall is a pessimistic stand-in for real embeddings.
  gin    The first --gin-pages pages of the throughput bench's corpus (bench/pipeline_throughput.py,
         its cache), cut at ~1,600 characters, COPYed in batches of 1,000 pages into a table shaped
         like `chunks`' lexical part (`text`, a generated `to_tsvector('english', text)` column): once
         with the GIN index in place, once without it and the index built afterwards (CONCURRENTLY,
         text_search.BUILD_MEMORY). WAL bytes from pg_stat_wal.

The last line is
`INDEX_BUILDS hnsw_vectors=… hnsw_small_s=… hnsw_auto_s=… gin_kept_s=… gin_after_s=… gin_wal_ratio=…`,
and with --ef-constructions ` ef=<ef_construction>[h]:<build s>:<recall@10>,…` (h: halfvec).

    .venv/bin/python bench/index_builds.py                                   # 50,000 vectors; ~5 min
    .venv/bin/python bench/index_builds.py --vectors 743000 --memories auto  # the 100,000-page load's
    .venv/bin/python bench/index_builds.py --memories auto --ef-constructions 64,40,32 --gin-pages 0 --clusters 1000
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from bench.database import bench_database  # noqa: E402
from rag_pipeline.core.build_memory import AUTO  # noqa: E402
from rag_pipeline.store import spaces, text_search  # noqa: E402

STEP = 50_000
CLUSTER_SPREAD = 0.5


def auto_memory(conn, vectors: int, dims: int) -> str:
    return spaces.sized_build_memory(conn, AUTO, AUTO, vectors, dims, 4)[0]


def write_vectors(conn, vectors: int, dims: int, clusters: int, seed: int):
    """Uniform vectors in [-0.5, 0.5)^dims, or with `clusters` each a random centre plus noise of
    CLUSTER_SPREAD a coordinate (a vector's cosine to its centre ~0.9, to its cluster ~0.8); returns
    the centres (numpy), for queries drawn like the vectors."""
    import numpy as np
    centroids = None
    if clusters:
        centroids = np.random.default_rng(seed).random((clusters, dims), dtype=np.float32) - 0.5
        conn.execute("CREATE TEMP TABLE bench_centroids (id int PRIMARY KEY, v float4[])")
        with conn.cursor().copy("COPY bench_centroids (id, v) FROM STDIN") as copy:
            for i, c in enumerate(centroids):
                copy.write_row((i, c.tolist()))
    for low in range(0, vectors, STEP):
        bounds = (low, min(vectors, low + STEP) - 1)
        if clusters:   # vector g is near centre g mod clusters
            conn.execute(f"INSERT INTO bench_vectors SELECT g, (SELECT array_agg(c.v[i] + {CLUSTER_SPREAD} * (random() - 0.5)"
                         f" ORDER BY i) FROM generate_series(1, {dims}) i)::vector({dims})"
                         f" FROM generate_series(%s::int, %s::int) g JOIN bench_centroids c ON c.id = g %% {clusters}",
                         bounds)
        else:          # each row's own vector: the subquery refers to the row, so it runs once a row
            conn.execute(f"INSERT INTO bench_vectors SELECT g, (SELECT array_agg(random() - 0.5) FROM generate_series(1, {dims})"
                         f" WHERE g >= 0)::vector({dims}) FROM generate_series(%s::int, %s::int) g", bounds)
    return centroids


def hnsw_builds(conn, vectors: int, dims: int, memories: list[str], efs: list[int], queries: int,
                seed: int, clusters: int, types: list[str]) -> tuple[dict[str, float], dict[tuple[str, int], tuple[float, float]]]:
    conn.execute(f"CREATE TABLE bench_vectors (id int, embedding vector({dims}))")
    started = time.monotonic()
    centroids = write_vectors(conn, vectors, dims, clusters, seed)
    conn.execute("VACUUM ANALYZE bench_vectors")
    shape = f"in {clusters:,} clusters" if clusters else "uniformly random"
    print(f"hnsw: {vectors:,} {dims}-dim vectors {shape} written in {time.monotonic() - started:.1f} s", flush=True)
    took = {}
    for memory in memories:
        granted = auto_memory(conn, vectors, dims) if memory == AUTO else memory
        conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (granted,))
        conn.execute("SET max_parallel_maintenance_workers = 1")
        started = time.monotonic()
        conn.execute("CREATE INDEX CONCURRENTLY bench_vectors_hnsw ON bench_vectors USING hnsw (embedding vector_cosine_ops)")
        took[memory] = time.monotonic() - started
        size = conn.execute("SELECT pg_size_pretty(pg_relation_size('bench_vectors_hnsw'))").fetchone()[0]
        print(f"hnsw: maintenance_work_mem {memory} ({granted}): built in {took[memory]:.1f} s, index {size}", flush=True)
        conn.execute("DROP INDEX bench_vectors_hnsw")
    quality = ef_builds(conn, vectors, dims, efs, queries, seed, centroids, types) if efs else {}
    conn.execute("DROP TABLE bench_vectors")
    return took, quality


def ef_builds(conn, vectors: int, dims: int, efs: list[int], queries: int, seed: int,
              centroids, types: list[str]) -> dict[tuple[str, int], tuple[float, float]]:
    """Each index type (`vector`, or `halfvec`: the float32 vectors indexed by their half-precision
    cast, as spaces over 2,000 dims are) and ef_construction: (build seconds, recall@10 against the
    exact float32 top 10)."""
    import numpy as np
    rng = np.random.default_rng(seed + 1)
    probes = [rng.random(dims, dtype=np.float32) - 0.5 for _ in range(queries)]
    if centroids is not None:   # a query near a centre, as the vectors are
        probes = [centroids[rng.integers(len(centroids))] + CLUSTER_SPREAD * p for p in probes]
    top = ("SELECT id FROM bench_vectors ORDER BY embedding <=> %s::vector LIMIT 10")
    conn.execute("SET enable_indexscan = off")
    exact = [{r[0] for r in conn.execute(top, (str(p.tolist()),))} for p in probes]
    conn.execute("RESET enable_indexscan")
    conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (auto_memory(conn, vectors, dims),))
    conn.execute("SET max_parallel_maintenance_workers = 1")
    quality = {}
    for kind in types:
        cast = "" if kind == "vector" else f"::halfvec({dims})"
        indexed = f"SELECT id FROM bench_vectors ORDER BY embedding{cast} <=> %s{cast or '::vector'} LIMIT 10"
        for ef in efs:
            started = time.monotonic()
            conn.execute(f"CREATE INDEX CONCURRENTLY bench_vectors_hnsw ON bench_vectors USING hnsw"
                         f" ((embedding{cast}) {kind}_cosine_ops) WITH (ef_construction = {int(ef)})")
            took = time.monotonic() - started
            found = [{r[0] for r in conn.execute(indexed, (str(p.tolist()),))} for p in probes]
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + indexed, (str(probes[0].tolist()),)))
            if "bench_vectors_hnsw" not in plan:
                raise RuntimeError(f"the recall queries did not use the HNSW index:\n{plan}")
            recall = sum(len(f & e) for f, e in zip(found, exact)) / (10 * len(probes))
            quality[(kind, ef)] = (took, recall)
            size = conn.execute("SELECT pg_size_pretty(pg_relation_size('bench_vectors_hnsw'))").fetchone()[0]
            print(f"hnsw: {kind} ef_construction {ef}: built in {took:.1f} s, index {size}, recall@10 {recall:.3f}"
                  f" over {len(probes)} queries (ef_search 40)", flush=True)
            conn.execute("DROP INDEX bench_vectors_hnsw")
    return quality


def corpus_chunks(pages: int, seed: int) -> list[list[str]]:
    from bench.pipeline_throughput import make_corpus

    batches, batch = [], []
    for n, page in enumerate(make_corpus(pages, seed)[:pages]):
        text = ""
        for block in page.blocks:
            text += block + "\n\n"
            if len(text) > 1_600:
                batch.append(text)
                text = ""
        if text:
            batch.append(text)
        if (n + 1) % 1_000 == 0:
            batches.append(batch)
            batch = []
    return batches + ([batch] if batch else [])


def gin_load(conn, batches: list[list[str]], index_first: bool) -> tuple[float, float, int]:
    """(seconds loading, seconds building the index afterwards, WAL bytes)."""
    conn.execute("DROP TABLE IF EXISTS bench_chunks")
    conn.execute("CREATE TABLE bench_chunks (id uuid PRIMARY KEY, text text,"
                 " text_search tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED)")
    if index_first:
        conn.execute("CREATE INDEX bench_chunks_gin ON bench_chunks USING gin (text_search)")
    wal = conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0]
    started = time.monotonic()
    for batch in batches:
        with conn.transaction(), conn.cursor().copy("COPY bench_chunks (id, text) FROM STDIN") as copy:
            for text in batch:
                copy.write_row((uuid.uuid4(), text))
    loaded = time.monotonic()
    if not index_first:
        conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (text_search.BUILD_MEMORY,))
        conn.execute("CREATE INDEX CONCURRENTLY bench_chunks_gin ON bench_chunks USING gin (text_search)")
    wal = int(conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0] - wal)
    return loaded - started, time.monotonic() - loaded, wal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=50_000)
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--memories", default="16MB,auto", help="maintenance_work_mem of each HNSW build")
    parser.add_argument("--ef-constructions", default="", help="e.g. 64,40,32: a build and its recall for each")
    parser.add_argument("--types", default="vector",
                        help="index types for the ef builds: vector, halfvec (the vectors' half-precision cast)")
    parser.add_argument("--queries", type=int, default=200, help="random queries for the recall of each ef build")
    parser.add_argument("--clusters", type=int, default=0,
                        help="vectors around this many random centres (0: uniform; recall needs clusters)")
    parser.add_argument("--gin-pages", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    memories = [m.strip() for m in args.memories.split(",") if m.strip()]
    with bench_database("bench_index_builds") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: "hnsw" in d.message_primary and print(f"  PostgreSQL: {d.message_primary}",
                                                                               flush=True))
        efs = [int(e) for e in args.ef_constructions.split(",") if e.strip()]
        if any(ef < 32 for ef in efs):   # pgvector: ef_construction >= 2 * m, and m is 16
            parser.error("each --ef-constructions value must be at least 32 (2 x pgvector's m=16)")
        types = [t.strip() for t in args.types.split(",") if t.strip()]
        if set(types) - {"vector", "halfvec"}:
            parser.error("--types takes vector and halfvec")
        hnsw, quality = hnsw_builds(conn, args.vectors, args.dims, memories, efs, args.queries, args.seed,
                                     args.clusters, types)
        kept = after = kept_wal = after_wal = float("nan")
        if args.gin_pages:   # --gin-pages 0: the HNSW builds alone
            batches = corpus_chunks(args.gin_pages, args.seed)
            print(f"gin: {args.gin_pages:,} pages, {sum(map(len, batches)):,} chunks", flush=True)
            kept, _, kept_wal = gin_load(conn, batches, index_first=True)
            bare, build, after_wal = gin_load(conn, batches, index_first=False)
            after = bare + build
            print(f"gin: kept up while loading {kept:.1f} s, {kept_wal / 2**20:,.0f} MB of WAL; without it {bare:.1f} s "
                  f"and built afterwards in {build:.1f} s, {after:.1f} s in all, {after_wal / 2**20:,.0f} MB; "
                  f"the upkeep ({kept - bare:.1f} s) against the build: {(kept - bare) / build:.1f}x", flush=True)
    small = hnsw.get(memories[0], float("nan"))
    print(f"INDEX_BUILDS hnsw_vectors={args.vectors} hnsw_small_s={small:.1f} hnsw_auto_s={hnsw.get(AUTO, float('nan')):.1f} "
          f"gin_kept_s={kept:.1f} gin_after_s={after:.1f} gin_wal_ratio={kept_wal / max(after_wal, 1):.2f}"
          + (" ef=" + ",".join(f"{ef}{'' if kind == 'vector' else 'h'}:{t:.1f}:{r:.3f}" for (kind, ef), (t, r)
                               in quality.items()) if quality else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
