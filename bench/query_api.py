"""The query API under load (issue 12, point 6): `rag-pipeline serve` answering POST /search and
POST /ask over loopback HTTP, against the same questions searched in-process without HTTP.

A fresh database gets `--pages` pages of `--chunks-per-page` chunks written through the project's
own path (`apply_batch`, as bench/search_quality.py writes them), embedded by the deterministic
hash embedder (384 dims), whose space `serve` embeds questions with as it would any other model's.
`serve` runs as its own processes (`--workers`); the chat model of /ask is the loopback fake
OpenAI, answering at once, so /ask's figures are the API's and retrieval's own cost. Closed-loop
clients (`--clients`, one thread and one HTTP connection each) send `--requests` requests per level.
Any answer but 200 is counted and fails the run. Last line:
`QUERY_API search p95=…ms ask p95=…ms at N chunks, C clients`.

`--hostile` (issue 28, point 4) measures instead what one costly question costs and whether it
shuts others out. The pages' paragraphs are words of a vocabulary of 20,000 made-up words drawn by
Zipf's law (as words of prose are), so most words are rare; `--pages 2500` makes 50,000 chunks.
The hostile question is 280 distinct words (1,960 characters: the API takes 2,000 at most) that
PostgreSQL's statistics do not list as common, the ones that match the most passages among those:
the worst a client can send when rare words count most. Sent one at a time (`lexical`, `hybrid`)
against a normal question; then 4 at once (the query API's pool: QUERY_API_POOL_SIZE=4, one
`serve` process) with a normal question sent meanwhile. Last line:
`HOSTILE_QUERY p50_ms=… max_ms=… normal_during_ms=… status_codes=…` (hostile requests one at a
time, both modes; the normal request's time and every status of the concurrent round).

    .venv/bin/python bench/query_api.py [--pages 1000] [--chunks-per-page 20] [--clients 1,4,16]
        [--requests 1000] [--workers 2] [--mode vector|lexical|hybrid]
    .venv/bin/python bench/query_api.py --hostile --pages 2500 --workers 1
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psycopg  # noqa: E402

from bench.database import bench_database  # noqa: E402
from bench.loading import apply_pages  # noqa: E402
from bench.search_quality import PAGES_PER_BATCH, load, pct  # noqa: E402
from rag_pipeline.embedders.hash_embedder import HashEmbedder  # noqa: E402
from rag_pipeline.query.retrieval import retrieve  # noqa: E402
from rag_pipeline.settings import Settings  # noqa: E402
from rag_pipeline.store import db  # noqa: E402
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI  # noqa: E402

DIMENSIONS = 384
TOKEN = "bench-query-api"


def questions(pages: int, per_page: int, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"What does paragraph {rng.randrange(per_page)} of page {rng.randrange(pages)} say?" for _ in range(n)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_serve(url: str, fake_url: str, workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUERY_API_", "ANSWER_", "OPENAI_"))}
    env.update(DATABASE_URL=url, QUERY_API_TOKEN=TOKEN, ANSWER_API_KEY="sk-bench", ANSWER_BASE_URL=fake_url,
               EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=str(DIMENSIONS), QUERY_API_MAX_INFLIGHT="64",
               # One token for every simulated client: its per-token rate would measure the limit.
               QUERY_API_RATE="100000", QUERY_API_BURST="100000")
    proc = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "serve", "--port", str(port),
                             "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"`rag-pipeline serve` did not start:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.2)


def wait_active(url: str, n: int, finished, timeout_s: float = 10.0) -> int:
    """Until `n` statements of other sessions are active on the bench database, or `finished()`
    (the requests ended first), or the deadline; returns the most seen active at once."""
    deadline, most = time.monotonic() + timeout_s, 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline and most < n and not finished():
            most = max(most, conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'active' AND pid <> pg_backend_pid()").fetchone()[0])
            conn.execute("SELECT pg_sleep(0.01)")
    return most


def hammer(base: str, path: str, bodies: list[dict], clients: int, total: int) -> tuple[list[float], Counter, float]:
    """`total` requests from `clients` closed-loop clients: (latencies ms, statuses, seconds)."""
    latencies: list[float] = []
    statuses: Counter = Counter()
    lock = threading.Lock()
    counter = iter(range(total))

    def client() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                t0 = time.perf_counter()
                try:
                    status = http.post(path, json=bodies[n % len(bodies)]).status_code
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                elapsed = (time.perf_counter() - t0) * 1000
                with lock:
                    latencies.append(elapsed)
                    statuses[status] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, statuses, time.perf_counter() - started


# --hostile: a vocabulary of made-up words, drawn by Zipf's law.
VOCABULARY = 20_000
WORDS_PER_PARAGRAPH = 12
HOSTILE_WORDS = 280


def vocabulary(seed: int) -> list[str]:
    """Distinct words of three consonant-vowel syllables (`kotamu`): each its own lexeme, mostly."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aiou"]
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables) for _ in range(3)))
    return sorted(words)


def prose_pages(pages: int, per_page: int, words: list[str], seed: int):
    """Pages of paragraphs `Paragraph i of page n: w1 … w12.`, words drawn by Zipf's law (the r-th
    most frequent 1/r as often as the first), so normal questions find their paragraph as before."""
    rng = random.Random(seed)
    ranked = words[:]
    rng.shuffle(ranked)
    weights = [1.0 / r for r in range(1, len(ranked) + 1)]
    drawn = iter(rng.choices(ranked, weights, k=pages * per_page * WORDS_PER_PARAGRAPH))
    for n in range(pages):
        paragraphs = [f"Paragraph {i} of page {n}: " + " ".join(next(drawn) for _ in range(WORDS_PER_PARAGRAPH)) + "."
                      for i in range(per_page)]
        yield f"https://docs.example.com/q/{n}", f"# Page {n}\n\n" + "\n\n".join(paragraphs)


def hostile_question(url: str, words: list[str]) -> tuple[str, int, int]:
    """280 distinct words the statistics do not list as common, those matching the most passages;
    (the question, the fewest and the most passages one of its words is in)."""
    with db.connection(url) as conn:
        config = conn.execute("SELECT config::text FROM text_search_config").fetchone()[0]
        common = set(conn.execute(
            "SELECT coalesce(most_common_elems::text::text[], '{}') FROM pg_stats"
            " WHERE tablename = 'chunks' AND attname = 'text_search'").fetchone()[0])
        counts = dict(conn.execute("SELECT word, ndoc FROM ts_stat('SELECT text_search FROM chunks')").fetchall())
        lexemes = conn.execute(
            "SELECT w, tsvector_to_array(to_tsvector(%s::regconfig, w)) FROM unnest(%s::text[]) w",
            (config, words)).fetchall()
    seen: set[str] = set()
    chosen: list[tuple[int, str]] = []
    for word, lexeme in sorted(((w, ls[0]) for w, ls in lexemes if len(ls) == 1),
                               key=lambda wl: -counts.get(wl[1], 0)):
        if lexeme in common or lexeme in seen or lexeme not in counts:
            continue
        seen.add(lexeme)
        chosen.append((counts[lexeme], word))
        if len(chosen) == HOSTILE_WORDS:
            break
    question = " ".join(word for _, word in chosen)
    return question, min(n for n, _ in chosen), max(n for n, _ in chosen)


def timed_post(base: str, body: dict, timeout: float = 120) -> tuple[float, int | str]:
    t0 = time.perf_counter()
    try:
        status: int | str = httpx.post(f"{base}/search", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                                       timeout=timeout).status_code
    except httpx.TransportError as exc:
        status = type(exc).__name__
    return (time.perf_counter() - t0) * 1000, status


def hostile(args) -> int:
    """The --hostile run: what a 280-word question costs, alone and four at once."""
    words = vocabulary(args.seed)
    normal = questions(args.pages, args.chunks_per_page, 20, args.seed)
    print(f"query API, hostile question: {args.pages:,} pages × {args.chunks_per_page} paragraphs of "
          f"{WORDS_PER_PARAGRAPH} words (Zipf over {VOCABULARY:,}), hash embedder {DIMENSIONS} dims; serve --workers "
          f"{args.workers}; {os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    failures = 0
    with bench_database("bench_query_hostile") as url, FakeOpenAI(dimensions=16) as fake:
        chunks = apply_pages(url, prose_pages(args.pages, args.chunks_per_page, words, args.seed),
                             HashEmbedder(DIMENSIONS), (120, 0), per_batch=PAGES_PER_BATCH, report_every=500)
        question, fewest, most = hostile_question(url, words)
        print(f"loaded {chunks:,} chunks; the hostile question: {len(question):,} characters, "
              f"{len(question.split())} distinct words, each in {fewest}–{most} passages", flush=True)
        proc, base = start_serve(url, fake.base_url, args.workers)
        try:
            for q in normal[:5]:                                    # warm the worker
                timed_post(base, {"question": q})
            print(f"  {'question':<8} {'mode':<8} {'p50 ms':>8} {'max ms':>8}  answers")
            alone: list[float] = []
            for mode in ("lexical", "hybrid"):
                for name, bodies in (("normal", [{"question": q, "mode": mode} for q in normal]),
                                     ("hostile", [{"question": question, "mode": mode}] * 5)):
                    runs = [timed_post(base, body) for body in bodies]
                    times = [t for t, _ in runs]
                    statuses = Counter(s for _, s in runs)
                    failures += sum(n for s, n in statuses.items() if s != 200)
                    if name == "hostile":
                        alone += times
                    shown = ", ".join(f"{n} × {s}" for s, n in sorted(statuses.items(), key=str))
                    print(f"  {name:<8} {mode:<8} {pct(times, 50):>8.1f} {max(times):>8.1f}  {shown}", flush=True)

            # Four hostile questions at once (the pool's four connections), a normal one meanwhile.
            concurrent: list[tuple[float, int | str]] = []
            lock = threading.Lock()

            def send(body: dict) -> None:
                result = timed_post(base, body)
                with lock:
                    concurrent.append(result)

            threads = [threading.Thread(target=send, args=({"question": question, "mode": "hybrid"},))
                       for _ in range(4)]
            for t in threads:
                t.start()
            # The four are running in PostgreSQL before the normal one is sent (unless done already).
            active = wait_active(url, 4, lambda: not any(t.is_alive() for t in threads))
            during_ms, during_status = timed_post(base, {"question": normal[0], "mode": "hybrid"})
            for t in threads:
                t.join()
            statuses = [s for _, s in concurrent] + [during_status]
            failures += sum(s != 200 for s in statuses)
            print(f"  4 hostile at once (hybrid): {', '.join(f'{t:.0f} ms' for t, _ in concurrent)}; a normal "
                  f"question meanwhile ({active} of them active in PostgreSQL when it was sent): "
                  f"{during_ms:.1f} ms, {during_status}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    codes = ",".join(str(s) for s in statuses)
    print(f"HOSTILE_QUERY p50_ms={pct(alone, 50):.1f} max_ms={max(alone):.1f} normal_during_ms={during_ms:.1f} "
          f"status_codes={codes}")
    if failures:
        print(f"FAILED: {failures} answers were not 200")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--chunks-per-page", type=int, default=20)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=1000, help="per endpoint and client level")
    parser.add_argument("--workers", type=int, default=2, help="`serve` processes")
    parser.add_argument("--mode", choices=["vector", "lexical", "hybrid"], default=None,
                        help="sent with every request [default: none, the server's SEARCH_MODE, hybrid]")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--hostile", action="store_true",
                        help="instead: the cost of a 280-word question, alone and four at once (see above)")
    args = parser.parse_args()
    if args.hostile:
        return hostile(args)
    levels = [int(c) for c in args.clients.split(",")]
    asked = questions(args.pages, args.chunks_per_page, 500, args.seed)
    print(f"query API: {args.pages:,} pages × {args.chunks_per_page} chunks, hash embedder {DIMENSIONS} dims; "
          f"serve --workers {args.workers}; mode {args.mode or 'the default'}; clients {levels}; "
          f"{args.requests} requests a level and endpoint; "
          f"{os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    failures = 0
    with bench_database("bench_query_api") as url, FakeOpenAI(dimensions=16) as fake:
        fake.script_chat(lambda messages: "The paragraph says what it says [1].")
        chunks = load(url, args.pages, args.chunks_per_page, HashEmbedder(DIMENSIONS))
        print(f"loaded {chunks:,} chunks", flush=True)

        settings = Settings(DATABASE_URL=url, EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=DIMENSIONS)
        direct = []
        with db.connection(url) as conn:
            for q in asked[:200] + asked[:300]:   # the first 200 warm the cache and the plan
                t0 = time.perf_counter()
                retrieve(conn, settings, q, 5, mode=args.mode)
                direct.append((time.perf_counter() - t0) * 1000)
        direct = direct[200:]
        print(f"in-process retrieve (no HTTP), 1 caller: p50 {pct(direct, 50):.1f} ms, p95 {pct(direct, 95):.1f} ms, "
              f"p99 {pct(direct, 99):.1f} ms", flush=True)

        proc, base = start_serve(url, fake.base_url, args.workers)
        summary: dict[tuple[str, int], float] = {}
        try:
            hammer(base, "/search", [{"question": q} for q in asked], 4, 200)   # warm every worker
            print(f"  {'endpoint':<8} {'clients':>7} {'req/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}  answers")
            extra = {"mode": args.mode} if args.mode else {}
            for path, body in (("/search", lambda q: {"question": q, "k": 5, **extra}),
                               ("/ask", lambda q: {"question": q, "k": 5, **extra})):
                for clients in levels:
                    lat, statuses, seconds = hammer(base, path, [body(q) for q in asked], clients, args.requests)
                    bad = sum(n for s, n in statuses.items() if s != 200)
                    failures += bad
                    summary[(path, clients)] = pct(lat, 95)
                    shown = ", ".join(f"{n} × {s}" for s, n in sorted(statuses.items(), key=str))
                    print(f"  {path:<8} {clients:>7} {len(lat) / seconds:>7.0f} {pct(lat, 50):>7.1f} "
                          f"{pct(lat, 95):>7.1f} {pct(lat, 99):>7.1f}  {shown}", flush=True)
            refused = httpx.post(f"{base}/search", json={"question": "x"}, timeout=10)
            if refused.status_code != 401:
                print(f"FAILED: a request without the token got {refused.status_code}, not 401")
                failures += 1
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if failures:
        print(f"FAILED: {failures} answers were not 200")
        return 1
    top = max(levels)
    print(f"QUERY_API search p95={summary[('/search', top)]:.1f}ms ask p95={summary[('/ask', top)]:.1f}ms "
          f"at {chunks} chunks, {top} clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
