"""What one adaptive-cadence refresh (the `cadence_refresh` run) costs at scale: N pages on the schedule, each
with CADENCE_HISTORY observations, estimated and allocated in one refresh (crawl/adaptive.refresh).

    .venv/bin/python -m bench.cadence_refresh [--pages 100000] [--history 32]

Last line: CADENCE_REFRESH pages=… seconds=… (load …, estimate+allocate …, write …)
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from unittest import mock

import psycopg

from bench.database import bench_database
from rag_pipeline.crawl import adaptive
from rag_pipeline.crawl.cadence_rules import load_rules
from rag_pipeline.crawl.site_cadences import SiteRules
from rag_pipeline.settings import Settings
from rag_pipeline.store import crawl_observations


def fill(url: str, pages: int, history: int) -> None:
    """Pages under the shipped rules' patterns, each with `history` hourly-to-weekly observations."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, recrawl_every, cadence_source, next_crawl_at,"
            " last_crawled_at)"
            " SELECT gen_random_uuid(), u, u, CASE WHEN i %% 100 = 0 THEN interval '1 hour'"
            "   WHEN i %% 5 = 0 THEN interval '1 day' ELSE interval '7 days' END, 'default', now(), now()"
            " FROM (SELECT i, 'https://docs.example.com/' || CASE WHEN i %% 100 = 0 THEN 'pricing/'"
            "   WHEN i %% 5 = 0 THEN 'blog/' ELSE 'docs/' END || i AS u FROM generate_series(1, %s) i) s",
            (pages,))
        conn.execute(
            "INSERT INTO crawl_observations (page_id, crawled_at, interval_s, changed)"
            " SELECT p.page_id, now() - make_interval(hours => k), 3600 * (1 + random() * 167),"
            "        random() < CASE WHEN hashtext(p.url) %% 3 = 0 THEN 0 ELSE 0.4 END"
            " FROM pages p CROSS JOIN generate_series(1, %s) k", (history,))
        conn.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=32)
    args = parser.parse_args()
    settings = Settings(CADENCE_HISTORY=str(args.history), RECRAWL_INTERVAL_S="60")
    rules = SiteRules(load_rules())
    with bench_database("bench_cadence") as url:
        started = time.perf_counter()
        fill(url, args.pages, args.history)
        print(f"{args.pages:,} pages, {args.pages * args.history:,} observations written in "
              f"{time.perf_counter() - started:.1f} s")
        timings: dict[str, float] = {}
        real_load, real_write = crawl_observations.scheduled_pages, crawl_observations.set_cadences

        def timed(name, fn):
            def run(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
            return run

        with psycopg.connect(url, autocommit=True) as conn, \
                mock.patch.object(crawl_observations, "scheduled_pages", timed("load", real_load)), \
                mock.patch.object(crawl_observations, "set_cadences", timed("write", real_write)):
            for label in ("first", "second"):       # the second rewrites only what moved
                timings.clear()
                t = time.perf_counter()
                with conn.transaction():
                    result = adaptive.refresh(conn, rules, settings, timedelta(minutes=10))
                total = time.perf_counter() - t
                compute = total - timings["load"] - timings["write"]
                print(f"{label} refresh: {total:.2f} s (load {timings['load']:.2f}, estimate+allocate "
                      f"{compute:.2f}, write {timings['write']:.2f}); {result.summary()}")
    print(f"CADENCE_REFRESH pages={args.pages} seconds={total:.2f} (load {timings['load']:.2f}, "
          f"estimate+allocate {compute:.2f}, write {timings['write']:.2f})")


if __name__ == "__main__":
    main()
