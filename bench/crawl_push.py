"""Crawling benchmarks: pushes per second against the Crawlbase simulator, and the recrawl
sensor's tick cost with 100,000 pages registered.

1. Push path: the real `push_targets` (pushes rows written before and finished after, next crawl
   moved) through the Crawlbase client (httpx) to the simulator on loopback, unthrottled and at the default
   20/s limit. The simulator runs in its own process, paused, so that only the push path is measured.
2. recrawl_sensor: the real sensor evaluated in a Dagster test instance against 100,000 pages:
   a tick with nothing due, ticks claiming a full batch (500) of due pages, and a tick giving
   500 pages first seen through deliveries their pattern cadence; and the health checks' queries.

Usage: python bench/crawl_push.py [--pages 100000] [--pushes 2000]   (DATABASE_URL, or an embedded server)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.database import bench_database  # noqa: E402
from rag_pipeline.crawl.crawlbase import CrawlbaseCrawler
from rag_pipeline.crawl.pushing import push_targets
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, schedule


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_pushes(url: str, n: int) -> None:
    # The simulator runs in its own process, as Crawlbase would: it must not share our GIL.
    port = free_port()
    sim = subprocess.Popen([sys.executable, "-m", "rag_pipeline.crawl.simulator", "--port", str(port),
                            "--token", "bench", "--crawler", "bench", "--callback", "http://127.0.0.1:9/none",
                            "--probe-interval", "3600"], stdout=subprocess.PIPE, text=True)
    api_url = f"http://127.0.0.1:{port}/"
    sim.stdout.readline()  # "Crawlbase simulator at …": it listens
    # Paused: pushes are accepted and queued but not crawled, so only the push path is measured.
    httpx.post(f"{api_url}crawler/bench/bench/pause").raise_for_status()
    try:
        with db.connection(url) as conn:
            conn.autocommit = True
            targets = []
            with conn.transaction():
                for i in range(n):
                    page = f"https://bench.example.com/p/{i}"
                    schedule.register(conn, page, page, timedelta(hours=1), explicit=True)
                    targets.append(schedule.Target(page, page))
            for label, rate, concurrency, count in (
                ("unthrottled, 1 thread ", 1e9, 1, n // 4),
                ("unthrottled, 8 threads", 1e9, 8, n),
                ("default limit 20/s, 8 threads", 20.0, 8, 100),
            ):
                crawler = CrawlbaseCrawler(token="bench", crawler_name="bench", api_url=api_url, rate=rate)
                # Start with an empty bucket so the limit shows from the first push.
                crawler.limiter._tokens = 0.0
                started = time.perf_counter()
                report = push_targets(conn, crawler, targets[:count], reason="manual", concurrency=concurrency)
                elapsed = time.perf_counter() - started
                assert report.pushed == count, report.errors[:3]
                print(f"  {label:32s} {count:6d} pushes in {elapsed:6.2f} s = {count / elapsed:7.1f} pushes/s")
            stats = httpx.get(f"{api_url}crawler/bench/stats").json()["crawlers"][0]
            print(f"  simulator: {stats['history']['pushed']} pushes accepted, {stats['waiting']} waiting, {stats['status']}")
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def bench_sensor(url: str, pages: int) -> None:
    from rag_pipeline.definitions import defs as build

    with db.connection(url) as conn:
        conn.autocommit = True
        conn.execute("DELETE FROM pushes")
        conn.execute("DELETE FROM pages")
        started = time.perf_counter()
        conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, recrawl_every, cadence_source, next_crawl_at)"
            " SELECT md5('p' || i)::uuid, 'https://site' || (i %% 50) || '.example.com/page/' || i,"
            "        NULL, interval '1 day', 'seed', now() + (i %% 1440) * interval '1 minute' + interval '1 minute'"
            " FROM generate_series(1, %s) AS i", (pages,),
        )
        conn.execute("ANALYZE pages")
        print(f"  {pages} pages registered in {time.perf_counter() - started:.1f} s")

    defs = build()
    sensor = defs.resolve_sensor_def("recrawl_sensor")

    def tick(instance) -> tuple[float, int]:
        started = time.perf_counter()
        with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
            result = sensor(context)
        elapsed = time.perf_counter() - started
        urls = sum(len(r.run_config["ops"]["push_pages"]["config"]["urls"]) for r in result.run_requests or [])
        return elapsed, urls

    with dg.instance_for_test() as instance:
        tick(instance)  # warm: pools, definitions
        idle = [tick(instance) for _ in range(10)]
        assert all(n == 0 for _, n in idle)
        print(f"  tick, nothing due:           median {statistics.median(t for t, _ in idle) * 1000:7.1f} ms")
        with db.connection(url) as conn:
            conn.execute("UPDATE pages SET next_crawl_at = now() - interval '1 s'"
                         " WHERE page_id IN (SELECT page_id FROM pages ORDER BY page_id LIMIT 2500)")
        busy = [tick(instance) for _ in range(5)]
        assert all(n == get_settings().recrawl_batch_size for _, n in busy), busy
        print(f"  tick, {busy[0][1]} due of {pages}:      median {statistics.median(t for t, _ in busy) * 1000:7.1f} ms"
              f"  ({busy[0][1] / statistics.median(t for t, _ in busy):.0f} pages claimed/s)")
        with db.connection(url) as conn:
            conn.execute("UPDATE pages SET cadence_source = NULL"
                         " WHERE page_id IN (SELECT page_id FROM pages ORDER BY page_id DESC LIMIT 500)")
        t, _ = tick(instance)
        print(f"  tick, 500 new pages given a cadence + claim: {t * 1000:7.1f} ms")

    # crawler_health_sensor's database side (every minute): overdue pages and undelivered pushes.
    from rag_pipeline.store import pushes

    with db.connection(url) as conn:
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            count, _ = schedule.overdue(conn)
            pushes.undelivered(conn, 3600)
            timings.append(time.perf_counter() - started)
        print(f"  health queries (overdue: {count} of {pages} pages): median {statistics.median(timings) * 1000:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--pushes", type=int, default=2000)
    args = parser.parse_args()

    with bench_database("bench_crawl") as url:
        os.environ["DATABASE_URL"] = url
        os.environ.setdefault("CRAWLER", "local")
        # Its site is on loopback: the network guard lets that one network through, as make run does.
        os.environ.setdefault("CRAWLER_ALLOW_NETWORKS", "127.0.0.0/8")
        get_settings.cache_clear()
        print(f"== push path against the Crawlbase simulator ({os.cpu_count()} cores)")
        bench_pushes(url, args.pushes)
        print(f"== recrawl_sensor with {args.pages} pages registered (batch {get_settings().recrawl_batch_size})")
        bench_sensor(url, args.pages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
