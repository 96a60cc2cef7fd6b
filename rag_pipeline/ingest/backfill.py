"""Re-chunk backfill: which pages a chunker change makes due, and what re-cutting them costs.

Everything works from the stored source text: a re-chunk never needs a recrawl, and the plan
never calls the embedder (it only looks texts up in the vector cache). Besides the tokens, a plan
counts the vector rows the re-chunk writes (a re-cut chunk whose index keeps its text writes
none): the figure the bulk-load policy weighs against the rows indexed (core/bulk_load.py), so
that a re-chunk that rewrites most rows is a bulk load and one that rewrites few is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import psycopg

from rag_pipeline.core import run_rates
from rag_pipeline.core.chunking import ChunkBudget, Window, chunk_markdown, chunker_signature
from rag_pipeline.core.template_strip import chunk_source
from rag_pipeline.core.text import embed_hash
from rag_pipeline.store import batch_leases, chunks, pages, site_templates
from rag_pipeline.store.spaces import Space

# Pages a sensor tick or a run re-cuts in memory to plan a re-chunk: a few seconds of CPU.
SAMPLE_PAGES = 300


@dataclass
class BackfillPlan:
    signature: str
    pages: int = 0
    sampled_pages: int = 0       # the pages re-cut to plan: all of them, or a random sample
    chunks_total: int = 0
    chunks_to_embed: int = 0
    tokens_to_embed: int = 0
    tokens_reused: int = 0
    rows_written: int = 0        # vector rows written: a chunk index whose text is new
    rows_live: int = 0           # the live chunks of those pages now

    @property
    def sampled(self) -> bool:
        return self.sampled_pages < self.pages

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def plan(conn: psycopg.Connection, space: Space | None, max_tokens: int, overlap_tokens: int,
         window: Window | None = None, *, batch: int = 200, sample: int | None = None,
         on_progress: Callable[[int], None] | None = None) -> BackfillPlan:
    """Re-chunk the outdated pages (`sample`: that many at random, the figures scaled to all of
    them) in memory and price it against the vector cache and the live chunks, `batch` pages a
    statement. ``on_progress(pages_done)`` is told after each batch."""
    budget = ChunkBudget(max_tokens, overlap_tokens, window)
    signature = chunker_signature(*budget)
    result = BackfillPlan(signature)
    seen: set[bytes] = set()  # a text shared by several pages is embedded once
    templates = site_templates.current(conn)
    group: list[tuple] = []

    def price() -> None:
        _price_group(conn, space, group, templates, budget, seen, result)
        group.clear()
        if on_progress:
            on_progress(result.sampled_pages)

    for row in pages.sources_chunked_otherwise(conn, signature, itersize=batch, sample=sample):
        group.append(row)
        if len(group) >= batch:
            price()
    if group:
        price()
    result.pages = result.sampled_pages
    if sample is not None:
        result.pages = pages.count_chunked_otherwise(conn, signature)
        _scale(result)
    return result


def _price_group(conn, space, group, templates, budget: ChunkBudget, seen, result) -> None:
    cut = []
    for url, page_id, text, site in group:
        template = templates.get(site, (None, None))[0]
        pieces = chunk_markdown(chunk_source(text or "", template, url), *budget)
        cut.append((page_id, pieces, [embed_hash(c.embed_text) for c in pieces]))
    every = [h for _, _, hashes in cut for h in hashes]
    cached = chunks.cached_hashes(conn, space, every) if space is not None and every else set()
    live = chunks.live_hashes(conn, [page_id for page_id, _, _ in cut])
    for page_id, pieces, hashes in cut:
        result.sampled_pages += 1
        now = live.get(page_id, {})
        result.rows_live += len(now)
        for piece, digest in zip(pieces, hashes):
            result.chunks_total += 1
            if now.get(piece.index) != digest:
                result.rows_written += 1
            if digest in cached or digest in seen:
                result.tokens_reused += piece.token_count
            else:
                seen.add(digest)
                result.chunks_to_embed += 1
                result.tokens_to_embed += piece.token_count


def _scale(result: BackfillPlan) -> None:
    """A sample's counts, scaled to every outdated page."""
    if not result.sampled_pages or result.pages == result.sampled_pages:
        return
    factor = result.pages / result.sampled_pages
    for name in ("chunks_total", "chunks_to_embed", "tokens_to_embed", "tokens_reused", "rows_written", "rows_live"):
        setattr(result, name, round(getattr(result, name) * factor))


def priced(conn: psycopg.Connection, result: BackfillPlan, price_per_mtok: float) -> dict:
    """The plan as the CLI's --json and the UI's metadata give it: its counts, the cost at the
    reference price, and a time at the pace the newest batches measured (None before any)."""
    rates = run_rates.measure(batch_leases.recent_applied(conn))
    estimate = run_rates.estimate_s(rates, result.pages, result.tokens_to_embed)
    return {**result.as_dict(), "sampled": result.sampled,
            "price_per_mtok_usd": price_per_mtok, "cost_usd": round(result.tokens_to_embed / 1e6 * price_per_mtok, 6),
            "estimate_s": None if estimate is None else round(estimate, 1),
            "measured_pages_per_s": None if rates is None else round(rates.pages_per_s, 2),
            "measured_tokens_per_s": None if rates is None else round(rates.tokens_per_s, 1)}


def plan_lines(figures: dict) -> list[str]:
    """A re-chunk's plan as the CLI prints it."""
    scaled = (f" (figures scaled from a random sample of {figures['sampled_pages']:,})"
              if figures["sampled"] else "")
    estimate = ("no batch measured yet to estimate the time from" if figures["estimate_s"] is None else
                f"~{figures['estimate_s'] / 60:,.1f} min at the newest batches' pace "
                f"({figures['measured_pages_per_s']:,} pages/s, {figures['measured_tokens_per_s']:,} tokens/s)")
    return [
        f"chunker {figures['signature']}: {figures['pages']:,} page(s) would be re-chunked{scaled} "
        "(a plan: nothing was changed)",
        f"  their chunks once re-cut: {figures['chunks_total']:,}, {figures['chunks_to_embed']:,} of them to embed",
        f"  vector rows written: {figures['rows_written']:,} of {figures['rows_live']:,} live now",
        f"  tokens: {figures['tokens_to_embed']:,} to embed, {figures['tokens_reused']:,} reused",
        f"  cost: ${figures['cost_usd']:,.6f} at ${figures['price_per_mtok_usd']} per million tokens "
        "(EMBEDDING_PRICE_PER_MTOK)",
        f"  time: {estimate}",
    ]
