"""The metadata of a page's `pages`, `chunks` and `embeddings` materializations, one shape
whether a page run or a batch run wrote them, so a partition's history reads the same; and the
events that tell a crawl routing settled without a run (`crawl_events`)."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.core.chunking import ChunkBudget, chunker_signature
from rag_pipeline.defs.index.partitions import step_key
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.batch_apply import Failed
from rag_pipeline.ingest.routing import RoutingResult
from rag_pipeline.store import spaces


def source_metadata(result: indexing.SourceResult) -> dict:
    return {
        "status": result.status,
        "source_hash": result.source_hash or "",
        "delivery_id": result.delivery_id or 0,
        "chars": result.chars,
        "deliveries_superseded": result.superseded,
        **({"crawled_url": dg.MetadataValue.url(result.crawled_url)} if result.crawled_url else {}),
    }


def chunk_metadata(result: indexing.StageResult, budget: ChunkBudget) -> dict:
    return {
        "source_hash": result.source_hash or "",
        "chunks": result.chunks,
        "tokens": result.tokens,
        "chunker_version": chunker_signature(*budget),
        "max_tokens": budget.max_tokens,
        "overlap_tokens": budget.overlap_tokens,
        **({"model_window": f"{budget.window.limit} ({budget.window.name})"} if budget.window else {}),
    }


def switch_metadata(conn, result: indexing.SwitchResult, embedder, seen: dict, log) -> dict:
    """``embedder.note`` says when the configured model is not the space's: logged once a run
    (``seen`` is the run's memo of spaces) and kept on every page it concerns."""
    space = _space_of(conn, result.space_id, seen)
    note = embedder.note(space)
    extra: dict = {}
    if note:
        extra["note"] = note
        if ("noted", space.space_id) not in seen:
            seen[("noted", space.space_id)] = True
            log.info(note)
    if space is not None:
        extra["embedding_space"] = f"{space.model} ({space.dimensions} dims)"
    return {
        **extra,
        "status": result.status,
        "source_hash": result.source_hash or "",
        "chunks_total": result.chunks_total,
        "chunks_embedded": result.chunks_embedded,
        "tokens_embedded": result.tokens_embedded,
        "tokens_reused": result.tokens_reused,
        # The page's share of the requests its batch shared (0.2 of one, for one of five pages).
        "requests": round(result.request_share, 4),
        "inputs_truncated": result.truncated,
    }


def failure_metadata(event: Failed) -> dict:
    """Observed on the partition of the asset whose step failed for this page."""
    return {"status": "failed", "error": event.failure.reason[:2000], "retryable": event.failure.retryable,
            "delivery_id": event.delivery_id or 0}


def _space_of(conn, space_id: int | None, seen: dict) -> spaces.Space | None:
    """The space a page switched into (a run switches hundreds of pages into one or two)."""
    if space_id is None:
        return None
    if space_id not in seen:
        seen[space_id] = spaces.by_id(conn, space_id)
    return seen[space_id]


# What a page's partition shows of a crawl that needed no run (routing settled it).
_TOLD = {"unchanged": "unchanged", "deleted": "tombstoned", "skipped": "skipped", "superseded": "superseded",
         "failed": "failed"}


def crawl_events(routed: RoutingResult, located: dict[str, tuple[str | None, int | None]] | None = None,
                 ) -> list[dg.AssetObservation | dg.AssetMaterialization]:
    """One event a delivery routing settled, on its page's partition: an observation of `pages`
    with what the crawl did; for a tombstone also a materialization of `embeddings` with no
    chunks, so the partition's latest state is not its old content. A redirect is told on the
    page it leads to. `located`: each page's (site, shard), whose assets are told (unset: the
    catch-all's)."""
    located = located or {}

    def key(step: str, page_url: str) -> dg.AssetKey:
        return step_key(step, *located.get(page_url, (None, None)))

    events: list[dg.AssetObservation | dg.AssetMaterialization] = []
    settled_ids = set()
    for s in routed.settled:
        settled_ids.add(s.delivery_id)
        metadata = {"status": _TOLD[s.outcome], "delivery_id": s.delivery_id,
                    "original_status": s.original_status if s.original_status is not None else -1,
                    "crawler_status": s.crawler_status if s.crawler_status is not None else -1}
        if s.redirected_from:
            metadata["redirected_from"] = dg.MetadataValue.url(s.redirected_from)
        if s.crawled_url:   # the partition key is the page's identity, spelled https://; this opens
            metadata["crawled_url"] = dg.MetadataValue.url(s.crawled_url)
        events.append(dg.AssetObservation(asset_key=key("pages", s.page_url), partition=s.page_url, metadata=metadata))
        if s.outcome == "deleted":
            events.append(dg.AssetMaterialization(
                asset_key=key("embeddings", s.page_url), partition=s.page_url,
                description="tombstoned: the page is gone, its chunks left search",
                metadata={"status": "tombstoned", "chunks_total": 0, "delivery_id": s.delivery_id,
                          "original_status": metadata["original_status"],
                          **({"crawled_url": metadata["crawled_url"]} if s.crawled_url else {})}))
    for page_url, (origin, delivery_id) in routed.redirects.items():
        if delivery_id not in settled_ids:
            events.append(dg.AssetObservation(
                asset_key=key("pages", page_url), partition=page_url,
                metadata={"status": "redirect", "delivery_id": delivery_id,
                          "redirected_from": dg.MetadataValue.url(origin)}))
    return events
