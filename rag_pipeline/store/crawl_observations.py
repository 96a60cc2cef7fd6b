"""What the adaptive cadence reads and writes: crawl observations and each page's derived cadence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import psycopg


@dataclass(frozen=True)
class Scheduled:
    """A live page on the recrawl schedule, with its newest observations (newest first)."""
    page_id: UUID
    url: str
    source: str                    # default (adaptable), seed, manual
    every: timedelta
    change_rate: float | None
    intervals_s: list[float]
    changed: list[bool]
    site: str | None = None        # None: the catch-all (the deployment's rules)


def scheduled_pages(conn: psycopg.Connection, history: int) -> list[Scheduled]:
    """Every live page the recrawl sensor schedules (not aliases, not tombstones), each with its
    ``history`` newest observations. One query; at 100k pages a few seconds, once per refresh."""
    rows = conn.execute(
        "SELECT p.page_id, p.url, p.cadence_source, p.recrawl_every, p.change_rate,"
        "       coalesce(o.intervals, '{}'), coalesce(o.changed, '{}'), p.site"
        " FROM pages p LEFT JOIN LATERAL ("
        "   SELECT array_agg(interval_s ORDER BY crawled_at DESC) AS intervals,"
        "          array_agg(changed ORDER BY crawled_at DESC) AS changed"
        "   FROM (SELECT interval_s, changed, crawled_at FROM crawl_observations c"
        "         WHERE c.page_id = p.page_id ORDER BY crawled_at DESC LIMIT %s) newest) o ON true"
        " WHERE p.alias_of IS NULL AND p.deleted_at IS NULL AND p.cadence_source IS NOT NULL"
        "   AND p.recrawl_every IS NOT NULL",
        (history,),
    ).fetchall()
    return [Scheduled(*r) for r in rows]


def set_cadences(conn: psycopg.Connection, updates: Sequence[tuple[UUID, float, float, str]],
                 leased_within: timedelta) -> int:
    """(page_id, interval_s, change_rate, why) for adaptable pages: the next crawl moves to the last
    crawl + the new interval (not before now). A page claimed for a push whose result is not recorded
    yet (next crawl within ``leased_within``) keeps its slot: its push run reschedules it.

    "Now" is the clock at the row, not the transaction's start: a refresh is one long transaction,
    and a page recrawl_sensor claims while it runs has its lease measured from the claim."""
    if not updates:
        return 0
    return conn.execute(
        "UPDATE pages p SET recrawl_every = make_interval(secs => u.every_s), change_rate = u.rate,"
        "   cadence_why = u.why, cadence_updated_at = now(),"
        "   next_crawl_at = CASE WHEN p.next_crawl_at > clock_timestamp() + %s"
        "     THEN greatest(clock_timestamp(),"
        "                   coalesce(p.last_crawled_at, p.first_seen_at) + make_interval(secs => u.every_s))"
        "     ELSE p.next_crawl_at END"
        " FROM unnest(%s::uuid[], %s::float8[], %s::float8[], %s::text[]) AS u(page_id, every_s, rate, why)"
        " WHERE p.page_id = u.page_id AND p.cadence_source = 'default'",
        (leased_within, [u[0] for u in updates], [u[1] for u in updates], [u[2] for u in updates],
         [u[3] for u in updates]),
    ).rowcount


def record_estimates(conn: psycopg.Connection, estimates: Sequence[tuple[UUID, float]]) -> None:
    """The change rate of pages whose cadence is fixed (shown by cadence show, and priors)."""
    if estimates:
        conn.execute(
            "UPDATE pages p SET change_rate = u.rate, cadence_updated_at = now()"
            " FROM unnest(%s::uuid[], %s::float8[]) AS u(page_id, rate) WHERE p.page_id = u.page_id",
            ([e[0] for e in estimates], [e[1] for e in estimates]))


@dataclass(frozen=True)
class Observed:
    crawled_at: datetime
    interval_s: float
    changed: bool


def observations_of(conn: psycopg.Connection, page_url: str, limit: int) -> tuple[int, int, list[Observed]]:
    """(observations, of which changed, the newest ``limit``) of a page, for cadence show."""
    total, changed = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE changed) FROM crawl_observations c JOIN pages p USING (page_id)"
        " WHERE p.url = %s", (page_url,)).fetchone()
    rows = conn.execute(
        "SELECT c.crawled_at, c.interval_s, c.changed FROM crawl_observations c JOIN pages p USING (page_id)"
        " WHERE p.url = %s ORDER BY c.crawled_at DESC LIMIT %s", (page_url, limit)).fetchall()
    return total, changed, [Observed(*r) for r in rows]


def record_budget(conn: psycopg.Connection, budget_per_day: float, planned_per_day: float,
                  adaptive_pages: int, note: str) -> None:
    """The newest refresh's allocation (what the `index` asset shows between refreshes)."""
    conn.execute(
        "INSERT INTO crawl_budget (refreshed_at, budget_per_day, planned_per_day, adaptive_pages, note)"
        " VALUES (now(), %s, %s, %s, %s) ON CONFLICT (only_row) DO UPDATE SET refreshed_at = now(),"
        " budget_per_day = excluded.budget_per_day, planned_per_day = excluded.planned_per_day,"
        " adaptive_pages = excluded.adaptive_pages, note = excluded.note",
        (budget_per_day, planned_per_day, adaptive_pages, note))


def schedule_figures(conn: psycopg.Connection, since: datetime, until: datetime) -> dict[str, float | int | str]:
    """The recrawl schedule for the `index` asset: spread of estimated change rates and of
    cadences over the live pages, pushes planned a day and made in the period, the budget."""
    rates, everies, planned = conn.execute(
        "SELECT percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP (ORDER BY change_rate * 86400)"
        "         FILTER (WHERE change_rate IS NOT NULL),"
        "       percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP (ORDER BY extract(epoch FROM recrawl_every) / 3600),"
        "       coalesce(sum(86400 / nullif(extract(epoch FROM recrawl_every), 0)), 0)"
        " FROM pages WHERE alias_of IS NULL AND deleted_at IS NULL AND recrawl_every IS NOT NULL"
    ).fetchone()
    rates, everies = rates or [0.0] * 3, everies or [0.0] * 3
    pushed = conn.execute("SELECT count(*) FROM pushes WHERE pushed_at >= %s AND pushed_at < %s",
                          (since, until)).fetchone()[0]
    budget = conn.execute("SELECT budget_per_day, adaptive_pages, note FROM crawl_budget").fetchone()
    figures: dict[str, float | int] = {}
    for name, values, digits in (("change_rate_{}_per_day", rates, 4), ("cadence_{}_hours", everies, 2)):
        for q, value in zip(("p10", "p50", "p90"), values):
            figures[name.format(q)] = round(float(value), digits)
    figures.update(pushes_planned_per_day=round(float(planned), 1), pushes_in_period=pushed)
    if budget is None:
        # No refresh has allocated a budget yet: a 0 beside the pushes planned would read as "no
        # budget"; the figure is left out (a gap in its plot) and the note says why.
        return {**figures, "crawl_budget_note": NO_BUDGET_YET}
    return {**figures, "crawl_budget_per_day": round(float(budget[0]), 1), "pages_adaptive": budget[1],
            "crawl_budget_note": budget[2]}


NO_BUDGET_YET = ("no budget allocated yet: the cadences are the rules' own until the first cadence_refresh run "
                 "(recrawl_sensor requests one every CADENCE_REFRESH_S)")
