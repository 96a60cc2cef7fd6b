"""What a recrawl costs in embedding tokens: full reindex vs a page-level hash gate vs this project.

A corpus of realistic markdown pages (500 to 20,000 tokens) is indexed once through the real
pipeline (deliveries → routing → pages/chunks/embeddings steps on PostgreSQL + pgvector). Then a
recrawl arrives in which about 5% of pages changed (one-word edits, inserted and deleted
paragraphs, moved sections, rewritten pages, added and removed pages) and every page's footer
date moved (noise). Printed side by side, all from this one run:

  full reindex        every page re-embedded with a plain 512/64 token window
  page-level gate     the seeds' reference: pages whose normalized hash changed, re-embedded whole
                      with a plain 512/64 token window
  this project        tokens the embedder really received (from the ledger), vectors reused by text hash
  changed-text floor  tokens of the paragraphs that are new in the recrawl

Usage: python bench/recrawl_cost.py [--pages 400] [--seed 7]   (DATABASE_URL, or an embedded server)
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.corpus import PageGenerator, render  # noqa: E402
from bench.database import bench_database  # noqa: E402
from rag_pipeline.core.text import content_hash, normalize_markdown  # noqa: E402
from rag_pipeline.core.tokens import count_tokens, encoding  # noqa: E402
from rag_pipeline.embedders.hash_embedder import HashEmbedder  # noqa: E402
from rag_pipeline.ingest import indexing  # noqa: E402
from rag_pipeline.ingest.routing import route_batch  # noqa: E402
from rag_pipeline.ingest.rules import configured_boilerplate_rules  # noqa: E402
from rag_pipeline.store import db, deliveries  # noqa: E402
import os

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

WINDOW, OVERLAP = 512, 64
MAX_PAGE_BYTES = 50_000_000
# Share of each kind among the changed pages: documentation mostly changes by small edits.
EDIT_MIX = {
    "one-word edit": 0.35,
    "inserted paragraph": 0.25,
    "deleted paragraph": 0.15,
    "moved section": 0.15,
    "rewritten page": 0.10,
}


def window_tokens(text: str) -> int:
    """Tokens a plain sliding window (512, overlap 64) sends to the embedder for `text`."""
    n = len(encoding().encode(text, disallowed_special=()))
    if n <= WINDOW:
        return n
    step = WINDOW - OVERLAP
    windows = math.ceil((n - WINDOW) / step) + 1
    return n + (windows - 1) * OVERLAP


def is_paragraph(block: str) -> bool:
    return block[:1].isalpha() and not block.startswith(("#", "```", "|", "-"))


@dataclass
class Page:
    url: str
    blocks: list[str]


@dataclass
class Recrawl:
    pages: dict[str, list[str]]                 # url -> blocks (removed pages absent)
    removed: list[str]
    kinds: Counter = field(default_factory=Counter)
    kind_of: dict[str, str] = field(default_factory=dict)   # url -> kind of change
    floor_by_kind: Counter = field(default_factory=Counter)

    @property
    def floor_tokens(self) -> int:
        return sum(self.floor_by_kind.values())


def footer(day: int) -> str:
    return f"Last updated: 2026-11-{day:02d} 0{day % 10}:15 UTC"


def make_corpus(n: int, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    corpus = {}
    for i in range(n):
        size = int(math.exp(rng.uniform(math.log(500), math.log(20_000))))
        corpus[f"https://docs.example.com/page/{i}"] = PageGenerator(seed * 100_003 + i).page(size)
    return corpus


def mutate(corpus: dict[str, list[str]], seed: int, changed_share: float = 0.05,
           added_share: float = 0.005) -> Recrawl:
    rng = random.Random(seed + 1)
    gen = PageGenerator(seed + 2)
    urls = sorted(corpus)
    n_changed = max(len(EDIT_MIX), round(len(urls) * changed_share))
    plan = [kind for kind, share in EDIT_MIX.items() for _ in range(max(1, round(n_changed * share)))]
    n_changed = len(plan)
    n_added = n_removed = max(1, round(len(urls) * added_share))
    picked = rng.sample(urls, n_changed + n_removed)
    changed, removed = picked[:n_changed], picked[n_changed:]
    pages = {u: list(b) for u, b in corpus.items() if u not in removed}
    result = Recrawl(pages=pages, removed=removed)
    for i, url in enumerate(changed):
        blocks = pages[url]
        kind = plan[i]
        result.kind_of[url] = kind
        paragraphs = [j for j, b in enumerate(blocks) if is_paragraph(b) and " " in b]
        if kind == "one-word edit" and paragraphs:
            j = rng.choice(paragraphs)
            words = blocks[j].split(" ")
            k = rng.randrange(1, len(words))
            words[k] = "zygote" if words[k] != "zygote" else "quorum"
            blocks[j] = " ".join(words)
            result.floor_by_kind[kind] += count_tokens(blocks[j])
        elif kind == "inserted paragraph":
            j = rng.randrange(1, len(blocks) + 1)
            new = gen.paragraph(2, 6)
            blocks.insert(j, new)
            result.floor_by_kind[kind] += count_tokens(new)
        elif kind == "deleted paragraph" and paragraphs:
            del blocks[rng.choice(paragraphs)]
        elif kind == "moved section":
            heads = [j for j, b in enumerate(blocks) if b.startswith("## ")]
            if len(heads) >= 3:
                a = rng.randrange(len(heads) - 1)
                start, end = heads[a], heads[a + 1]
                section = blocks[start:end]
                rest = blocks[:start] + blocks[end:]
                targets = [j for j, b in enumerate(rest) if b.startswith("## ")] + [len(rest)]
                to = rng.choice([t for t in targets if t != start] or [len(rest)])
                blocks[:] = rest[:to] + section + rest[to:]
        elif kind == "rewritten page":
            size = count_tokens(render(blocks))
            blocks[:] = gen.page(size)
            result.floor_by_kind[kind] += count_tokens(render(blocks))
        result.kinds[kind] += 1
    for i in range(n_added):
        size = int(math.exp(rng.uniform(math.log(500), math.log(20_000))))
        url = f"https://docs.example.com/new/{i}"
        pages[url] = gen.page(size)
        result.kind_of[url] = "added page"
        result.floor_by_kind["added page"] += count_tokens(render(pages[url]))
        result.kinds["added page"] += 1
    result.kinds["removed page"] = len(removed)
    return result


def deliver_all(conn, pages: dict[str, list[str]], day: int, removed: list[str] = ()) -> None:
    for url, blocks in pages.items():
        body = render(blocks + [footer(day)])
        deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                          original_status=200, content_type="text/markdown",
                          body=gzip.compress(body.encode()), body_encoding="gzip")
    for url in removed:
        deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                          original_status=404, content_type="text/markdown",
                          body=gzip.compress(b"Not found"), body_encoding="gzip")


def run_pipeline(conn, embedder, run_id: str) -> tuple[int, int]:
    """Route everything, then run the three steps for each queued page; (runs, routed)."""
    runs = routed = 0
    while True:
        batch = route_batch(conn, 500, MAX_PAGE_BYTES)
        if not batch.routed:
            return runs, routed
        routed += batch.routed
        for item in {q.page_url: q for q in batch.queued}.values():
            indexing.take_newest_delivery(conn, item.page_url, MAX_PAGE_BYTES)
            indexing.stage_chunks(conn, item.page_url, WINDOW, OVERLAP)
            indexing.embed_and_switch(conn, item.page_url, embedder, run_id=run_id)
            runs += 1


def ledger_tokens(conn) -> tuple[int, int, int]:
    return tuple(int(v) for v in conn.execute(
        "SELECT coalesce(sum(tokens_embedded),0), coalesce(sum(tokens_reused),0), coalesce(sum(chunks_embedded),0)"
        " FROM embedding_ledger").fetchone())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    with bench_database("bench_recrawl") as url:
        return run(url, args.pages, args.seed)


def run(url: str, n_pages: int, seed: int) -> int:
    t0 = time.perf_counter()
    corpus = make_corpus(n_pages, seed)
    recrawl = mutate(corpus, seed)
    rules = configured_boilerplate_rules()
    corpus_tokens = sum(count_tokens(render(b)) for b in corpus.values())
    print(f"corpus: {len(corpus)} pages, {corpus_tokens:,} tokens "
          f"(generated in {time.perf_counter() - t0:.1f} s)")
    print("recrawl: " + ", ".join(f"{k} {v}" for k, v in sorted(recrawl.kinds.items())))

    embedder = HashEmbedder(dimensions=256)
    with db.connection(url) as conn:
        conn.autocommit = True
        t1 = time.perf_counter()
        deliver_all(conn, corpus, day=1)
        runs1, _ = run_pipeline(conn, embedder, run_id="first")
        first = ledger_tokens(conn)
        t2 = time.perf_counter()
        print(f"first crawl: {runs1} runs, {first[0]:,} tokens embedded in {t2 - t1:.1f} s")

        deliver_all(conn, recrawl.pages, day=2, removed=recrawl.removed)
        runs2, routed2 = run_pipeline(conn, embedder, run_id="recrawl")
        project_by_url = dict(conn.execute(
            "SELECT page_url, sum(tokens_embedded) FROM embedding_ledger WHERE run_id = 'recrawl' GROUP BY 1"
        ).fetchall())
        after = ledger_tokens(conn)
        t3 = time.perf_counter()
        project = after[0] - first[0]
        reused = after[1] - first[1]
        print(f"recrawl: {routed2} deliveries routed, {runs2} runs in {t3 - t2:.1f} s")

    def norm(blocks, day):
        return normalize_markdown(render(blocks + [footer(day)]), rules)

    full = sum(window_tokens(norm(b, 2)) for b in recrawl.pages.values())
    gate = 0
    gated_pages = 0
    gate_by_kind: Counter = Counter()
    project_by_kind: Counter = Counter()
    for page_url, blocks in recrawl.pages.items():
        old = corpus.get(page_url)
        if old is None or content_hash(norm(old, 1)) != content_hash(norm(blocks, 2)):
            cost = window_tokens(norm(blocks, 2))
            gate += cost
            gated_pages += 1
            gate_by_kind[recrawl.kind_of.get(page_url, "untouched")] += cost
    for page_url, tokens in project_by_url.items():
        project_by_kind[recrawl.kind_of.get(page_url, "untouched")] += int(tokens)
    floor = recrawl.floor_tokens

    print()
    print(f"{'kind of change':<22}{'pages':>6}{'gate':>10}{'project':>10}{'floor':>10}")
    for kind in [*EDIT_MIX, "added page", "removed page", "untouched"]:
        pages_n = recrawl.kinds[kind] if kind != "untouched" else len(recrawl.pages) - len(recrawl.kind_of)
        print(f"{kind:<22}{pages_n:>6}{gate_by_kind[kind]:>10,}{project_by_kind[kind]:>10,}"
              f"{recrawl.floor_by_kind[kind]:>10,}")

    print()
    print(f"{'strategy':<34}{'tokens embedded':>16}{'vs gate':>10}{'vs floor':>10}")
    for name, tokens in [("full reindex (512/64 window)", full),
                         (f"page-level gate ({gated_pages} pages, 512/64)", gate),
                         ("this project", project),
                         ("changed-paragraph floor", floor)]:
        print(f"{name:<34}{tokens:>16,}{tokens / gate:>10.3f}{tokens / floor:>10.2f}")
    edits = [k for k in EDIT_MIX if k != "rewritten page"]
    edit_gate = sum(gate_by_kind[k] for k in edits)
    edit_project = sum(project_by_kind[k] for k in edits)
    print(f"\nedits within pages: this project {edit_project:,} vs gate {edit_gate:,} tokens "
          f"({edit_project / edit_gate:.3f})")
    print(f"this project reused {reused:,} tokens of vectors on the {runs2} pages it re-ran")
    ok_gate = project <= 0.20 * gate
    ok_floor = project <= 3 * floor
    print(f"acceptance: project/gate = {project / gate:.3f} (≤ 0.20: {'yes' if ok_gate else 'NO'}); "
          f"project/floor = {project / floor:.2f} (≤ 3: {'yes' if ok_floor else 'NO'})")
    return 0 if ok_gate and ok_floor else 1


if __name__ == "__main__":
    sys.exit(main())
