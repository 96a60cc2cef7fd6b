"""Whether the first embedding space of an empty index is created with its HNSW index.

An initial load that is already a bulk load when its first batch runs (core/bulk_load.py: the
queued text against nothing indexed) creates the space without it: every batch of the load then
writes without the per-row index cost, and delivery_sensor's index upkeep asks for one concurrent
build once the backlog has drained, as for any bulk load. A small first load creates it at once.
"""

from __future__ import annotations

import psycopg

from rag_pipeline.core.bulk_load import IndexPolicy, backlog_rows
from rag_pipeline.settings import load_settings
from rag_pipeline.store import deliveries


def with_index(conn: psycopg.Connection) -> bool:
    settings = load_settings()
    policy = IndexPolicy(settings.hnsw_defer_ratio, settings.hnsw_defer_floor)
    return not policy.defer(0, backlog_rows(deliveries.queued_chars(conn)))
