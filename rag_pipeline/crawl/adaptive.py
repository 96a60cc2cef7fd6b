"""Re-derives the cadence of every adaptable page from its crawl observations (a `cadence_refresh`
run, which recrawl_sensor requests every CADENCE_REFRESH_S): the estimate (core.change_rate), the budget's allocation
(core.recrawl_policy), and each page's next crawl moved to its last crawl + its new interval."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import psycopg

from rag_pipeline.core.change_rate import estimate_many, pattern_rate
from rag_pipeline.core.recrawl_policy import DAY_S, allocate, explain_allocated, implied_budget, Bounds
from rag_pipeline.crawl.cadence_rules import format_interval
from rag_pipeline.crawl.site_cadences import SiteRules
from rag_pipeline.settings import Settings
from rag_pipeline.store import crawl_observations

#: A page's estimate joins its pattern's prior once it rests on this many observations.
MIN_OBS_FOR_PRIOR = 5
#: Intervals that moved less than this are not rewritten (bounded writes at every refresh).
REWRITE_ABOVE = 0.02


@dataclass(frozen=True)
class Refreshed:
    pages: int                 # live pages on the schedule
    adaptive: int              # of which the cadence adapts
    rewritten: int             # cadences written this refresh
    budget_per_day: float
    planned_per_day: float     # pushes a day the cadences add up to (fixed ones included)
    note: str                  # the allocation's remark, if the budget could not be met as asked

    def summary(self) -> str:
        return (f"cadences: {self.adaptive} of {self.pages} page(s) adaptive, {self.rewritten} rewritten; "
                f"{self.planned_per_day:.0f} pushes/day planned for a budget of {self.budget_per_day:.0f}"
                + (f" ({self.note})" if self.note else ""))


def refresh(conn: psycopg.Connection, rules: SiteRules, settings: Settings, leased_within: timedelta) -> Refreshed:
    """Each page by its own site's rules (the deployment's for the catch-all)."""
    with conn.transaction():
        pages = crawl_observations.scheduled_pages(conn, settings.cadence_history)
        if not pages:
            budget = settings.crawl_budget_per_day or 0.0
            return Refreshed(0, 0, 0, budget, 0.0, "")
        rule_of = [rules.rule_for(p.url, p.site) for p in pages]
        sensor_floor = float(settings.recrawl_interval_s)
        adaptable = np.array([p.source == "default" and rules.of(p.site).adaptive and r.adapt
                              for p, r in zip(pages, rule_of)])

        # Priors: each pattern's pages that rest on enough observations (their last estimates). A
        # pattern is a site's: two sites' `*/blog/*` pages change at their own pace.
        pattern = [(p.site, r.label) for p, r in zip(pages, rule_of)]
        by_rule: dict[tuple, list[float]] = defaultdict(list)
        for p, key in zip(pages, pattern):
            if p.change_rate and len(p.intervals_s) >= MIN_OBS_FOR_PRIOR:
                by_rule[key].append(p.change_rate)
        pooled = {key: pattern_rate(rates, 0.0) for key, rates in by_rule.items()}   # once a pattern
        priors = np.array([pooled.get(key) or 1 / r.every.total_seconds() for key, r in zip(pattern, rule_of)])
        width = max(1, max(len(p.intervals_s) for p in pages))
        intervals = np.zeros((len(pages), width))
        changed = np.zeros((len(pages), width), dtype=bool)
        for i, p in enumerate(pages):
            intervals[i, :len(p.intervals_s)] = p.intervals_s
            changed[i, :len(p.changed)] = p.changed
        rates = estimate_many(intervals, changed, priors)

        current = np.array([p.every.total_seconds() for p in pages])
        nominal = np.where(adaptable, [r.every.total_seconds() for r in rule_of], current)
        budget = settings.crawl_budget_per_day or implied_budget(nominal, settings.cadence_budget_share)
        fixed_spend = float(np.sum(DAY_S / current[~adaptable]))
        idx = np.flatnonzero(adaptable)
        floors = np.array([max(rule_of[i].floor.total_seconds(), sensor_floor) for i in idx])
        ceilings = np.maximum(np.array([rule_of[i].ceiling.total_seconds() for i in idx]), floors)
        source = ("CRAWL_BUDGET_PER_DAY" if settings.crawl_budget_per_day
                  else f"CADENCE_BUDGET_SHARE {settings.cadence_budget_share:g} of what the rules' intervals push")
        if not idx.size:
            # Nothing to allocate: saying "a budget of 0 for 721 planned" would contradict itself.
            crawl_observations.record_estimates(conn, [(p.page_id, float(r)) for p, r in zip(pages, rates)
                                            if _moved(p.change_rate, float(r))])
            note = ("no page has an adaptive cadence (each is fixed by its rule or set by hand): the budget "
                    "applies to adaptive pages only, and the pushes planned are the fixed cadences'")
            crawl_observations.record_budget(conn, fixed_spend, fixed_spend, 0, note)
            return Refreshed(len(pages), 0, 0, fixed_spend, fixed_spend, note)
        plan = allocate(rates[idx], floors, ceilings, max(budget - fixed_spend, 1e-9))
        updates = []
        for k, i in enumerate(idx):
            interval, rate, page = float(plan.intervals_s[k]), float(rates[i]), pages[i]
            if not _moved(current[i], interval) and not _moved(page.change_rate, rate):
                continue
            seen = len(page.intervals_s)
            prior = f"a prior of {priors[i] * DAY_S:.3g}/day ({'its pattern' if by_rule[pattern[i]] else 'its rule'})"
            # With no observation the rate is the prior's alone: assumed, never "estimated from 0".
            evidence = (f"Estimated {rate * DAY_S:.3g} changes/day from {seen} observation(s) "
                        f"({sum(page.changed)} changed) and {prior}" if seen else
                        f"No change observed yet (0 observations): {rate * DAY_S:.3g} changes/day assumed from {prior}")
            why = (f"{explain_allocated(rate, interval, plan.price, Bounds(floors[k], ceilings[k]))}. "
                   f"{evidence}; {_rule_name(page.site, rule_of[i].label)}: "
                   f"every {format_interval(rule_of[i].every)}, {format_interval(timedelta(seconds=floors[k]))}"
                   f"–{format_interval(timedelta(seconds=ceilings[k]))}; budget {budget:.0f} pushes/day ({source})")
            updates.append((page.page_id, interval, rate, why))
        rewritten = crawl_observations.set_cadences(conn, updates, leased_within)
        crawl_observations.record_estimates(conn, [(pages[i].page_id, float(rates[i])) for i in np.flatnonzero(~adaptable)
                                        if _moved(pages[i].change_rate, float(rates[i]))])
        planned = fixed_spend + plan.pushes_per_day()
        note = plan.note
        if fixed_spend >= budget:
            note = (f"the fixed cadences alone plan {fixed_spend:.0f} pushes/day, at or above the budget of "
                    f"{budget:.0f} ({source}): the adaptive pages are crawled at their rules' ceilings")
        crawl_observations.record_budget(conn, budget, planned, len(idx), note)
        return Refreshed(len(pages), len(idx), rewritten, budget, planned, note)


def _rule_name(site: str | None, label: str) -> str:
    return f"site {site}'s rule {label}" if site else f"rule {label}"


def _moved(before: float | None, now: float) -> bool:
    """Worth writing: new, or more than REWRITE_ABOVE away from what is stored."""
    return not before or abs(now / before - 1) > REWRITE_ABOVE
