"""A model switch at scale: `space build` and `space activate` over N generated chunks while pages
keep switching in and search keeps answering (issue 10, point 4).

A fresh database gets N live chunks (default 1,000,000; N/8 pages) of an active space, written in
bulk (its table loaded, then its HNSW index built). Then, all at once:

  build      model_switch.build() for a second model (a new space of other dimensions): the keyset
             walk over `chunks`, the texts embedded by an instant in-process embedder (the embedding
             API is not what is measured here), the new space's HNSW index built concurrently;
             then model_switch.activate()
  switcher   a page switch after another through the project's own path (a delivery stored,
             routed, applied by apply_batch with the active space's embedder), each timed, and
             its wait for the `chunks` lock that the start of a build and the flip take
  searcher   search.nearest() on the active space every 50 ms, each timed; errors counted

Printed: the walk's and the index's time, the activation's, the longest lock wait of a switch
and its longest duration against the switches before the build, search latency before, during and
after, and errors. The last line is
`SPACE_BUILD chunks=… build_s=… index_s=… activate_s=… longest_switch_wait_ms=… search_errors=…`.

    .venv/bin/python bench/space_build.py [--chunks 1000000] [--old-dims 64] [--new-dims 128]
        [--memory 1GB]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.database import bench_database  # noqa: E402
from rag_pipeline.embedders.base import EmbedResult  # noqa: E402
from rag_pipeline.ingest import batch_apply as batch_apply  # noqa: E402
from rag_pipeline.ingest import model_switch  # noqa: E402
from rag_pipeline.ingest.routing import route_batch  # noqa: E402
from rag_pipeline.store import chunks as chunk_store  # noqa: E402
from rag_pipeline.store import db, deliveries, search, spaces  # noqa: E402
import os

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

CHUNKS_PER_PAGE = 8
MAX_PAGE_BYTES = 10_000_000


class InstantEmbedder:
    """Unit vectors from each text's hash: the same text always gets the same vector."""

    def __init__(self, model: str, dimensions: int):
        self.model, self.dimensions = model, dimensions

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        vectors = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dimensions).astype(np.float32)
            vectors.append(v / np.linalg.norm(v))
        return EmbedResult(vectors, sum(len(t) // 4 for t in texts), 1, 0)


def load(url: str, n_chunks: int, old: InstantEmbedder, memory: str) -> spaces.Space:
    """N chunks of N/8 pages in the active space, in bulk (SQL), then the space's index."""
    n_pages = n_chunks // CHUNKS_PER_PAGE
    with db.connection(url) as conn:
        space = spaces.ensure_active(conn, old.model, old.dimensions)
        conn.execute(f"DROP INDEX {space.index_name()}")
        conn.execute(
            "INSERT INTO pages (page_id, url, source_text, source_hash, indexed_hash, last_verified_at,"
            " last_changed_at, chunker_version)"
            " SELECT md5('p' || i)::uuid, 'https://docs.example.com/p/' || i, 'bulk', 'bulk-' || i,"
            "        'bulk-' || i, now(), now(), 'bulk'"
            " FROM generate_series(1, %s) i", (n_pages,))
        conn.execute(
            "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash,"
            " token_count, chunker_version)"
            " SELECT md5('c' || i)::uuid, md5('p' || (1 + i / %(per)s))::uuid, i %% %(per)s, t, t,"
            "        sha256(convert_to(t, 'UTF8')), 60, 'bulk'"
            " FROM generate_series(0, %(n)s - 1) i,"
            "      LATERAL (SELECT 'Section ' || i || ' of the handbook: the relay ' || md5(i::text)"
            "               || ' forwards pushes ' || md5((i * 7)::text) || ' to the webhook.' AS t) x",
            {"per": CHUNKS_PER_PAGE, "n": n_pages * CHUNKS_PER_PAGE})
        # Vectors in the active space for every text: cache and live table, random unit vectors.
        conn.execute(
            "CREATE TEMP TABLE bulk_vectors AS SELECT c.chunk_id, c.embed_hash,"
            " (SELECT l2_normalize(array_agg(random() - 0.5)::vector) FROM generate_series(1, %s) d"
            "   WHERE c.chunk_id IS NOT NULL) AS embedding FROM chunks c", (old.dimensions,))
        conn.execute("INSERT INTO vectors (space_id, embed_hash, embedding, token_count)"
                     " SELECT %s, embed_hash, embedding, 60 FROM bulk_vectors", (space.space_id,))
        conn.execute("INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)"
                     " SELECT chunk_id, %s, embed_hash, embedding FROM bulk_vectors", (space.space_id,))
        conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (memory,))
        spaces.create_index(conn, space)
        conn.execute("RESET maintenance_work_mem")
    with db.connection(url) as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        conn.autocommit = False
    return space


class Switcher(threading.Thread):
    """Page switches one after another through the project's path; each timed."""

    def __init__(self, url: str, embedders: dict[str, InstantEmbedder], stop: threading.Event):
        super().__init__(daemon=True)
        self.url, self.embedders, self.stop_event = url, embedders, stop
        self.samples: list[tuple[float, float, float]] = []   # (start, lock wait s, switch s)
        self.errors: list[str] = []
        self.phase = "before"
        self.by_phase: dict[str, list[tuple[float, float]]] = {}

    def run(self) -> None:
        real_hold = chunk_store.hold_off_space_flip
        waits: list[float] = []

        def timed_hold(conn):
            t = time.perf_counter()
            real_hold(conn)
            waits.append(time.perf_counter() - t)

        chunk_store.hold_off_space_flip = timed_hold
        i = 0
        with db.connection(self.url) as conn:
            while not self.stop_event.is_set():
                i += 1
                page = f"https://docs.example.com/switched/{i % 50}"
                text = f"# Switched page {i % 50}\n\nRevision {i}: the relay forwards pushes.\n\n" + "\n\n".join(
                    f"Paragraph {k} of revision {i}: {uuid.uuid4().hex}" for k in range(6))
                deliveries.insert(conn, rid=uuid.uuid4().hex, url=page, pushed_url=None, crawler_status=200,
                                  original_status=200, content_type="text/markdown",
                                  body=gzip.compress(text.encode()), body_encoding="gzip")
                route_batch(conn, 10, MAX_PAGE_BYTES)
                work = deliveries.queued_work(conn, 10)
                waits.clear()
                t0 = time.perf_counter()
                try:
                    events = list(batch_apply.apply_batch(
                        conn, work, batch_key=None,
                        embedder_for=lambda space: self.embedders[space.model] if space else None,
                        chunk_budget=lambda space: (512, 64), max_page_bytes=MAX_PAGE_BYTES,
                        retry=batch_apply.RetryPolicy(3, 1.0)))
                except Exception as exc:  # noqa: BLE001 - counted and shown
                    self.errors.append(repr(exc))
                    continue
                took = time.perf_counter() - t0
                failed = [e for e in events if isinstance(e, batch_apply.Failed)]
                if failed:
                    self.errors.append(failed[0].failure.reason)
                self.by_phase.setdefault(self.phase, []).append((max(waits, default=0.0), took))


class Searcher(threading.Thread):
    def __init__(self, url: str, embedders: dict[str, InstantEmbedder], stop: threading.Event):
        super().__init__(daemon=True)
        self.url, self.embedders, self.stop_event = url, embedders, stop
        self.phase = "before"
        self.by_phase: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.empty = 0

    def run(self) -> None:
        rng = np.random.default_rng(3)
        with db.connection(self.url) as conn:
            while not self.stop_event.wait(0.05):
                try:
                    active = spaces.active(conn)
                    q = rng.standard_normal(active.dimensions).astype(np.float32)
                    t0 = time.perf_counter()
                    hits = search.nearest(conn, active, q / np.linalg.norm(q), k=10)
                    self.by_phase.setdefault(self.phase, []).append(time.perf_counter() - t0)
                    self.empty += not hits
                except Exception as exc:  # noqa: BLE001 - counted and shown
                    self.errors.append(repr(exc))


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--old-dims", type=int, default=64)
    parser.add_argument("--new-dims", type=int, default=128)
    parser.add_argument("--memory", default="1GB", help="maintenance_work_mem for the index builds")
    parser.add_argument("--settle-s", type=float, default=10.0, help="switches and searches before the build")
    args = parser.parse_args()
    old = InstantEmbedder("bench-old", args.old_dims)
    new = InstantEmbedder("bench-new", args.new_dims)
    embedders = {old.model: old, new.model: new}
    with bench_database("bench_space") as url:
        t = time.monotonic()
        load(url, args.chunks, old, args.memory)
        print(f"loaded {args.chunks:,} chunks of {args.chunks // CHUNKS_PER_PAGE:,} pages ({args.old_dims} dims)"
              f" with their index in {time.monotonic() - t:.1f} s", flush=True)
        stop = threading.Event()
        switcher, searcher = Switcher(url, embedders, stop), Searcher(url, embedders, stop)
        switcher.start(), searcher.start()
        time.sleep(args.settle_s)
        switcher.phase = searcher.phase = "build"
        walked = []
        with db.connection(url) as conn:
            t0 = time.monotonic()
            result = model_switch.build(conn, new, maintenance_work_mem=args.memory,
                                        on_progress=lambda r: walked.append((time.monotonic(), r.chunks_walked)))
            build_s = time.monotonic() - t0
            switcher.phase = searcher.phase = "activate"
            t1 = time.monotonic()
            flipped = model_switch.activate(conn, new)
            activate_s = time.monotonic() - t1
        switcher.phase = searcher.phase = "after"
        time.sleep(args.settle_s)
        stop.set()
        switcher.join(60), searcher.join(60)
        with db.connection(url) as conn:
            live = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
            in_new = conn.execute("SELECT count(*) FROM space_vectors sv JOIN chunks c USING (chunk_id)"
                                  " WHERE sv.space_id = %s AND sv.embed_hash = c.embed_hash",
                                  (flipped.space_id,)).fetchone()[0]
    walk_s = build_s - result.index_s
    print(f"build: walked {result.chunks_walked:,} chunks and embedded {result.texts_embedded:,} texts in "
          f"{walk_s:.1f} s ({result.chunks_walked / max(walk_s, 1e-9):,.0f} chunks/s); index "
          f"({args.new_dims} dims) built concurrently in {result.index_s:.1f} s; build {build_s:.1f} s")
    print(f"activate: {activate_s:.2f} s (backlog worked off, then the flip); active now {flipped.model}; "
          f"{in_new:,} of {live:,} live chunks have their vector in the new space")
    wait_max = 0.0
    for phase in ("before", "build", "activate", "after"):
        rows = switcher.by_phase.get(phase, [])
        waits, took = [w for w, _ in rows], [d for _, d in rows]
        lat = searcher.by_phase.get(phase, [])
        if phase != "before":
            wait_max = max([wait_max, *waits])
        print(f"  {phase:<8} switches {len(rows):>4}: lock wait max {max(waits, default=0) * 1000:7.1f} ms, "
              f"switch p50 {pct(took, 50) * 1000:6.1f} ms max {max(took, default=0) * 1000:7.1f} ms | "
              f"searches {len(lat):>4}: p50 {pct(lat, 50) * 1000:6.1f} ms p95 {pct(lat, 95) * 1000:6.1f} ms "
              f"max {max(lat, default=0) * 1000:7.1f} ms")
    errors = switcher.errors + searcher.errors
    print(f"errors: {len(switcher.errors)} in switches, {len(searcher.errors)} in searches, "
          f"{searcher.empty} empty answers" + (f"; first: {errors[0]}" if errors else ""))
    ok = in_new == live and not errors and not searcher.empty
    print(f"SPACE_BUILD chunks={args.chunks} build_s={build_s:.1f} index_s={result.index_s:.1f} "
          f"activate_s={activate_s:.2f} longest_switch_wait_ms={wait_max * 1000:.1f} "
          f"search_errors={len(searcher.errors)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
