"""When a bulk load should drop a space's HNSW index and build it again, rather than insert
through it: (a) insert B new vectors into the indexed table of N, or (b) drop the index, insert
the B rows into the bare table and build the index again over N+B (CONCURRENTLY, as the project
does). The threshold is read off the measurements: "defer when B ≥ max(FLOOR, RATIO × N)".

Everything runs on the project's own schema and code: a fresh migrated database (DATABASE_URL's
server, or an embedded one), a space's partition `space_vectors_<id>` made by spaces.create_table,
its index built by spaces.build_index_concurrently (`_index_sql`: hnsw on embedding::vector(D),
vector_cosine_ops, with max_parallel_maintenance_workers) and dropped by spaces.drop_index
(DROP INDEX CONCURRENTLY), and every row written by
space_vectors.copy_cached (INSERT … SELECT from `chunks` JOIN the `vectors` cache, ON CONFLICT DO
NOTHING, one transaction per batch of at most model_switch.WALK_PAGE rows), with the FK to
`chunks`: matching pages/chunks rows and cached vectors (random unit float32 vectors, numpy,
fixed seed) are created first, outside any timing.

One pass per dimension grows the table monotonically and measures:

  c_idx(n)    ms per row inserted through the index: a sample of S rows at each N of --ns
              (cumulative times kept at each B of --bs and --probes the sample reaches)
  c_plain     ms per row inserted with no HNSW index (the growth between sizes)
  build(n)    a concurrent build over n rows, at each N of --ns, at each B of --bs and --probes
              (the N=0 cells) and of --extra, and once on the empty table (a concurrent build's
              fixed cost), with max_parallel_maintenance_workers = --workers
  drop        DROP INDEX CONCURRENTLY

and, at --compare-at rows, the same build as a plain (not concurrent) CREATE INDEX, with the
other worker counts of --compare-workers, and once more as first (the machine is shared: the
quicker of the two goes into the model). A cell of the table is

  (a) = the sum of c_idx(n) over n = N … N+B   (c_idx interpolated between the samples, held
        flat past the last: an underestimate there, which favours keeping the index)
  (b) = drop + B × c_plain + build(N+B)        (build interpolated between measured sizes,
        extrapolated past the largest with its last slope)

marked `=` where the cell itself was measured. The break-even B*(N) solves (a) = (b) on that
model; RATIO is the largest B*(N)/N over N ≥ 10,000 (over every N > 0 in a run without one),
rounded up to 0.05; FLOOR is B*(0), the break-even against an empty index, rounded up to two
significant digits. The last line is
`HNSW_THRESHOLD dims=384 insert_idx_ms_per_row=… insert_plain_ms_per_row=… build_ms_per_row_at_100k=… ratio=… floor=…`
(insert_idx at the largest N; build per row at 100,000 rows, interpolated if not built).

    .venv/bin/python bench/hnsw_threshold.py       # 384 dims to 100k (+ a build at 120k), 1536 to 10k; ~6-7 min
    .venv/bin/python bench/hnsw_threshold.py --ns 0,2000 --bs 500,1000 --sample 500 --compare-at 1000 \\
        --extra 3000 --wide-ns 0,1000 --wide-bs 500 --wide-sample 300                   # a small run, ~15 s
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from psycopg import sql  # noqa: E402

from bench.database import bench_database  # noqa: E402
from rag_pipeline.ingest.model_switch import WALK_PAGE  # noqa: E402
from rag_pipeline.store import db, space_vectors, spaces  # noqa: E402

CHUNKS_PER_PAGE = 8


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def chunk_id(i: int) -> uuid.UUID:
    return uuid.UUID(hashlib.md5(f"c{i}".encode()).hexdigest())


def embed_hash(i: int) -> bytes:
    return hashlib.sha256(f"bench-{i}".encode()).digest()


def make_chunks(conn, n: int) -> None:
    """n live chunks (n/8 pages); chunk i has id md5('c'||i) and embed_hash sha256('bench-'||i)."""
    pages = n // CHUNKS_PER_PAGE + 1
    with conn.transaction():
        conn.execute(
            "INSERT INTO pages (page_id, url, source_text, source_hash, indexed_hash, last_verified_at,"
            " last_changed_at, chunker_version)"
            " SELECT md5('p' || i)::uuid, 'https://docs.example.com/p/' || i, 'bulk', 'bulk-' || i,"
            "        'bulk-' || i, now(), now(), 'bulk' FROM generate_series(0, %s - 1) i", (pages,))
        conn.execute(
            "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash,"
            " token_count, chunker_version)"
            " SELECT md5('c' || i)::uuid, md5('p' || (i / %(per)s))::uuid, i %% %(per)s, t, t,"
            "        sha256(convert_to('bench-' || i, 'UTF8')), 60, 'bulk'"
            " FROM generate_series(0, %(n)s - 1) i,"
            "      LATERAL (SELECT 'Section ' || i || ' of the handbook: the relay ' || md5(i::text)"
            "               || ' forwards pushes to the webhook.' AS t) x",
            {"per": CHUNKS_PER_PAGE, "n": n})


def make_space(conn, dims: int, n: int, seed: int) -> spaces.Space:
    """A space of `dims` with its (empty) partition, and a cached vector for chunks 0..n-1."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO embedding_spaces (model, dimensions, status) VALUES (%s, %s, 'building')"
            " RETURNING space_id, model, dimensions, status", (f"bench-{dims}", dims)).fetchone()
        space = spaces.Space(*row)
        spaces.create_table(conn, space)
    rng = np.random.default_rng(seed + dims)
    with conn.transaction(), conn.cursor() as cur:
        with cur.copy("COPY vectors (space_id, embed_hash, embedding, token_count) FROM STDIN"
                      " WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "bytea", "vector", "int4"])
            for start in range(0, n, 10_000):
                block = rng.standard_normal((min(10_000, n - start), dims), dtype=np.float32)
                block /= np.linalg.norm(block, axis=1, keepdims=True)
                for k, v in enumerate(block):
                    copy.write_row((space.space_id, embed_hash(start + k), v, 60))
    conn.execute("ANALYZE vectors")
    return space


@dataclass
class Build:
    rows: int
    seconds: float
    workers: str          # "requested/launched" as the server logged them
    spilled: bool         # the graph outgrew maintenance_work_mem


@dataclass
class Run:
    dims: int
    memory: str
    workers: int
    builds: dict[int, Build] = field(default_factory=dict)
    compare: list[tuple[str, Build]] = field(default_factory=list)
    idx_segments: list[tuple[int, int, int, float]] = field(default_factory=list)   # (N, start n, rows, s)
    idx_cumulative: dict[tuple[int, int], float] = field(default_factory=dict)  # (N, B) -> s
    plain_rows: int = 0
    plain_s: float = 0.0
    drops: list[float] = field(default_factory=list)
    empty_build_s: float = 0.0


class Bench:
    def __init__(self, conn, space: spaces.Space, run: Run):
        self.conn, self.space, self.run = conn, space, run
        self.size = 0
        self.messages: list[str] = []
        conn.add_notice_handler(lambda d: self.messages.append(d.message_primary or ""))

    def insert(self, upto: int) -> float:
        """Rows size..upto-1 through the project's path, a transaction per batch; seconds."""
        t = time.perf_counter()
        while self.size < upto:
            end = min(upto, self.size + WALK_PAGE)
            with self.conn.transaction():
                space_vectors.copy_cached(self.conn, self.space, [chunk_id(i) for i in range(self.size, end)])
            self.size = end
        return time.perf_counter() - t

    def grow_plain(self, upto: int) -> None:
        rows = upto - self.size
        if rows > 0:
            self.run.plain_s += self.insert(upto)
            self.run.plain_rows += rows

    def build(self, workers: int, concurrently: bool = True) -> Build:
        self.conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)", (str(workers),))
        self.conn.execute("SELECT set_config('client_min_messages', 'debug1', false)")   # workers used
        self.messages.clear()
        t = time.perf_counter()
        if concurrently:
            spaces.build_index_concurrently(self.conn, self.space, self.run.memory, parallel_workers=workers)
        else:
            with self.conn.transaction():
                self.conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (self.run.memory,))
                spaces.create_index(self.conn, self.space)
        took = time.perf_counter() - t
        self.conn.execute("RESET client_min_messages")
        text = "\n".join(self.messages)
        req = re.search(r"with request for (\d+) parallel workers", text)
        used = re.search(r"using (\d+) parallel workers", text)
        workers_s = f"{req.group(1) if req else 0}/{used.group(1) if used else 0}"
        return Build(self.size, took, workers_s, "no longer fits" in text)

    def drop(self) -> float:
        t = time.perf_counter()
        spaces.drop_index(self.conn, self.space)
        return time.perf_counter() - t

    def sample_with_index(self, n: int, sample: int, marks: list[int]) -> None:
        """`sample` rows through the index of n rows; cumulative time at each mark."""
        start_size, elapsed = self.size, 0.0
        for mark in sorted({m for m in marks if m < sample} | {sample}):
            seg_start = self.size
            took = self.insert(start_size + mark)
            elapsed += took
            self.run.idx_segments.append((n, seg_start, self.size - seg_start, took))
            self.run.idx_cumulative[(n, mark)] = elapsed


def measure(conn, space: spaces.Space, run: Run, ns: list[int], bs: list[int], probes: list[int],
            sample: int, compare_at: int, compare_workers: list[int], extra: list[int]) -> None:
    b = Bench(conn, space, run)
    conn.autocommit = True
    # N = 0: the index on the empty table (a concurrent build's fixed cost), then a sample through it.
    t = time.perf_counter()
    spaces.build_index_concurrently(conn, space, run.memory, parallel_workers=run.workers)
    run.empty_build_s = time.perf_counter() - t
    sample0 = min(sample, max(bs))
    b.sample_with_index(0, sample0, probes + bs)
    run.drops.append(b.drop())
    conn.execute(sql.SQL("TRUNCATE {}").format(space.table()))
    b.size = 0
    levels = sorted(n for n in ns if n > 0)
    points = sorted(set(levels) | set(bs) | set(probes) | set(extra))
    for p in points:
        if p < b.size:
            print(f"  (skipped a build at {p:,}: the table already holds {b.size:,})", flush=True)
            continue
        b.grow_plain(p)
        built = b.build(run.workers)
        run.builds[p] = built
        line = (f"  n={p:>7,}: build {built.seconds:7.2f} s ({built.seconds / p * 1000:.3f} ms/row,"
                f" workers {built.workers}{', SPILLED' if built.spilled else ''})")
        if p == compare_at:
            run.compare.append((f"CONCURRENTLY, workers={run.workers}", built))
            run.drops.append(b.drop())
            run.compare.append((f"plain CREATE INDEX, workers={run.workers}", b.build(run.workers, concurrently=False)))
            for w in compare_workers:
                run.drops.append(b.drop())
                run.compare.append((f"CONCURRENTLY, workers={w}", b.build(w)))
            run.drops.append(b.drop())
            again = b.build(run.workers)
            run.compare.append((f"CONCURRENTLY, workers={run.workers}, again", again))
            if again.seconds < built.seconds:     # the machine is shared: the quieter of the two
                run.builds[p] = again
                line += f"; again {again.seconds:.2f} s"
        if p in levels:
            b.sample_with_index(p, sample, probes + bs)
            got = run.idx_cumulative[(p, sample)]
            line += f"; {sample:,} rows through it {got:6.2f} s ({got / sample * 1000:.2f} ms/row)"
        run.drops.append(b.drop())
        print(line, flush=True)


# The cost model ------------------------------------------------------------------------------

def interp(points: list[tuple[float, float]], x: float, extrapolate: bool) -> float:
    pts = sorted(points)
    if len(pts) == 1:
        return pts[0][1]
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) / (x1 - x0) * (x - x1) if extrapolate else y1


class Model:
    def __init__(self, run: Run):
        self.run = run
        # c_idx (ms/row): from the empty index, at the middle of each segment of the sample (the
        # graph grows from nothing); at N > 0, the whole sample's rate (its first rows, slower while
        # the new index's pages come into the cache, included) at N + sample/2.
        self.idx_points = []
        by_level: dict[int, list[tuple[int, int, float]]] = {}
        for level, start, rows, s in run.idx_segments:
            by_level.setdefault(level, []).append((start, rows, s))
        for level, segs in by_level.items():
            if level == 0:
                self.idx_points += [(start + rows / 2, s / rows * 1000) for start, rows, s in segs]
            else:
                rows, s = sum(r for _, r, _ in segs), sum(x for _, _, x in segs)
                self.idx_points.append((level + rows / 2, s / rows * 1000))
        self.c_plain = run.plain_s / max(run.plain_rows, 1) * 1000
        self.drop_ms = sorted(run.drops)[len(run.drops) // 2] * 1000 if run.drops else 0.0
        self.build_points = [(0, run.empty_build_s * 1000)] + [(n, bd.seconds * 1000) for n, bd in run.builds.items()]
        self.max_built = max(run.builds) if run.builds else 0

    def c_idx(self, n: float) -> float:
        return interp(self.idx_points, n, extrapolate=False)

    def build_ms(self, n: float) -> float:
        return interp(self.build_points, n, extrapolate=True)

    def a(self, n: int, b: float) -> float:
        """Each row pays c_idx at the index's size when it goes in (midpoint rule, 64 steps)."""
        step = b / 64
        return sum(self.c_idx(n + (k + 0.5) * step) for k in range(64)) * step

    def b(self, n: int, b: int) -> float:
        return self.drop_ms + b * self.c_plain + self.build_ms(n + b)

    def break_even(self, n: int) -> float | None:
        """The smallest B (log grid, 1 to 20·max(N, 10k)) from which (b) costs no more than (a)."""
        hi = 20 * max(n, 10_000)
        prev = None
        for k in range(0, 801):
            bb = 10 ** (math.log10(hi) * k / 800)
            if self.b(n, bb) <= self.a(n, bb):
                if prev is None:
                    return bb
                lo_, hi_ = prev, bb      # bisect between the last B where (a) won and this one
                for _ in range(40):
                    mid = (lo_ + hi_) / 2
                    lo_, hi_ = (lo_, mid) if self.b(n, mid) <= self.a(n, mid) else (mid, hi_)
                return hi_
            prev = bb
        return None


def round_up_sig(x: float, digits: int = 2) -> int:
    if x <= 0:
        return 0
    scale = 10 ** max(0, int(math.floor(math.log10(x))) - digits + 1)
    return int(math.ceil(x / scale) * scale)


def report(run: Run, ns: list[int], bs: list[int], probes: list[int]) -> tuple[float | None, int | None, Model]:
    m = Model(run)
    d = run.dims
    print(f"\n{d} dims: c_plain {m.c_plain:.3f} ms/row ({run.plain_rows:,} rows); drop index median "
          f"{m.drop_ms:.1f} ms; concurrent build on the empty table {run.empty_build_s * 1000:.0f} ms")
    print("c_idx (ms per row through the index) by index size: from empty, each segment of the sample at its"
          " middle; at N > 0, the sample's rate at N + sample/2:")
    print("  " + ", ".join(f"{int(x):,}: {y:.2f}" for x, y in sorted(m.idx_points)))
    print("build (concurrently, workers requested/launched):")
    for n, bd in sorted(run.builds.items()):
        print(f"  {n:>8,} rows {bd.seconds:8.2f} s  {bd.seconds / n * 1000:6.3f} ms/row  workers {bd.workers}"
              f"{'  SPILLED past maintenance_work_mem' if bd.spilled else ''}")
    if run.compare:
        base = run.builds[run.compare[0][1].rows]
        print(f"at {run.compare[0][1].rows:,} rows, in this order (x: against the quicker of the two "
              f"CONCURRENTLY, workers={run.workers}, {base.seconds:.2f} s, the one the model uses):")
        for label, bd in run.compare:
            print(f"  {label}: {bd.seconds:.2f} s (workers {bd.workers}; {bd.seconds / base.seconds:.2f}x)")
    print(f"\n{'N':>8} {'B':>7} {'B/N':>6} {'(a) insert via index':>22} {'(b) drop+insert+build':>22} "
          f"{'b/a':>6}  cheaper")
    for n in sorted(set(ns)):
        for bb in sorted(set(bs)):
            direct_a = run.idx_cumulative.get((n, bb))
            a_ms = direct_a * 1000 if direct_a is not None else m.a(n, bb)
            built = run.builds.get(n + bb)
            b_ms = m.b(n, bb) if built is None else m.drop_ms + bb * m.c_plain + built.seconds * 1000
            a_tag = "=" if direct_a is not None else "~"
            b_tag = "=" if built is not None else ("~" if n + bb <= m.max_built else ">")
            ratio = f"{bb / n:6.2f}" if n else "   inf"
            print(f"{n:>8,} {bb:>7,} {ratio} {a_tag}{a_ms / 1000:20.2f}s {b_tag}{b_ms / 1000:20.2f}s "
                  f"{b_ms / a_ms:6.2f}  {'(b) rebuild' if b_ms < a_ms else '(a) keep index'}")
    print("  = measured cell   ~ cost model from measured c_idx / c_plain / build(n)   "
          "> build extrapolated past the largest build")
    checks = [(k, v) for k, v in run.idx_cumulative.items() if k[1] >= 300]
    if checks:
        worst = max(abs(m.a(n, bb) / (s * 1000) - 1) for (n, bb), s in checks)
        print(f"model check: (a) model vs the measured cumulative samples, worst {worst * 100:.0f}% off")
    evens = {}
    print("break-even B*(N), (b) cheaper from there on:")
    for n in sorted(set(ns) | {0}):
        be = m.break_even(n)
        evens[n] = be
        print(f"  N={n:>8,}: B* = {'none' if be is None else f'{be:,.0f}'}"
              + (f"  (B*/N = {be / n:.3f})" if be and n else ""))
    big = [n for n in evens if n >= 10_000 and evens[n]] or [n for n in evens if n and evens[n]]   # small runs
    ratio = math.ceil(max(evens[n] / n for n in big) * 20) / 20 if big else None
    floor = round_up_sig(evens[0]) if evens.get(0) else None
    print(f"fitted: defer when B >= max(FLOOR, RATIO x N) with RATIO = {ratio} (largest B*/N over N >= 10,000"
          f" or, without one, N > 0; rounded up to 0.05) and FLOOR = {floor} (B* against an empty index, rounded up)")
    return ratio, floor, m


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--ns", default="0,10000,50000,100000", help="indexed rows N")
    parser.add_argument("--bs", default="1000,5000,20000,50000", help="new rows B")
    parser.add_argument("--probes", default="100,300", help="small B at N=0, for the floor")
    parser.add_argument("--sample", type=int, default=2000, help="rows inserted through the index at each N")
    parser.add_argument("--compare-at", type=int, default=20000,
                        help="rows at which other worker counts and a plain build are compared (0: none)")
    parser.add_argument("--compare-workers", default="0,2")
    parser.add_argument("--workers", type=int, default=1, help="max_parallel_maintenance_workers of the builds")
    parser.add_argument("--memory", default="1GB", help="maintenance_work_mem of the builds")
    parser.add_argument("--extra", default="120000", help="more build sizes past the largest N (the break-even's)")
    parser.add_argument("--wide-dims", type=int, default=1536, help="a second, wider space (0: none)")
    parser.add_argument("--wide-ns", default="0,10000")
    parser.add_argument("--wide-bs", default="1000,5000")
    parser.add_argument("--wide-sample", type=int, default=1000)
    parser.add_argument("--wide-extra", default="")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    configs = [(args.dims, ints(args.ns), ints(args.bs), args.sample, args.compare_at, ints(args.extra))]
    if args.wide_dims:
        configs.append((args.wide_dims, ints(args.wide_ns), ints(args.wide_bs), args.wide_sample, 0,
                        ints(args.wide_extra)))
    probes = ints(args.probes)

    def rows_needed(ns, bs, sample, extra):
        return max(max(ns) + sample, max(bs), max(probes, default=0), max(extra, default=0)) + 1

    total_rows = max(rows_needed(ns, bs, s, x) for _, ns, bs, s, _, x in configs)
    t0 = time.monotonic()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    results = []
    with bench_database("bench_hnsw") as url:
        with db.connection(url) as conn:
            conn.autocommit = True
            print("server: PostgreSQL " + conn.execute("SHOW server_version").fetchone()[0] + ", pgvector "
                  + conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
                  + ", shared_buffers " + conn.execute("SHOW shared_buffers").fetchone()[0], flush=True)
            t = time.monotonic()
            make_chunks(conn, total_rows)
            print(f"{total_rows:,} chunks in {time.monotonic() - t:.1f} s", flush=True)
            for dims, ns, bs, sample, compare_at, extra in configs:
                t = time.monotonic()
                space = make_space(conn, dims, rows_needed(ns, bs, sample, extra), args.seed)
                print(f"\n== {dims} dims: vectors cached in {time.monotonic() - t:.1f} s; N {ns}, B {bs}, "
                      f"sample {sample:,}, maintenance_work_mem {args.memory}, "
                      f"max_parallel_maintenance_workers {args.workers}", flush=True)
                run = Run(dims, args.memory, args.workers)
                t = time.monotonic()
                measure(conn, space, run, ns, bs, probes, sample, compare_at, ints(args.compare_workers), extra)
                print(f"  measured in {time.monotonic() - t:.0f} s", flush=True)
                results.append((run, ns, bs))
    summary = None
    for run, ns, bs in reversed(results):   # the wider space first: the main one's line ends the output
        ratio, floor, m = report(run, ns, bs, probes)
        if run.dims == args.dims:
            idx_at = max(ns)
            summary = (f"HNSW_THRESHOLD dims={run.dims} insert_idx_ms_per_row={m.c_idx(idx_at + args.sample / 2):.2f} "
                       f"insert_plain_ms_per_row={m.c_plain:.3f} "
                       f"build_ms_per_row_at_100k={m.build_ms(100_000) / 100_000:.3f} "
                       f"ratio={ratio} floor={floor}")
    print(f"\nload average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"total {time.monotonic() - t0:.0f} s")
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
