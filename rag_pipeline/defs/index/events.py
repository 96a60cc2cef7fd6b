"""A batch run's per-page asset events, written to Dagster's event log in batches.

Each logged `AssetMaterialization` is one write to the event log, and dagster-postgres opens a
connection for each (NullPool): ~20 ms an event on the 2-core machine, three events a page, more
than the page's own work. `EventWriter` writes a batch run's events as Dagster writes the partitions
of one output, one batch per asset key and event type (the storage moves an asset's
latest-materialization pointer from a batch's last event only): 2.9 ms an event instead of 20. The
private calls this takes are in `rag_pipeline.compat`, with the test that catches an upgrade.

Every event gets its own millisecond (`DistinctMilliseconds`): the UI's event lists key events by
their timestamp, and shows one of several that share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import dagster as dg

from rag_pipeline import compat

Event = dg.AssetMaterialization | dg.AssetObservation


class DistinctMilliseconds(logging.Filter):
    """Gives each record of a logger a timestamp at least 1.1 ms after the one before it. A standard
    logging filter on `context.log` (whose records become the run's events): the timestamps run ahead
    of the clock by at most 1.1 ms for each event written faster than that."""

    GAP_S = 0.0011

    def __init__(self) -> None:
        super().__init__()
        self._last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        created = max(record.created, self._last + self.GAP_S)
        record.created = created
        record.msecs = (created - int(created)) * 1000
        self._last = created
        return True

    @classmethod
    def on(cls, logger: logging.Logger) -> None:
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())

    @classmethod
    def spaced(cls, count: int, start: float | None = None) -> list[float]:
        """``count`` timestamps from now (or ``start``), each 1.1 ms after the one before."""
        start = time.time() if start is None else start
        return [start + i * cls.GAP_S for i in range(count)]


class EventWriter:
    def __init__(self, context: dg.OpExecutionContext, flush_every: int = 100):
        self._context = context
        self._flush_every = flush_every
        self._buffers: dict[tuple[str, dg.AssetKey], list[Event]] = {}
        DistinctMilliseconds.on(context.log)

    def add(self, event: Event) -> None:
        kind = "materialization" if isinstance(event, dg.AssetMaterialization) else "observation"
        key = (kind, event.asset_key)
        buffer = self._buffers.setdefault(key, [])
        buffer.append(event)
        if len(buffer) >= self._flush_every:
            self._write(key)

    def flush(self) -> None:
        for key in list(self._buffers):
            self._write(key)

    def _write(self, key: tuple[str, dg.AssetKey]) -> None:
        events = self._buffers.pop(key, [])
        if not events:
            return
        batch_id = compat.new_event_batch_id()
        for i, event in enumerate(events):
            compat.log_step_event(self._context, event, batch_id, is_end=i == len(events) - 1)


def write_runless(instance: dg.DagsterInstance, events: Sequence[Event]) -> None:
    """Asset events reported outside any run (a sensor's), one batch insert per asset key and type
    instead of one write each (~7 ms an event through `report_runless_asset_event`)."""
    groups: dict[tuple[str, dg.AssetKey], list[Event]] = {}
    for event in events:
        groups.setdefault((type(event).__name__, event.asset_key), []).append(event)
    start = time.time()
    for group in groups.values():
        compat.store_runless_events(instance, group, DistinctMilliseconds.spaced(len(group), start))
