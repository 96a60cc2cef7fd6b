"""Discovery at scale: a 200,000-URL sitemap index (4 gzip'd files of 50,000) read against 200,000
known pages, with 1% new, 1% gone and 5% lastmod moved: the time, the peak memory and the pushes
it causes (the pages due now afterwards).

A loopback site serves /robots.txt (allow all, a `Sitemap:` line) and /sitemap.xml, an index of
`--files` gzip'd sitemaps generated here from `--seed`. The site is declared as an operator would
(`max_pages` 250,000, so 3 shards) and read with the real `crawl.discovery.read_site`, the network
guard, robots.txt and the shipped cadence rules.

  1. initial reading: the sitemaps list exactly the N known URLs, none of them a page yet (the
     "new site" case: N new pages, all due). They are then marked crawled after their lastmod
     (next crawl in 7 days), so nothing is due, and the table is VACUUM ANALYZEd.
  2. the site changes (1% of the known URLs removed, as many new ones added, 5% of the known get a
     lastmod after their crawl; still `--files` files of ~N/files URLs) and is read again: timed,
     peak RSS (VmHWM reset just before, and the process's ru_maxrss); then the same reading on a
     copy of the database taken before it (CREATE DATABASE … TEMPLATE), under tracemalloc, for the
     Python heap's peak (tracemalloc slows allocation-heavy code, so the timed run goes without it).

Every figure is checked against what was planted (the reading's counts, and the due pages by URL:
new, lastmod moved, gone-to-check); any difference exits 1. The phase split is timed around calls
(project code unchanged): sitemap parsing (SitemapParser.feed/close: gunzip + expat + lastmod),
per-URL checks (_Reader.listed: normalize, scope, robots, page id, shard, cadence), staging COPY
(store.sites.stage), the apply transaction (store.sites.apply_reading, with each statement it
executes), and the rest of the read phase (fetch on loopback, the reader's loop, the staging commit).

Usage: python bench/discovery.py [--urls 200000] [--files 4] [--seed 7]   (DATABASE_URL, or an embedded server)
Last line: DISCOVERY urls=… files=… initial_s=… recrawl_s=… peak_py_mb=… peak_rss_mb=… pushes=… new=… gone=… moved=…
"""

from __future__ import annotations

import argparse
import gzip
import random
import resource
import sys
import time
import tracemalloc
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.database import bench_database  # noqa: E402
from rag_pipeline.core.addresses import parse_networks  # noqa: E402
from rag_pipeline.core.site_spec import SiteSpec  # noqa: E402
from rag_pipeline.crawl import discovery  # noqa: E402
from rag_pipeline.crawl.cadence_rules import load_rules  # noqa: E402
from rag_pipeline.crawl.guarded_http import guarded_client  # noqa: E402
from rag_pipeline.crawl.robots_cache import RobotsCache  # noqa: E402
from rag_pipeline.crawl.loopback_site import LoopbackSite  # noqa: E402
from rag_pipeline.store import db  # noqa: E402
from rag_pipeline.store import sites as store  # noqa: E402

AGENT = "rag-bench/1"
ALLOWED = parse_networks("127.0.0.0/8")
NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
MAX_PAGES = 250_000                     # declared cap: room for the site to grow; 3 shards
CRAWLED_AT = "2026-11-15T00:00:00Z"     # every known page's last crawl, after all its first lastmods
FIRST_LASTMODS = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 10, 31, tzinfo=UTC))
MOVED_LASTMODS = (datetime(2026, 11, 17, tzinfo=UTC), datetime(2026, 11, 28, tzinfo=UTC))


# ---------------------------------------------------------------------------------------------
# The site

def w3c(rng: random.Random, span: tuple[datetime, datetime]) -> str:
    """A W3C datetime in `span`, in the forms sites publish: a date, UTC, or with an offset."""
    at = span[0] + timedelta(seconds=rng.randrange(int((span[1] - span[0]).total_seconds())))
    form = rng.random()
    if form < 0.2:
        return at.strftime("%Y-%m-%d")
    if form < 0.7:
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    # +01:00 shows the same instant an hour later on the clock
    return (at + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S+01:00")


class Plan:
    """The URLs (paths) of both readings, and what the second one must find."""

    def __init__(self, n: int, seed: int):
        rng = random.Random(seed)
        sections = max(1, n // 700)
        n_changed = max(1, n // 100)            # 1% gone, 1% new
        n_moved = max(1, n * 5 // 100)          # 5% lastmod moved
        paths = [f"/docs/section-{rng.randrange(1, sections + 1)}/page-{i}" for i in range(n + n_changed)]
        self.known = paths[:n]
        self.added = set(paths[n:])
        picked = rng.sample(self.known, n_changed + n_moved)
        self.gone = set(picked[:n_changed])
        self.moved = set(picked[n_changed:])
        self.first_lastmod = {p: w3c(rng, FIRST_LASTMODS) for p in paths}
        self.second_lastmod = dict(self.first_lastmod)
        for p in self.moved:
            self.second_lastmod[p] = w3c(rng, MOVED_LASTMODS)

    @staticmethod
    def order(paths) -> list[str]:
        """Sitemap order: by section, then page (new pages land in every file)."""
        def key(p: str):
            _, _, section, page = p.split("/")
            return int(section.split("-")[1]), int(page.split("-")[1])
        return sorted(paths, key=key)

    def first(self) -> list[tuple[str, str]]:
        return [(p, self.first_lastmod[p]) for p in self.order(self.known)]

    def second(self) -> list[tuple[str, str]]:
        listed = [p for p in self.known if p not in self.gone] + list(self.added)
        return [(p, self.second_lastmod[p]) for p in self.order(listed)]


def publish(site: LoopbackSite, entries: list[tuple[str, str]], files: int, version: str) -> tuple[int, int]:
    """`entries` as `files` gzip'd sitemaps behind /sitemap.xml; (uncompressed, gzip'd) bytes."""
    base = site.base_url
    per_file = -(-len(entries) // files)
    names, raw, packed = [], 0, 0
    for k in range(files):
        part = entries[k * per_file:(k + 1) * per_file]
        body = "".join(f"<url><loc>{base}{p}</loc><lastmod>{m}</lastmod><changefreq>weekly</changefreq></url>\n"
                       for p, m in part)
        xml = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}">\n{body}</urlset>\n'.encode()
        data = gzip.compress(xml, compresslevel=6, mtime=0)
        name = f"/sitemaps/docs-{version}-{k + 1}.xml.gz"
        site.set_raw(name, data, content_type="application/gzip")
        names.append(name)
        raw, packed = raw + len(xml), packed + len(data)
    index = "".join(f"<sitemap><loc>{base}{n}</loc><lastmod>2026-11-30</lastmod></sitemap>\n" for n in names)
    site.set_raw("/sitemap.xml", f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{NS}">\n'
                                 f"{index}</sitemapindex>\n".encode())
    return raw, packed


# ---------------------------------------------------------------------------------------------
# Timing around calls

class Phases:
    """Seconds and calls spent in the wrapped functions during one reading."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()
        self.statements: list[tuple[str, float, int]] = []    # during apply_reading: (sql, s, rows)
        self.in_apply = False

    def wrap(self, name, fn):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[name] += time.perf_counter() - t
                self.calls[name] += 1
        return run

    def patches(self) -> ExitStack:
        stack = ExitStack()
        for name in ("begin_reading", "stage", "register_seeds", "finish_reading"):
            stack.enter_context(mock.patch.object(store, name, self.wrap(name, getattr(store, name))))
        real_apply = store.apply_reading

        def apply(*a, **k):
            self.in_apply = True
            try:
                return real_apply(*a, **k)
            finally:
                self.in_apply = False
        stack.enter_context(mock.patch.object(store, "apply_reading", self.wrap("apply_reading", apply)))
        stack.enter_context(mock.patch.object(discovery._Reader, "listed",
                                              self.wrap("listed", discovery._Reader.listed)))
        phases = self

        class TimedParser(discovery.SitemapParser):
            feed = phases.wrap("parse", discovery.SitemapParser.feed)
            close = phases.wrap("parse", discovery.SitemapParser.close)
        stack.enter_context(mock.patch.object(discovery, "SitemapParser", TimedParser))
        return stack


class TimedConnection(psycopg.Connection):
    """Counts every statement the reading executes; times those of the apply transaction."""

    phases: Phases | None = None

    def execute(self, query, params=None, **kw):
        t = time.perf_counter()
        cur = super().execute(query, params, **kw)
        if self.phases is not None:
            self.phases.calls["statements"] += 1
            if self.phases.in_apply:
                text = query if isinstance(query, str) else str(query)
                self.phases.statements.append((" ".join(text.split()), time.perf_counter() - t, cur.rowcount))
        return cur


# ---------------------------------------------------------------------------------------------
# Readings

def spec_for(site: LoopbackSite) -> SiteSpec:
    return SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=True, max_pages=MAX_PAGES,
                    shards=SiteSpec.shards_for(MAX_PAGES))


def read(conn: TimedConnection, site: LoopbackSite, every_for) -> tuple[discovery.ReadingResult, float, Phases]:
    phases = Phases()
    conn.phases = phases
    with guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=60) as client, phases.patches():
        robots = RobotsCache(client, agent=AGENT, ttl_s=60.0, deadline_s=30)
        t = time.perf_counter()
        result = discovery.read_site(conn, client, spec_for(site), robots_for=robots.rules_for, agent=AGENT,
                                     every_for=every_for, allowed=ALLOWED, deadline_s=300)
        elapsed = time.perf_counter() - t
    conn.phases = None
    return result, elapsed, phases


def due_pages(conn) -> dict[str, set[str]]:
    """The pages due now (what recrawl_sensor pushes), by kind, as URL paths."""
    kinds: dict[str, set[str]] = {"new": set(), "moved": set(), "gone": set()}
    for url, crawled, unlisted in conn.execute(
            "SELECT url, last_crawled_at IS NOT NULL, unlisted_at IS NOT NULL FROM pages"
            " WHERE next_crawl_at <= now() AND alias_of IS NULL"):
        kind = "gone" if unlisted else "moved" if crawled else "new"
        kinds[kind].add(urlsplit(url).path)
    return kinds


def check(label: str, got, want, failures: list[str]) -> None:
    if got != want:
        failures.append(f"{label}: got {got}, planted {want}")


def check_second(label: str, result, due: dict[str, set[str]], plan: Plan, n: int, failures: list[str]) -> None:
    c = result.counts
    check(f"{label} complete", (result.complete, result.errors), (True, []), failures)
    for figure, want in (("listed", n), ("in_scope", n), ("new", len(plan.added)), ("gone", len(plan.gone)),
                         ("lastmod_moved", len(plan.moved)), ("over_cap", 0), ("disallowed", 0), ("invalid", 0)):
        check(f"{label} counts[{figure}]", c[figure], want, failures)
    for kind, want in (("new", plan.added), ("gone", plan.gone), ("moved", plan.moved)):
        got = due[kind]
        if got != want:
            failures.append(f"{label} due {kind}: {len(got)} pages, planted {len(want)}; "
                            f"{len(got - want)} unexpected, {len(want - got)} missing")


def vm_hwm_reset() -> bool:
    """Reset this process's peak RSS (VmHWM), Linux 4.0+; False where it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def vm_status(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def conninfo_name(url: str) -> str:
    return conninfo_to_dict(url)["dbname"]


def copy_database(url: str, copy: str) -> str:
    """A copy of `url`'s database (no one may be connected to it meanwhile)."""
    db.close_pools()
    source = conninfo_name(url)
    with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(source)))
    return db.with_database(url, copy)


def drop_database(url: str, name: str) -> None:
    with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def phase_rows(total: float, phases: Phases) -> list[tuple[str, float, str]]:
    s, n = phases.seconds, phases.calls
    read_phase = total - s["begin_reading"] - s["register_seeds"] - s["apply_reading"] - s["finish_reading"]
    rest = read_phase - s["parse"] - s["listed"] - s["stage"]
    return [
        ("read phase (fetch, parse, checks, staging)", read_phase, ""),
        ("  parse: gunzip + expat + lastmod", s["parse"], f"{n['parse']:,} feed/close calls"),
        ("  per-URL checks (_Reader.listed)", s["listed"], f"{n['listed']:,} URLs"),
        ("  staging COPY (store.stage)", s["stage"], f"{n['stage']:,} batches"),
        ("  rest: fetch on loopback, reader loop, commit", rest, ""),
        ("apply transaction (store.apply_reading)", s["apply_reading"], ""),
        ("begin + seeds + finish", s["begin_reading"] + s["register_seeds"] + s["finish_reading"], ""),
    ]


def print_reading(title: str, total: float, result, phases: Phases) -> None:
    print(f"\n{title}: {total:.2f} s, {result.summary}; {phases.calls['statements']} statements by execute,"
          f" {phases.calls['stage']} COPY batches")
    for name, seconds, note in phase_rows(total, phases):
        print(f"  {name:<48} {seconds:8.2f} s  {100 * seconds / total:5.1f}%  {note}")
    if phases.statements:
        print("  apply transaction, statement by statement:")
        for text, seconds, rows in phases.statements:
            print(f"    {seconds:7.3f} s  {rows:>8,} rows  {text[:96]}")
        commit = phases.seconds["apply_reading"] - sum(s for _, s, _ in phases.statements)
        print(f"    {commit:7.3f} s  (commit and the rest of apply_reading)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    n, files = args.urls, args.files
    if n < 100 or files < 1 or -(-n // files) > 50_000:
        parser.error("--urls at least 100, and at most 50,000 per file (the protocol's limit)")
    rss_start = maxrss_mb()
    every_for = load_rules().every_for
    failures: list[str] = []

    t = time.perf_counter()
    plan = Plan(n, args.seed)
    print(f"plan: {n:,} known URLs; second reading: {len(plan.gone):,} gone, {len(plan.added):,} new, "
          f"{len(plan.moved):,} lastmod moved ({time.perf_counter() - t:.1f} s)")

    with bench_database("bench_discovery") as url, LoopbackSite() as site:
        site.set_raw("/robots.txt", f"User-agent: *\nDisallow:\n\nSitemap: {site.url('/sitemap.xml')}\n".encode(),
                     content_type="text/plain")
        t = time.perf_counter()
        raw, packed = publish(site, plan.first(), files, "a")
        print(f"initial sitemaps: {files} files, {raw / 1e6:.1f} MB XML, {packed / 1e6:.1f} MB gzip'd "
              f"({time.perf_counter() - t:.1f} s to generate)")

        with TimedConnection.connect(url, autocommit=True) as conn:
            # 1. The initial reading: a new site, every URL new.
            first, initial_s, first_phases = read(conn, site, every_for)
            print_reading("initial reading (new site)", initial_s, first, first_phases)
            due = due_pages(conn)
            check("initial complete", (first.complete, first.errors), (True, []), failures)
            for figure, want in (("listed", n), ("in_scope", n), ("new", n), ("gone", 0), ("lastmod_moved", 0)):
                check(f"initial counts[{figure}]", first.counts[figure], want, failures)
            check("initial due new", len(due["new"]), n, failures)
            initial_pushes = sum(len(v) for v in due.values())
            shards = dict(conn.execute("SELECT shard, count(*) FROM pages GROUP BY shard ORDER BY shard").fetchall())
            print(f"  pages due after it: {initial_pushes:,}; by shard {shards}")

            # Crawled since, after every lastmod: nothing is due.
            conn.execute("UPDATE pages SET last_crawled_at = %s, next_crawl_at = now() + interval '7 days'",
                         (CRAWLED_AT,))
            conn.execute("VACUUM ANALYZE pages")
            check("due after marking crawled", sum(len(v) for v in due_pages(conn).values()), 0, failures)

        # 2. The site changes; a copy of the database keeps the state before the second reading.
        t = time.perf_counter()
        raw, packed = publish(site, plan.second(), files, "b")
        print(f"\nchanged sitemaps: {files} files, {raw / 1e6:.1f} MB XML, {packed / 1e6:.1f} MB gzip'd "
              f"({time.perf_counter() - t:.1f} s)")
        copy_name = conninfo_name(url) + "_mem"
        t = time.perf_counter()
        copy_url = copy_database(url, copy_name)
        print(f"database copied for the tracemalloc run ({time.perf_counter() - t:.1f} s)")
        try:
            rss_before = vm_status("VmRSS")
            maxrss_before = maxrss_mb()
            hwm_reset = vm_hwm_reset()
            with TimedConnection.connect(url, autocommit=True) as conn:
                second, recrawl_s, second_phases = read(conn, site, every_for)
                hwm = vm_status("VmHWM") if hwm_reset else None
                # The reset lowers ru_maxrss too: the whole process's peak is the larger of the two.
                peak_rss = max(maxrss_before, maxrss_mb())
                due = due_pages(conn)
            print_reading("second reading (1% new, 1% gone, 5% lastmod moved)", recrawl_s, second, second_phases)
            check_second("second", second, due, plan, n, failures)
            pushes = sum(len(v) for v in due.values())

            # The same reading again, on the copy, under tracemalloc.
            with TimedConnection.connect(copy_url, autocommit=True) as conn:
                tracemalloc.start()
                again, traced_s, _ = read(conn, site, every_for)
                _, peak_py = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                check_second("traced copy", again, due_pages(conn), plan, n, failures)
        finally:
            drop_database(url, copy_name)

    peak_py_mb = peak_py / 2**20
    print("\n| figure | value |\n| --- | --- |")
    rows = [
        ("URLs listed (files)", f"{n:,} ({files} gzip'd sitemaps + index)"),
        ("initial reading (all new)", f"{initial_s:.2f} s, {initial_pushes:,} pages due"),
        ("second reading", f"{recrawl_s:.2f} s ({n / recrawl_s:,.0f} URLs/s; per-URL checks "
                           f"{1e6 * second_phases.seconds['listed'] / max(1, second_phases.calls['listed']):.0f} µs a URL)"),
        ("  of which parse / checks / COPY / rest of read / apply",
         " / ".join(f"{s:.2f}" for _, s, _ in (phase_rows(recrawl_s, second_phases)[i] for i in (1, 2, 3, 4, 5)))
         + " s"),
        ("second reading under tracemalloc (copy)", f"{traced_s:.2f} s"),
        ("Python heap peak (tracemalloc, during the reading)", f"{peak_py_mb:.1f} MB"),
        ("process RSS peak during the second reading (VmHWM reset before)",
         f"{hwm:.1f} MB" if hwm is not None else "n/a"),
        ("RSS just before it", f"{rss_before or 0:.1f} MB"),
        ("process peak RSS, ru_maxrss (whole run so far: interpreter + imports were "
         f"{rss_start:.0f} MB, then the plan, the initial reading)", f"{peak_rss:.1f} MB"),
        ("pushes caused (pages due now)", f"{pushes:,}"),
        ("  new / lastmod moved / gone-to-check", f"{len(due['new']):,} / {len(due['moved']):,} / {len(due['gone']):,}"),
        ("  planted", f"{len(plan.added):,} / {len(plan.moved):,} / {len(plan.gone):,}"),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    if failures:
        print("\nFAILED: the reading's figures differ from what was planted:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print(f"DISCOVERY urls={n} files={files} initial_s={initial_s:.2f} recrawl_s={recrawl_s:.2f} "
          f"peak_py_mb={peak_py_mb:.1f} peak_rss_mb={peak_rss:.1f} pushes={pushes} new={len(due['new'])} "
          f"gone={len(due['gone'])} moved={len(due['moved'])}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
