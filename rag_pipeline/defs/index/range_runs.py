"""A run over a range of partitions (a UI backfill in ranges, a launched range, one page by hand)
leases its pages as a batch does, so that it never applies a page beside rechunk_sensor's or a
delivery's batch: a page another batch holds is left to it, a page already cut with the current
chunker is left as it is, and the UI says which on the page's partition. The lease is the run's
(key `run-<run id>`); it ends when the run's step has switched the page (or given it up), and if the
run dies it runs out (BATCH_LEASE_S) for the sensors to take the page again.

When the range holds pages a chunker change made due (a re-chunk, from the `rechunk` job or the
assets), the run also records the re-chunk's plan once, marks it under way, and lets the search
indexes make way if it is a bulk load, as rechunk_sensor does.
"""

from dataclasses import dataclass, field

import dagster as dg

from rag_pipeline.core.chunking import ChunkBudget, chunker_signature
from rag_pipeline.defs.index.bulk_index import index_upkeep
from rag_pipeline.defs.index.rechunk_plan import record_plan
from rag_pipeline.ingest.backfill import plan_lines
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import pages, rechunks, spaces


@dataclass
class RangeLease:
    key: str
    held: list[str]
    skipped: dict[str, str] = field(default_factory=dict)   # page URL → why this run left it


def lease_key(run_id: str) -> str:
    return f"run-{run_id}"


def take(conn, urls: list[str], run_id: str, lease_s: float, *, signature: str | None = None) -> RangeLease:
    """The range's pages this run may apply, in the range's order: those it holds already (an
    earlier try of its step) and those no batch holds, leased now. With `signature` (`chunks`
    selected), a page already indexed from its source as cut with it is left out; without (a run of
    `embeddings` alone), a page this run does not hold is taken only if it has chunks staged to
    switch in, so a page another batch switched meanwhile is not reported again."""
    key = lease_key(run_id)
    with conn.transaction():
        mine = pages.leased_to(conn, urls, key)
    others = pages.holders(conn, [u for u in urls if u not in mine])   # held by another batch now
    rest = [u for u in urls if u not in mine and u not in others]
    if signature:
        done = pages.cut_with(conn, rest, signature)
        why_done = f"already cut with {signature}: nothing to re-chunk"
    else:
        done = set(rest) - chunk_store.pages_staged(conn, rest)
        why_done = "nothing staged to switch in: cut and switched already (by another batch, or never cut)"
    with conn.transaction():
        got = mine | set(pages.lease(conn, [u for u in rest if u not in done], key, lease_s))
    others.update(pages.holders(conn, [u for u in rest if u not in done and u not in got]))   # took it meanwhile
    skipped = {u: "taken by another batch while this run leased its range: applied there" for u in urls
               if u not in got and u not in done and u not in others}
    skipped.update({u: why_done for u in done})
    skipped.update({u: f"left to batch {others[u]}, which holds it (rechunk_sensor or a delivery batch): "
                       "applied there, not twice" for u in others})
    return RangeLease(key, [u for u in urls if u in got], skipped)


def release(conn, lease: RangeLease, urls: list[str]) -> None:
    if urls:
        with conn.transaction():
            pages.release_many(conn, urls, lease.key)


def note_rechunk(context: dg.OpExecutionContext, conn, settings, budget: ChunkBudget, urls: list[str]) -> None:
    """A range that re-chunks pages: the plan recorded once, the re-chunk marked under way, and the
    indexes dropped for it when it is a bulk load (the build is delivery_sensor's, at its end)."""
    signature = chunker_signature(*budget)
    if not urls or not pages.count_chunked_otherwise_among(conn, urls, signature):
        return
    planned = record_plan(conn, spaces.active(conn), budget, settings.resolved_embedding_price())
    if planned is not None:
        context.log_event(planned[0])
        context.log.info("\n".join(plan_lines(planned[1])))
    with conn.transaction():
        rechunks.seen(conn, signature)
    if settings.holds().holds_main():
        _, said = index_upkeep(context.instance, conn, settings, rebuild=False)
        if said:
            context.log.info(said)


def skipped_metadata(reason: str) -> dict:
    return {"skipped": reason}
