"""The instance's event log (deploy/dagster.yaml): dagster-postgres's, with the planned events of a
run's creation stored in one statement.

A backfill over a site's pages creates a run a range of up to 2,000 pages, and Dagster writes a
planned event for each partition and asset of the range as it creates the run: 4,000 events, which
dagster-postgres stores one by one on a new connection each (9-20 ms apiece). The backfill daemon
creates its runs one after another, so at 100,000 pages run creation, not the runs, set the pace
(one range every 40-58 s, bench/README.md). Stored as one batch, they take well under a second, and
every partition still has its own planned event: the UI shows a range's pages in progress, and
failed when the run fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

from rag_pipeline import compat   # sets DAGSTER_EVENT_BATCH_SIZE: Dagster then hands the events over as one batch


class EventLogStorage(PostgresEventLogStorage):
    """Configured as dagster-postgres's is (`postgres_url`, or `postgres_db`)."""

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> EventLogStorage:
        # As dagster-postgres builds its own (its classmethod names its class, not `cls`).
        return cls(inst_data=inst_data, postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   token_provider=get_token_provider_from_config(config_value))

    def store_event_batch(self, events: Sequence[Any]) -> None:
        if not compat.store_planned_batch(self, events):
            super().store_event_batch(events)
