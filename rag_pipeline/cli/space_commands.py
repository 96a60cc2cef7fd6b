"""`rag-pipeline space …` and `backfill …`: embedding spaces and re-chunk backfills."""

from __future__ import annotations

import json
from datetime import timedelta

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
    from rag_pipeline.store import db, growth, space_vectors, spaces

    settings = get_settings()
    with db.connection(index_url()) as conn:
        retired = growth.retired_tables(conn)
        for s in spaces.list_all(conn):
            cached = chunk_store.cached_count(conn, s)
            live = space_vectors.live_count(conn, s) if s.status != "retired" else None
            searchable = f", {live} live chunks" if live is not None else ""
            backlog = space_vectors.backlog_size(conn, s) if s.status == "building" else 0
            waiting = f", {backlog} waiting for a vector" if backlog else ""
            click.echo(f"{s.space_id}  {s.status:<8}  {s.model} ({s.dimensions} dims)  "
                       f"{cached} vectors cached{searchable}{waiting}{_table_fate(retired.get(s.space_id), settings)}")


def _table_fate(retired, settings) -> str:
    if retired is None:
        return ""
    retired_at, kept, dropped_at = retired
    if dropped_at is not None:
        return f"; its table was dropped {dropped_at:%Y-%m-%d}"
    if kept:
        return "; its table is kept (`space keep --release` lets retention drop it)"
    days = settings.retired_space_retention_days
    if not days or retired_at is None:
        return "; its table is kept (RETIRED_SPACE_RETENTION_DAYS=0)"
    return (f"; its table is dropped by the prune after {retired_at + timedelta(days=days):%Y-%m-%d}"
            " (`space keep` keeps it)")


@space.command("keep")
@click.argument("space_id", type=int)
@click.option("--release", is_flag=True, help="Stop keeping it: retention drops it when due.")
def space_keep(space_id: int, release: bool) -> None:
    """Keep a retired space's vector table past RETIRED_SPACE_RETENTION_DAYS (or, --release, stop)."""
    from rag_pipeline.store import db, growth

    with db.connection(index_url()) as conn:
        try:
            status, dropped_at = growth.keep_table(conn, space_id, not release)
        except growth.NoSuchSpace as exc:
            raise CliError(str(exc)) from exc
    if dropped_at is not None:
        raise CliError(f"space {space_id}'s table was dropped {dropped_at:%Y-%m-%d %H:%M} UTC: nothing to keep "
                       "(building that model again makes it anew from the cached vectors)")
    note = "" if status == "retired" else f" (it is {status} now: only a retired space's table is ever dropped)"
    click.echo(f"space {space_id}: table {'released to retention' if release else 'kept'}{note}")


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
                               memory_max=settings.space_build_memory_max,
                               on_progress=lambda r: advance(r.chunks_walked, f"{r.texts_embedded} texts embedded"))
            except ModelSwitchError as exc:
                raise CliError(str(exc)) from exc
    index = f"; index built in {result.index_s:.1f} s" if result.index_built else ""
    click.echo(f"space {result.space.space_id} ({embedder.model}, {embedder.dimensions} dims, "
               f"{result.space.status}): {result.chunks_walked} chunks walked, {result.texts_embedded} texts, "
               f"{result.tokens_embedded} tokens embedded{index}")


@space.command("activate")
@click.option("--force", is_flag=True,
              help="Switch even if the gate refuses: the switch is recorded as forced, with the figures.")
def space_activate(force: bool) -> None:
    """Finish the build of the configured embedder's space and flip search to it (a status flip),
    once it answers every site's labelled questions about as well as the active space."""
    from rag_pipeline.core.answer_quality import QuestionsError
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.ingest.activation_gate import Gate, GateRefused, declared_question_sets
    from rag_pipeline.ingest.model_switch import ModelSwitchError, activate
    from rag_pipeline.store import db

    settings = get_settings()
    try:
        question_sets = declared_question_sets()
    except QuestionsError as exc:
        raise CliError(f"cannot judge the switch: {exc}") from exc
    gate = Gate(settings, question_sets, settings.space_gate_margin, force=force)
    embedder = make_embedder(settings)
    with db.connection(index_url()) as conn:
        try:
            active = activate(conn, embedder, gate)
        except GateRefused as exc:
            first, *figures = str(exc).splitlines()
            for line in figures:
                click.echo(line, err=True)
            raise CliError(first) from exc
        except ModelSwitchError as exc:
            raise CliError(str(exc)) from exc
    for line in gate.lines:
        click.echo(line)
    if gate.forced:
        click.echo("forced past the gate (--force): recorded in space_activations")
    click.echo(f"active: space {active.space_id} ({active.model}, {active.dimensions} dims)")


@click.group()
def backfill() -> None:
    """Re-chunk backfills after a chunker or budget change."""


@backfill.command("plan")
@click.option("--json", "as_json", is_flag=True)
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Re-cut this many outdated pages at random and scale the figures to all of them.")
def backfill_plan(as_json: bool, sample: int | None) -> None:
    """Price a re-chunk of outdated pages from stored text, without calling the embedder."""
    from rag_pipeline.embedders.factory import indexing_chunk_budget
    from rag_pipeline.core.chunking import chunker_signature
    from rag_pipeline.ingest.backfill import plan, plan_lines, priced
    from rag_pipeline.store import db, pages, spaces

    settings = get_settings()
    with db.connection(index_url()) as conn:
        active = spaces.active(conn)
        budget = indexing_chunk_budget(settings, active)
        todo = pages.count_chunked_otherwise(conn, chunker_signature(*budget))
        todo = min(todo, sample) if sample else todo
        # A plan re-cuts in memory only: its progress says so, not "re-chunked".
        with progress("pages planned (cut in memory, nothing written)", todo, every=max(200, todo // 10),
                      show=not as_json) as advance:
            result = plan(conn, active, *budget, sample=sample, on_progress=advance)
        figures = priced(conn, result, settings.resolved_embedding_price())
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    for line in plan_lines(figures):
        click.echo(line)
    if result.pages:
        click.echo("  run it: turn on `rechunk_sensor` in the Dagster UI, or backfill the `rechunk` job")
