"""When a batch's pages are taken back: only when nothing will ever apply them."""

from __future__ import annotations

import pytest

from rag_pipeline.core.batch_verdict import BatchView, Limits, verdict

LIMITS = Limits(start_grace_s=120, heartbeat_timeout_s=60, startup_s=120)


def view(status, requested=10.0, started=None, beat=None) -> BatchView:
    return BatchView("k", requested, status, started, beat)


@pytest.mark.parametrize("status", ["SUCCESS", "FAILURE", "CANCELED"])
def test_an_ended_run_frees_what_it_still_holds(status):
    assert verdict(view(status, beat=1.0), LIMITS).action == "free"


def test_a_batch_without_a_run_waits_for_its_launch_then_is_freed():
    assert verdict(view(None, requested=30), LIMITS).action == "wait"
    lost = verdict(view(None, requested=121), LIMITS)
    assert lost.action == "free" and "no run" in lost.reason


def test_only_a_run_that_started_spends_its_pages_tries():
    assert verdict(view(None, requested=121), LIMITS).charge is False
    assert verdict(view("CANCELED", started=None), LIMITS).charge is False     # canceled in the queue
    assert verdict(view("FAILURE", started=5.0), LIMITS).charge is True
    assert verdict(view("STARTED", started=500.0, beat=100.0), LIMITS).charge is True


@pytest.mark.parametrize("status", ["QUEUED", "NOT_STARTED", "STARTING", "CANCELING"])
def test_a_run_not_started_yet_is_never_cut_short_however_long_it_waits(status):
    assert verdict(view(status, requested=10_000), LIMITS).action == "wait"


def test_a_started_run_is_failed_only_when_its_worker_went_silent():
    assert verdict(view("STARTED", started=900, beat=59), LIMITS).action == "wait"   # slow, but alive
    gone = verdict(view("STARTED", started=900, beat=61), LIMITS)
    assert gone.action == "fail" and "stopped beating" in gone.reason


def test_a_started_run_that_never_beat_is_failed_after_its_startup_allowance():
    assert verdict(view("STARTED", started=170), LIMITS).action == "wait"
    stuck = verdict(view("STARTED", started=181), LIMITS)
    assert stuck.action == "fail" and "never reached" in stuck.reason
    assert verdict(view("STARTED", started=None), LIMITS).action == "wait"
