"""`rag-pipeline space …` and `backfill …`: embedding spaces and re-chunk backfills."""

from __future__ import annotations

import json

import click

from rag_pipeline.cli.common import CliError, index_url, progress
from rag_pipeline.settings import get_settings


@click.group()
def space() -> None:
    """Embedding spaces: switch models without a gap in search."""


@space.command("list")
def space_list() -> None:
    """Every embedding space, with its status and vector count."""
    from rag_pipeline.store import chunks as chunk_store
    from rag_pipeline.store import db, space_vectors, spaces

    with db.connection(index_url()) as conn:
        for s in spaces.list_all(conn):
            cached = chunk_store.cached_count(conn, s)
            live = space_vectors.live_count(conn, s) if s.status != "retired" else None
            searchable = f", {live} live chunks" if live is not None else ""
            backlog = space_vectors.backlog_size(conn, s) if s.status == "building" else 0
            waiting = f", {backlog} waiting for a vector" if backlog else ""
            click.echo(f"{s.space_id}  {s.status:<8}  {s.model} ({s.dimensions} dims)  "
                       f"{cached} vectors cached{searchable}{waiting}")


@space.command("build")
def space_build() -> None:
    """Fill the space of the configured embedder from the indexed chunk texts (search unaffected)."""
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.ingest.model_switch import WALK_PAGE, ModelSwitchError, build
    from rag_pipeline.store import db

    from rag_pipeline.store.status import chunk_count

    settings = get_settings()
    embedder = make_embedder(settings)
    with db.connection(index_url()) as conn:
        total = chunk_count(conn)
        with progress("chunks walked", total, every=20 * WALK_PAGE) as advance:
            try:
                result = build(conn, embedder, maintenance_work_mem=settings.space_build_memory,
                               on_progress=lambda r: advance(r.chunks_walked, f"{r.texts_embedded} texts embedded"))
            except ModelSwitchError as exc:
                raise CliError(str(exc)) from exc
    index = f"; index built in {result.index_s:.1f} s" if result.index_built else ""
    click.echo(f"space {result.space.space_id} ({embedder.model}, {embedder.dimensions} dims, "
               f"{result.space.status}): {result.chunks_walked} chunks walked, {result.texts_embedded} texts, "
               f"{result.tokens_embedded} tokens embedded{index}")


@space.command("activate")
def space_activate() -> None:
    """Finish the build of the configured embedder's space and flip search to it (a status flip)."""
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.ingest.model_switch import ModelSwitchError, activate
    from rag_pipeline.store import db

    embedder = make_embedder(get_settings())
    with db.connection(index_url()) as conn:
        try:
            active = activate(conn, embedder)
        except ModelSwitchError as exc:
            raise CliError(str(exc)) from exc
    click.echo(f"active: space {active.space_id} ({active.model}, {active.dimensions} dims)")


@click.group()
def backfill() -> None:
    """Re-chunk backfills after a chunker or budget change."""


@backfill.command("plan")
@click.option("--json", "as_json", is_flag=True)
def backfill_plan(as_json: bool) -> None:
    """Price a re-chunk of outdated pages from stored text, without calling the embedder."""
    from rag_pipeline.embedders.factory import indexing_chunk_budget
    from rag_pipeline.core.chunking import chunker_signature
    from rag_pipeline.ingest.backfill import plan
    from rag_pipeline.store import db, pages, spaces

    settings = get_settings()
    with db.connection(index_url()) as conn:
        active = spaces.active(conn)
        max_tokens, overlap_tokens = indexing_chunk_budget(settings, active)
        todo = pages.count_chunked_otherwise(conn, chunker_signature(max_tokens, overlap_tokens))
        with progress("pages re-chunked", todo, every=max(200, todo // 10), show=not as_json) as advance:
            result = plan(conn, active, max_tokens, overlap_tokens, on_progress=advance)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"chunker {result.signature}: {result.pages} page(s) to re-chunk")
    click.echo(f"  their chunks once re-cut: {result.chunks_total}, {result.chunks_to_embed} of them to embed")
    click.echo(f"  tokens: {result.tokens_to_embed} to embed, {result.tokens_reused} reused")
    if result.pages:
        click.echo("  run it: turn on `rechunk_sensor` in the Dagster UI, or backfill the `rechunk` job")
