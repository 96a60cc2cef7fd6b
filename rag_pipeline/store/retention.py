"""Retention: what the index may forget, deleted in short transactions.

Left alone, four tables grow without bound: `deliveries` (each crawl keeps its gzip'd body, though
the page's text already lives on `pages`), `pushes`, the `vectors` cache, and `crawl_observations`
(one row a crawl; the change-rate estimate reads only each page's newest). `prune` walks each in
primary-key order, one range of `batch_size` rows per transaction, so row locks and snapshots stay
short: the receiver's inserts never wait on it, and autovacuum reclaims space as it goes.

Never deleted:
- a delivery not routed yet, `queued`, or `failed` while its page has not applied anything newer
  (its run may still be retried); a page's source delivery its run has not switched in yet; a
  delivery whose push the `pushes_delivered` check still looks at (UNDELIVERED_WINDOW_S);
- a `pending` push, a push whose delivery is not routed yet (routing reads the pushed URL from it),
  a push younger than the `pushes_delivered` window;
- a vector whose text any chunk uses, in any space (a space being built, or a retired one kept for
  a switch back, holds vectors of live texts that no chunk row of that space references), or that a
  staged chunk generation is about to switch in.

Deliveries age by receipt, pushes by push time, and an unused vector from when a prune first found
it unused (`unused_since`; created_at says nothing about when a text stopped being used), so the
schedule's period adds up to a day to a vector's retention. The walks of `deliveries` and `pushes`
stop at the first range holding a row newer than the cutoff: ids follow receipt order, so a day's
walk reads the expired rows, the few kept ones before them, and one range. The walk of `vectors`
reads the whole cache (a text stops being used anywhere, any time): one index probe per vector.

One race is left, on purpose: a run that picks a long-unused cached vector in the instant between a
prune's check and its delete fails its switch (`IncompleteGeneration`: nothing changes in search)
and its retry embeds that text again. Closing it would cost a lock on every cache hit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from uuid import UUID

import psycopg

from rag_pipeline.store import db, growth
from rag_pipeline.store.prune_policy import Policy, PruneBusy, PruneResult
from rag_pipeline.store.pushes import UNDELIVERED_WINDOW_S

log = logging.getLogger(__name__)

# Any constant works; it only has to differ from other advisory locks of this database.
PRUNE_LOCK_KEY = 0x5241_4704
# A prune never queues behind a stuck transaction for long (nor makes others queue behind it).
LOCK_TIMEOUT = "10s"
SETTLED_OUTCOMES = ("embedded", "unchanged", "deleted", "skipped", "superseded", "refused", "unsolicited")


# Every walk statement runs unprepared (prepare=False): psycopg prepares a statement run 5 times, and
# PostgreSQL may then plan it once for any bounds, with a guessed range size instead of the real one.

# --- deliveries -------------------------------------------------------------------------------

_DELIVERY_RANGE = (
    "SELECT max(id), coalesce(bool_or(received_at >= %(cutoff)s), false), count(*) FROM ("
    " SELECT id, received_at FROM deliveries WHERE id > %(after)s ORDER BY id LIMIT %(batch)s) r"
)
_DELIVERY_PRUNABLE = """
    d.id > %(after)s AND d.id <= %(upto)s
    AND d.received_at < %(cutoff)s
    AND d.processed_at IS NOT NULL
    AND (d.outcome = ANY(%(settled)s)
         -- failed, but its page has applied a newer delivery since: never retried (it would be history)
         OR (d.outcome = 'failed' AND EXISTS (
               SELECT 1 FROM pages p WHERE p.url = d.page_url AND p.applied_delivery_id > d.id)))
    -- the source text of its page, not switched in yet: the switch marks this row
    AND NOT EXISTS (
          SELECT 1 FROM pages p WHERE p.url = d.page_url AND p.source_delivery_id = d.id
             AND d.id > coalesce(p.applied_delivery_id, 0))
    -- pushes_delivered finds the delivery of each recent push by rid
    AND NOT EXISTS (SELECT 1 FROM pushes p WHERE p.rid = d.rid AND p.pushed_at > %(push_lookback)s)
"""


#: Told the rows a walk has read so far, after each range.
Progress = Callable[[int], None]


def _nothing(walked: int) -> None:
    pass


def prune_deliveries(conn: psycopg.Connection, cutoff: datetime, *, push_lookback: datetime,
                     batch_size: int, dry_run: bool = False, on_progress: Progress = _nothing) -> tuple[int, int]:
    """Delete settled deliveries received before `cutoff`; returns (rows, transactions)."""
    return _walk_by_id(conn, "deliveries d", _DELIVERY_RANGE, _DELIVERY_PRUNABLE,
                       {"cutoff": cutoff, "push_lookback": push_lookback, "settled": list(SETTLED_OUTCOMES)},
                       batch_size, dry_run, on_progress)


def _walk_by_id(conn: psycopg.Connection, table: str, range_sql: str, prunable_sql: str, params: dict,
                batch_size: int, dry_run: bool, on_progress: Progress) -> tuple[int, int]:
    """Prune `table` one id range at a time, each range in its own short transaction, until the
    range that reaches rows newer than the cutoff (ids grow with time: nothing after it is old)."""
    verb = f"SELECT count(*) FROM {table} WHERE " if dry_run else f"DELETE FROM {table} WHERE "
    params = {**params, "batch": batch_size, "after": 0}
    total = batches = walked = 0
    while True:
        with conn.transaction():
            _short_locks(conn)
            upto, reached_new, rows = conn.execute(range_sql, params, prepare=False).fetchone()
            if upto is None:
                break
            total += _count(conn.execute(verb + prunable_sql, {**params, "upto": upto}, prepare=False),
                            dry_run)
        batches += 1
        walked += rows
        on_progress(walked)
        params["after"] = upto
        if reached_new:
            break
    return total, batches


# --- pushes -----------------------------------------------------------------------------------

_PUSH_RANGE = (
    "SELECT max(push_id), coalesce(bool_or(pushed_at >= %(cutoff)s), false), count(*) FROM ("
    " SELECT push_id, pushed_at FROM pushes WHERE push_id > %(after)s ORDER BY push_id LIMIT %(batch)s) r"
)
_PUSH_PRUNABLE = """
    p.push_id > %(after)s AND p.push_id <= %(upto)s
    AND p.pushed_at < %(cutoff)s
    AND p.result <> 'pending'
    -- routing reads the pushed URL of a delivery that came without one
    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.rid = p.rid AND d.processed_at IS NULL)
"""


def prune_pushes(conn: psycopg.Connection, cutoff: datetime, *, batch_size: int,
                 dry_run: bool = False, on_progress: Progress = _nothing) -> tuple[int, int]:
    """Delete finished pushes made before `cutoff`; returns (rows, transactions)."""
    return _walk_by_id(conn, "pushes p", _PUSH_RANGE, _PUSH_PRUNABLE, {"cutoff": cutoff},
                       batch_size, dry_run, on_progress)


# --- vectors ----------------------------------------------------------------------------------

# Walked one space at a time: with the space fixed, the planner estimates an embed_hash range from its
# histogram (a row comparison over (space_id, embed_hash) is estimated from space_id alone: the whole
# table, and a sequential scan per range).
_VECTOR_BOUND = (
    "SELECT embed_hash FROM vectors WHERE space_id = %(space)s AND embed_hash > %(after)s"
    " ORDER BY embed_hash OFFSET %(offset)s LIMIT 1"
)
_VECTOR_IN_RANGE = "v.space_id = %(space)s AND v.embed_hash > %(after)s"
_VECTOR_IN_RANGE_UPTO = _VECTOR_IN_RANGE + " AND v.embed_hash <= %(upto)s"
# Used: a chunk of any space has this text (one probe of chunks_embed_hash), or a staged generation
# is about to switch it in (staged_chunks holds the pages in flight only: hashed once per statement).
_UNUSED = """
    NOT EXISTS (SELECT 1 FROM chunks c WHERE c.embed_hash = v.embed_hash)
    AND v.embed_hash NOT IN (SELECT s.embed_hash FROM staged_chunks s)
"""
_USED = """
    (EXISTS (SELECT 1 FROM chunks c WHERE c.embed_hash = v.embed_hash)
     OR v.embed_hash IN (SELECT s.embed_hash FROM staged_chunks s))
"""
_VECTOR_DELETE = "DELETE FROM vectors v WHERE {range} AND v.unused_since < %(cutoff)s AND" + _UNUSED
_VECTOR_MARK = "UPDATE vectors v SET unused_since = now() WHERE {range} AND v.unused_since IS NULL AND" + _UNUSED
_VECTOR_CLEAR = "UPDATE vectors v SET unused_since = NULL WHERE {range} AND v.unused_since IS NOT NULL AND" + _USED
_VECTOR_KEPT = "SELECT count(*) FROM vectors v WHERE {range} AND v.unused_since IS NOT NULL"
_VECTOR_COUNT = """
    SELECT count(*) FILTER (WHERE v.unused_since < %(cutoff)s), count(*)
      FROM vectors v WHERE {range} AND""" + _UNUSED


def prune_vectors(conn: psycopg.Connection, cutoff: datetime, *, batch_size: int,
                  dry_run: bool = False, on_progress: Progress = _nothing) -> tuple[int, int, int]:
    """Delete vectors unused since before `cutoff`, mark newly unused ones, clear the mark of ones
    used again. Returns (deleted, unused vectors kept, transactions)."""
    with conn.transaction():
        space_ids = [r[0] for r in conn.execute("SELECT space_id FROM embedding_spaces ORDER BY space_id")]
    deleted = kept = batches = walked = 0
    for space_id in space_ids:
        params = {"cutoff": cutoff, "space": space_id, "after": b"", "offset": batch_size - 1}
        while True:
            with conn.transaction():
                _short_locks(conn)
                bound = conn.execute(_VECTOR_BOUND, params, prepare=False).fetchone()
                params["upto"] = bound[0] if bound else None
                where = _VECTOR_IN_RANGE_UPTO if bound else _VECTOR_IN_RANGE
                if dry_run:
                    gone, unused = conn.execute(_VECTOR_COUNT.format(range=where), params, prepare=False).fetchone()
                    kept += unused - gone
                else:
                    gone = conn.execute(_VECTOR_DELETE.format(range=where), params, prepare=False).rowcount
                    marked = conn.execute(_VECTOR_MARK.format(range=where), params, prepare=False).rowcount
                    cleared = conn.execute(_VECTOR_CLEAR.format(range=where), params, prepare=False).rowcount
                    kept += conn.execute(_VECTOR_KEPT.format(range=where), params, prepare=False).fetchone()[0]
                    if marked or cleared:
                        log.debug("space %s: %d vector(s) newly unused, %d used again", space_id, marked, cleared)
            batches += 1
            deleted += gone
            if bound is None:
                break
            walked += batch_size        # a range up to a bound holds batch_size vectors
            on_progress(walked)
            params["after"] = bytes(bound[0])
    return deleted, kept, batches


# --- crawl observations -----------------------------------------------------------------------

# Walked by ranges of pages (page_id order): a page's observations beyond its newest `keep` go.
_PAGE_BOUND = "SELECT page_id FROM pages WHERE page_id > %(after)s ORDER BY page_id OFFSET %(offset)s LIMIT 1"
_OLD_OBSERVATIONS = """
    FROM (SELECT page_id, crawled_at, row_number() OVER (PARTITION BY page_id ORDER BY crawled_at DESC) AS n
            FROM crawl_observations WHERE page_id > %(after)s {upto}) ranked
   WHERE ranked.n > %(keep)s
"""


def prune_observations(conn: psycopg.Connection, keep: int, *, batch_size: int, dry_run: bool = False,
                       on_progress: Progress = _nothing) -> tuple[int, int]:
    """Delete each page's crawl observations beyond its newest ``keep``; returns (rows, transactions)."""
    params = {"after": UUID(int=0), "offset": batch_size - 1, "keep": keep}
    total = batches = walked = 0
    while True:
        with conn.transaction():
            _short_locks(conn)
            bound = conn.execute(_PAGE_BOUND, params, prepare=False).fetchone()
            old = _OLD_OBSERVATIONS.format(upto="AND page_id <= %(upto)s" if bound else "")
            params["upto"] = bound[0] if bound else None
            if dry_run:
                total += conn.execute("SELECT count(*)" + old, params, prepare=False).fetchone()[0]
            else:
                total += conn.execute(
                    "DELETE FROM crawl_observations o USING (SELECT page_id, crawled_at" + old + ") gone"
                    " WHERE o.page_id = gone.page_id AND o.crawled_at = gone.crawled_at", params, prepare=False
                ).rowcount
        batches += 1
        if bound is None:
            break
        walked += batch_size
        on_progress(walked)
        params["after"] = bound[0]
    return total, batches


# --- all of them --------------------------------------------------------------------------------

def prune_ended_batches(conn: psycopg.Connection, cutoff: datetime, *, dry_run: bool = False) -> int:
    """Batch records ended before `cutoff` (a few hundred a day: one statement)."""
    verb = "SELECT count(*) FROM batches WHERE " if dry_run else "DELETE FROM batches WHERE "
    return _count(conn.execute(verb + "ended_at < %s", (cutoff,), prepare=False), dry_run)


def estimated_rows(conn: psycopg.Connection) -> dict[str, int]:
    """The planner's row estimates of the walked tables (free; exact enough for a progress bar)."""
    rows = conn.execute(
        "SELECT relname, greatest(reltuples, 0)::bigint FROM pg_class"
        " WHERE oid IN ('deliveries'::regclass, 'pushes'::regclass, 'vectors'::regclass, 'pages'::regclass)"
    ).fetchall()
    return dict(rows)


def prune(conn: psycopg.Connection, policy: Policy, *, dry_run: bool = False,
          on_progress: Callable[[str, int], None] | None = None) -> PruneResult:
    """Apply `policy` to deliveries, pushes and vectors. A dry run counts and changes nothing (not
    even the unused marks of vectors). Raises PruneBusy when another prune is running.
    ``on_progress(table, rows_walked)`` is told after each range."""
    def told(table: str) -> Progress:
        return (lambda walked: on_progress(table, walked)) if on_progress else _nothing

    # Inside an open transaction every batch would become a savepoint of one long transaction.
    db.require_autocommit(conn, "a prune (each batch commits on its own)")
    started = time.monotonic()
    result = PruneResult(dry_run)
    with _prune_lock(conn):
        with conn.transaction():
            now = conn.execute("SELECT now()").fetchone()[0]
        push_lookback = now - timedelta(seconds=UNDELIVERED_WINDOW_S)
        if policy.delivery_days:
            result.deliveries, result.batches["deliveries"] = prune_deliveries(
                conn, now - timedelta(days=policy.delivery_days), push_lookback=push_lookback,
                batch_size=policy.batch_size, dry_run=dry_run, on_progress=told("deliveries"))
            log.info("deliveries: %d %s in %d batch(es)", result.deliveries, _verb(dry_run),
                     result.batches["deliveries"])
            with conn.transaction():
                result.ended_batches = prune_ended_batches(conn, now - timedelta(days=policy.delivery_days),
                                                           dry_run=dry_run)
        if policy.push_days:
            cutoff = min(now - timedelta(days=policy.push_days), push_lookback)
            result.pushes, result.batches["pushes"] = prune_pushes(
                conn, cutoff, batch_size=policy.batch_size, dry_run=dry_run, on_progress=told("pushes"))
            log.info("pushes: %d %s in %d batch(es)", result.pushes, _verb(dry_run), result.batches["pushes"])
        if policy.vector_days:
            result.vectors, result.vectors_unused, result.batches["vectors"] = prune_vectors(
                conn, now - timedelta(days=policy.vector_days), batch_size=policy.batch_size, dry_run=dry_run,
                on_progress=told("vectors"))
            log.info("vectors: %d %s in %d batch(es), %d unused kept for reuse", result.vectors,
                     _verb(dry_run), result.batches["vectors"], result.vectors_unused)
        if policy.ledger_days:
            result.ledger_rolled_up, result.batches["ledger"] = growth.roll_up_ledger(
                conn, now - timedelta(days=policy.ledger_days), batch_size=policy.batch_size, dry_run=dry_run)
        if policy.retired_space_days:
            result.retired_tables = [t.space_id for t in growth.drop_retired_tables(
                conn, now - timedelta(days=policy.retired_space_days), dry_run=dry_run)]
        result.observations, result.batches["observations"] = prune_observations(
            conn, policy.observations_kept, batch_size=policy.batch_size, dry_run=dry_run,
            on_progress=told("observations"))
        log.info("crawl observations: %d %s in %d batch(es)", result.observations, _verb(dry_run),
                 result.batches["observations"])
    result.seconds = round(time.monotonic() - started, 3)
    return result


@contextmanager
def _prune_lock(conn: psycopg.Connection) -> Iterator[None]:
    """A session lock for the whole walk (each batch is its own transaction)."""
    with conn.transaction():
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (PRUNE_LOCK_KEY,)).fetchone()[0]
    if not got:
        raise PruneBusy("another prune is running (it holds the prune lock); try again when it ends")
    try:
        yield
    finally:
        if not conn.closed:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_unlock(%s)", (PRUNE_LOCK_KEY,))


def _short_locks(conn: psycopg.Connection) -> None:
    conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def _count(cursor: psycopg.Cursor, dry_run: bool) -> int:
    return cursor.fetchone()[0] if dry_run else cursor.rowcount


def _verb(dry_run: bool) -> str:
    return "would be deleted" if dry_run else "deleted"
