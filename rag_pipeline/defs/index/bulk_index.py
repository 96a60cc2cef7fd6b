"""The search indexes around bulk loads (core/bulk_load.py): the active space's HNSW index and the
GIN index of `chunks.text_search`, dropped by delivery_sensor while a large backlog is written and
built again concurrently by a `space_index` run once the backlog has drained. Search reads the
tables exactly meanwhile (the same results, slower), and says so."""

import time

import dagster as dg
import psycopg

from rag_pipeline.core.bulk_load import IndexPolicy, backlog_rows, chars_per_vector, rechunk_backlog
from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.defs.unended_runs import unended_run
from rag_pipeline.store import deliveries, rechunks, spaces, text_search

SPACE_INDEX_JOB = "space_index"
REBUILD_BACKOFF_S = 300.0
# How long the tick's DROP INDEX CONCURRENTLY waits for transactions open on the table (a long
# search, a backfill's write) before it leaves the drop to the next tick: the tick has 60 s in all.
DROP_LOCK_TIMEOUT = "5s"
# A re-chunk counts in the backlog while rechunk_sensor ticks for it, or a run of it started,
# within this long: one turned off half-way stops keeping the indexes away after it.
RECHUNK_SEEN_S = 300.0
# A run in one of these states is still to come or under way (a build: no second one is requested).


@dg.op(out={}, tags={"kind": "pgvector"})
def build_space_index(context: dg.OpExecutionContext, postgres: PostgresResource, settings: SettingsResource):
    """Build the search indexes a bulk load wrote without, concurrently: page switches go on
    meanwhile. The vector index first: search reads it in every mode but lexical."""
    current = settings.get()
    builds = []   # (what, build, what to say once built): the vector index first
    with postgres.connect() as conn:
        space = spaces.active(conn)
        if space is not None and spaces.index_state(conn, space) != "valid":
            def hnsw() -> str:
                built = spaces.build_index_concurrently(conn, space, current.space_build_memory,
                                                        current.hnsw_build_workers, current.space_build_memory_max)
                raise_ = "SPACE_BUILD_MEMORY_MAX" if current.space_build_memory == "auto" else "SPACE_BUILD_MEMORY"
                fit = "" if built.fits else (" (its graph did not fit in that memory, which makes a build several "
                                             f"times slower: raise {raise_} if the server can spare it)")
                return (f"over {built.vectors:,} vectors with maintenance_work_mem {built.maintenance_work_mem}{fit}: "
                        "vector search uses it again")
            builds.append((f"HNSW index of space {space.space_id}", hnsw))
        if text_search.index_state(conn) != "valid":
            def gin() -> str:
                text_search.build_index_concurrently(conn, current.hnsw_build_workers)
                return "over every chunk: lexical search uses it again"
            builds.append(("GIN index of chunks.text_search", gin))
        failed = []
        for what, build in builds:   # one failing does not keep the other from being built
            started = time.monotonic()
            try:
                said = build()
            except psycopg.Error as exc:
                failed.append(f"{what}: {exc}")
                context.log.error(f"building the {what} failed: {exc}")
            else:
                context.log.info(f"{what} built {said} ({time.monotonic() - started:.1f} s)")
    if failed:
        raise dg.Failure(description="; ".join(failed))
    if not builds:
        context.log.info("the search indexes are in place: nothing to build")


@dg.job(name=SPACE_INDEX_JOB, tags={"rag/kind": "index"},
        description="Build the search indexes (HNSW, GIN) again after a bulk load (requested by delivery_sensor).")
def space_index():
    build_space_index()


def index_upkeep(instance: dg.DagsterInstance, conn, settings, *,
                 rebuild: bool = True) -> tuple[dg.RunRequest | None, str | None]:
    """One look at the indexes and the backlog: drop them for a bulk load, or ask for their
    rebuild once the backlog has drained (not with `rebuild` False: rechunk_sensor and a re-chunk
    run only make way; delivery_sensor alone asks for builds). Returns the run to request and
    what was done.

    The backlog is the queued deliveries' vectors and the rows each re-chunk under way has left
    to write: a re-chunk that rewrites most rows is a bulk load, one that rewrites few is not."""
    space = spaces.active(conn)
    if space is None:
        return None, None
    policy = IndexPolicy(settings.hnsw_defer_ratio, settings.hnsw_defer_floor)
    queued = backlog_rows(deliveries.queued_chars(conn), chars_per_vector(*spaces.source_per_chunk_sample(conn)))
    rechunking = {r.signature: rechunk_backlog(r.planned_pages, r.rows_written, r.outdated_pages)
                  for r in rechunks.under_way(conn, RECHUNK_SEEN_S)}
    backlog = queued + sum(rechunking.values())
    droppers = {"HNSW": (spaces.index_state(conn, space), lambda: spaces.drop_index(conn, space, DROP_LOCK_TIMEOUT)),
                "GIN": (text_search.index_state(conn), lambda: text_search.drop_index(conn, DROP_LOCK_TIMEOUT))}
    standing = [name for name, (state, _) in droppers.items() if state != "missing"]
    if standing and policy.defer(indexed := spaces.indexed_rows(conn, space), backlog):
        # Whichever still stands makes way. One a space_index run is building is left to it (a
        # drop would wait for the build); one left invalid by an interrupted drop goes too.
        building = any(droppers[name][0] == "invalid" for name in standing) and _pending(instance)
        dropped, waited = [], []
        for name in standing:
            state, drop = droppers[name]
            if state == "invalid" and building:
                continue
            try:
                drop()
            except psycopg.errors.LockNotAvailable:
                waited.append(name)   # a long transaction on its table: the next tick tries again
            else:
                dropped.append(name)
        if not dropped and not waited:
            return None, None
        said = f"bulk load: ~{backlog:,} vectors to write against ~{indexed:,} indexed"
        if any(rechunking.values()):
            said += " (" + ", ".join([f"~{queued:,} queued"] * bool(queued) + [
                f"~{rows:,} of the re-chunk to {signature}" for signature, rows in rechunking.items() if rows]) + ")"
        if dropped:
            said += (f"; the {' and '.join(dropped)} index{'es are' if len(dropped) > 1 else ' is'} dropped until "
                     "the backlog is written (search is exact meanwhile)")
        if waited:
            said += (f"; dropping the {' and '.join(waited)} index waited over {DROP_LOCK_TIMEOUT} for transactions "
                     "open on its table: tried again next tick")
        return None, said
    if not rebuild or all(state == "valid" for state, _ in droppers.values()) or not policy.rebuild(backlog):
        return None, None
    if _pending(instance):
        return None, None
    newest = instance.get_run_records(dg.RunsFilter(job_name=SPACE_INDEX_JOB), limit=1)
    if (newest and newest[0].dagster_run.status == dg.DagsterRunStatus.FAILURE and newest[0].end_time
            and time.time() - newest[0].end_time < REBUILD_BACKOFF_S):
        return None, None   # a build that failed is tried again after a pause, not on every tick
    return (dg.RunRequest(job_name=SPACE_INDEX_JOB, run_key=f"space-index-{time.time():.3f}",
                          tags={"rag/space": str(space.space_id)}),
            f"the backlog has drained (~{backlog:,} vectors left): building the search indexes again")


def _pending(instance: dg.DagsterInstance) -> bool:
    """Whether a space_index run is queued or under way."""
    return unended_run(instance, SPACE_INDEX_JOB) is not None


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(jobs=[space_index])
