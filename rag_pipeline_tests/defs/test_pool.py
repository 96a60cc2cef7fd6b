"""The `embedding_api` pool is enforced by the run queue (deploy/dagster.yaml: `granularity: run`),
and has its limit before the queue's first pass over a new instance, which reads the pools with
limits before it makes their rows: without it every queued batch run was launched at once."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml

from rag_pipeline.defs.index import batch_runs
from rag_pipeline.defs.index.assets import EMBEDDING_POOL

DEPLOYED = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml").read_text())


def test_the_deployed_instance_holds_runs_in_the_queue_for_a_pool_slot():
    assert DEPLOYED["concurrency"]["pools"] == {"default_limit": 2, "granularity": "run"}


def test_the_embedding_pool_has_its_limit_before_any_run_is_queued(monkeypatch):
    monkeypatch.setattr(batch_runs, "_pools_known", set())
    with dg.instance_for_test(overrides={"concurrency": DEPLOYED["concurrency"]}) as instance:
        storage = instance.event_log_storage
        assert EMBEDDING_POOL not in storage.get_concurrency_keys()
        batch_runs.ensure_pool_limit(instance)
        assert EMBEDDING_POOL in storage.get_concurrency_keys()
        assert storage.get_concurrency_info(EMBEDDING_POOL).slot_count == 2
        storage.set_concurrency_slots(EMBEDDING_POOL, 3)     # an operator's own limit is left alone,
        batch_runs._pools_known.clear()                     # also by a new process
        batch_runs.ensure_pool_limit(instance)
        assert storage.get_concurrency_info(EMBEDDING_POOL).slot_count == 3
