"""A plan's time, at the pace batches measured side by side, and a re-chunk's backlog."""

import pytest

from rag_pipeline.core import run_rates
from rag_pipeline.core.bulk_load import rechunk_backlog


def test_batches_side_by_side_count_their_wall_time_once():
    # Two batches of 100 pages over the same 10 s, then one of 100 pages alone over 10 s.
    rates = run_rates.measure([(0, 10, 100, 1000), (0, 10, 100, 1000), (20, 30, 100, 0)])
    assert rates.pages_per_s == pytest.approx(300 / 20) and rates.tokens_per_s == pytest.approx(2000 / 20)
    assert run_rates.busy_seconds([(0, 10), (5, 12), (20, 21)]) == 13


def test_a_plan_takes_the_longer_of_its_pages_and_its_tokens():
    rates = run_rates.Rates(pages_per_s=10, tokens_per_s=100, batches=3)
    assert run_rates.estimate_s(rates, pages=100, tokens=100) == 10
    assert run_rates.estimate_s(rates, pages=100, tokens=5000) == 50
    assert run_rates.estimate_s(run_rates.Rates(10, 0, 1), pages=100, tokens=5000) == 10


def test_too_little_measured_gives_no_estimate():
    assert run_rates.measure([(0, 10, run_rates.MIN_PAGES_MEASURED - 1, 0)]) is None
    assert run_rates.measure([]) is None
    assert run_rates.estimate_s(None, 100, 100) is None


def test_a_rechunk_backlog_is_its_rows_in_the_share_of_pages_left():
    assert rechunk_backlog(planned_pages=100, rows_written=700, outdated_pages=50) == 350
    assert rechunk_backlog(100, 700, 0) == 0
    assert rechunk_backlog(100, 700, 400) == 700      # pages grew since: never more than planned
    assert rechunk_backlog(0, 700, 10) == 0
