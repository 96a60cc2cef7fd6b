"""Search quality: recall@10 of the HNSW index against exact search, and latency, at several
`hnsw.ef_search` values (issue 12, point 1).

A fresh database gets `--pages` pages of `--chunks-per-page` chunks (default 5,000 × 20 = 100,000)
written through the project's own path (deliveries stored, routed and applied by `apply_batch`,
so the index is built incrementally, as production builds it), embedded by an in-process
embedder that gives each text a unit vector near one of `--clusters` random centres (384 dims):
clustered like real embeddings, which is what makes approximate search miss. Then `--queries`
query vectors (near the same centres) are searched with `store.search.nearest` at each ef_search,
and their true 10 nearest found by the same SQL with index scans off (exact). The same after a
bulk rebuild of the index (REINDEX). Printed: recall@10 (mean, and queries with none of their
true 10), latency p50/p95/p99 per ef_search, and the default the project uses. Last line:
`SEARCH recall@10=… p95=…ms at N chunks` (the project's default search settings, incremental index).

    .venv/bin/python bench/search_quality.py [--pages 5000] [--chunks-per-page 20] [--queries 500]
        [--ef 40,80,120,160,200,320] [--clusters 200] [--seed 5] [--builds 16:64,16:128,24:128]

`--builds`: then the index dropped and built once (concurrently, as after a bulk load) with each
HNSW (m, ef_construction), timed and sized, and searched at the default ef_search: one `BUILD …`
line each (issue 45, point 5).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from psycopg import sql  # noqa: E402

from bench.database import bench_database  # noqa: E402
from bench.loading import apply_pages  # noqa: E402
from rag_pipeline.embedders.base import EmbedResult  # noqa: E402
from rag_pipeline.settings import Settings  # noqa: E402
from rag_pipeline.store import db, search, spaces  # noqa: E402

DIMENSIONS = 384
PAGES_PER_BATCH = 250


class ClusteredEmbedder:
    """Each text near one of the centres (chosen by its hash), the same text always the same vector."""

    model = "bench-clustered"
    dimensions = DIMENSIONS

    def __init__(self, centres: np.ndarray, spread: float):
        self.centres, self.spread = centres, spread

    def vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        v = self.centres[seed % len(self.centres)] + self.spread * rng.standard_normal(DIMENSIONS)
        return (v / np.linalg.norm(v)).astype(np.float32)

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        return EmbedResult([self.vector(t) for t in texts], sum(len(t) // 4 for t in texts), 1, 0)


def page_text(n: int, chunks: int) -> str:
    # One paragraph a chunk: a budget of 40 tokens cuts each paragraph on its own.
    paragraphs = [f"Paragraph {i} of page {n}: {uuid.uuid4().hex} {uuid.uuid4().hex}." for i in range(chunks)]
    return f"# Page {n}\n\n" + "\n\n".join(paragraphs)


def load(url: str, pages: int, per_page: int, embedder) -> int:
    return apply_pages(url, ((f"https://docs.example.com/q/{n}", page_text(n, per_page)) for n in range(pages)),
                       embedder, (40, 0), per_batch=PAGES_PER_BATCH, report_every=1000)


def exact(conn, space: spaces.Space, q: np.ndarray, k: int) -> list[str]:
    """The true k nearest: the same query as search, with index scans off."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        rows = search.nearest(conn, space, q, k, ef_search=None)
    return [f"{r.page_url}#{r.chunk_index}" for r in rows]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure(conn, space, queries, truth, ef_values, label: str) -> dict[int, tuple]:
    """Per ef_search: (mean recall@10, queries with none of their true 10, queries below 0.5,
    p50, p95, p99 ms)."""
    results = {}
    print(f"{label}:")
    print(f"  {'ef_search':>9}  {'recall@10':>9}  {'0 of 10':>7}  {'< 0.5':>5}  {'p50 ms':>7}  {'p95 ms':>7}  {'p99 ms':>7}")
    for ef in ef_values:
        recalls, times = [], []
        for q, true in zip(queries, truth):
            t0 = time.perf_counter()
            hits = search.nearest(conn, space, q, 10, ef_search=ef)
            times.append((time.perf_counter() - t0) * 1000)
            got = {f"{r.page_url}#{r.chunk_index}" for r in hits}
            recalls.append(len(got & set(true)) / len(true))
        row = (float(np.mean(recalls)), sum(r == 0 for r in recalls), sum(r < 0.5 for r in recalls),
               pct(times, 50), pct(times, 95), pct(times, 99))
        results[ef] = row
        print(f"  {ef:>9}  {row[0]:>9.3f}  {row[1]:>7}  {row[2]:>5}  {row[3]:>7.1f}  {row[4]:>7.1f}  {row[5]:>7.1f}",
              flush=True)
    return results


def compare_builds(conn, space, queries, truth, builds: list[spaces.HnswBuild], ef: int) -> list[str]:
    """Each build of the index over the same loaded table, as production builds it after a bulk
    load (concurrently, SPACE_BUILD_MEMORY `auto`): its time, size, and search at the default."""
    lines = []
    for build in builds:
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(space.index_name())))
        t0 = time.perf_counter()
        spaces.build_index_concurrently(conn, space, "auto", build=build)
        seconds = time.perf_counter() - t0
        size = conn.execute("SELECT pg_relation_size(%s)", (space.index_name(),)).fetchone()[0]
        recall, zero, below, _, p95, _ = measure(conn, space, queries, truth, [ef],
                                                 f"built once, m={build.m} ef_construction={build.ef_construction}")[ef]
        lines.append(f"m={build.m} ef_construction={build.ef_construction}: build {seconds:.1f} s, "
                     f"{size / 2**20:.0f} MiB, recall@10 {recall:.3f}, none of 10 {zero}, below 0.5 {below}, "
                     f"p95 {p95:.1f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--chunks-per-page", type=int, default=20)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--ef", default="40,80,120,160,200,320")
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--spread", type=float, default=0.6, help="noise around a centre, per dimension")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--builds", default="", metavar="M:EFC,…",
                        help="after the rest, build the index once with each (m, ef_construction), e.g. 16:64,16:128,24:128")
    args = parser.parse_args()
    builds = [spaces.HnswBuild(*(int(v) for v in pair.split(":"))) for pair in args.builds.split(",") if pair]
    ef_values = [int(v) for v in args.ef.split(",")]
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((args.clusters, DIMENSIONS)) / np.sqrt(DIMENSIONS) * 3
    embedder = ClusteredEmbedder(centres, args.spread / np.sqrt(DIMENSIONS))
    default_ef = Settings().search_ef_search
    with bench_database("search") as url:
        print(f"search quality: {args.pages:,} pages × {args.chunks_per_page} chunks, {DIMENSIONS} dims, "
              f"{args.clusters} clusters, {args.queries} queries")
        chunks = load(url, args.pages, args.chunks_per_page, embedder)
        with db.connection(url) as conn:
            space = spaces.active(conn)
            queries = [embedder.vector(f"query {i} {uuid.uuid4().hex}") for i in range(args.queries)]
            t0 = time.perf_counter()
            truth = [exact(conn, space, q, 10) for q in queries]
            print(f"  exact search for {len(queries)} queries: {time.perf_counter() - t0:.1f} s")
            grid = sorted(set(ef_values) | {default_ef})
            incremental = measure(conn, space, queries, truth, grid, f"incremental index ({chunks:,} chunks)")
            t0 = time.perf_counter()
            conn.execute(sql.SQL("REINDEX INDEX {}").format(sql.Identifier(space.index_name())))
            print(f"  bulk rebuild (REINDEX): {time.perf_counter() - t0:.1f} s")
            measure(conn, space, queries, truth, grid, "after a bulk rebuild")
            compared = compare_builds(conn, space, queries, truth, builds, default_ef)
    for line in compared:
        print(f"BUILD {line}")
    recall, _, _, _, p95, _ = incremental[default_ef]
    print(f"default: hnsw.ef_search = max(SEARCH_EF_SEARCH={default_ef}, 2k), iterative scan relaxed_order")
    print(f"SEARCH recall@10={recall:.3f} p95={p95:.1f}ms at {chunks} chunks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
