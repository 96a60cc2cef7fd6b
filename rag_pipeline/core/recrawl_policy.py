"""Each page's recrawl interval from its estimated change rate, within its rule's floor and ceiling.

The intervals minimize the mean expected staleness over all pages for a number of pushes a day:
``CRAWL_BUDGET_PER_DAY``, else ``share`` (CADENCE_BUDGET_SHARE) of what the rules' own intervals
would push. For a page of rate λ crawled every I, the expected fraction of time the index differs
from the page is S = 1 − (1 − e^(−x)) / x with x = λ·I. Lagrange: each page's crawl frequency
f = 1/I rises until the freshness one more push buys, (1 − e^(−x)(1 + x)) / λ, falls to a price μ
common to all pages; μ is found by bisection so the frequencies add up to the budget (Cho &
Garcia-Molina, "Synchronizing a database to improve freshness", SIGMOD 2000). So a page that never
changes drifts to its ceiling, and its pushes go to the pages that do change. A page that changes
so fast no affordable interval keeps it fresh (μ·λ ≥ 1) is left at its ceiling too: its pushes buy
more freshness elsewhere. The rule's floor and ceiling are the operator's bounds on both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DAY_S = 86400.0
#: Without a budget, the adaptive pages share this part of what their rules' intervals would push:
#: chosen with bench/cadence_sim.py (half the pushes of fixed cadence, and less staleness).
BUDGET_SHARE = 0.4

# g(x) = 1 − e^(−x)(1 + x), increasing from 0 to 1: tabulated once to invert it by interpolation.
_X = np.logspace(-6, 3, 4000)
_G = -np.expm1(-_X) - _X * np.exp(-_X)


@dataclass(frozen=True)
class Bounds:
    floor_s: float
    ceiling_s: float

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError(f"need 0 < floor <= ceiling, not {self.floor_s} and {self.ceiling_s}")

    def clamp(self, interval_s: float) -> float:
        return min(max(interval_s, self.floor_s), self.ceiling_s)


def staleness(rate: float, interval_s: float) -> float:
    """Expected fraction of the time a page of this rate, crawled every interval_s, is stale."""
    x = rate * interval_s
    if x < 1e-9:
        return x / 2
    return 1 - (-math.expm1(-x)) / x


def implied_budget(intervals_s: Sequence[float], share: float) -> float:
    """Pushes a day when no budget is set: ``share`` of what crawling each page at its rule's
    interval would cost."""
    return share * float(np.sum(DAY_S / np.asarray(intervals_s, dtype=float)))


@dataclass(frozen=True)
class Allocation:
    intervals_s: np.ndarray
    price: float                 # μ: the freshness (seconds of it per second) one push must buy
    note: str                    # "" when the budget was met within the bounds

    def pushes_per_day(self) -> float:
        return float(np.sum(DAY_S / self.intervals_s))


def allocate(rates: Sequence[float], floors_s: Sequence[float], ceilings_s: Sequence[float],
             pushes_per_day: float) -> Allocation:
    """Intervals that minimize mean expected staleness for ``pushes_per_day`` pushes in all."""
    lam = np.maximum(np.asarray(rates, dtype=float), 1e-15)
    floor = np.asarray(floors_s, dtype=float)
    ceiling = np.asarray(ceilings_s, dtype=float)
    budget = pushes_per_day / DAY_S
    if lam.size == 0:
        return Allocation(lam, 0.0, "")
    if np.sum(1 / ceiling) >= budget:
        return Allocation(ceiling.copy(), math.inf,
                          f"the budget ({pushes_per_day:g}/day) is below what the rules' ceilings need "
                          f"({np.sum(DAY_S / ceiling):.0f}/day): every page at its ceiling")
    if np.sum(1 / floor) <= budget:
        return Allocation(floor.copy(), 0.0,
                          f"the budget ({pushes_per_day:g}/day) buys every page its floor "
                          f"({np.sum(DAY_S / floor):.0f}/day)")

    def intervals(price: float) -> np.ndarray:
        return intervals_at_price(lam, floor, ceiling, price)

    low, high = 1e-12, 1e12         # price bounds (seconds): spending falls as the price rises
    cheapest = intervals(low)
    if np.sum(1 / cheapest) <= budget:
        return Allocation(cheapest, low, f"spends {np.sum(DAY_S / cheapest):.0f} of the {pushes_per_day:g} pushes "
                                         "a day: more would buy no freshness (the pages barely change)")
    for _ in range(200):
        mid = math.sqrt(low * high)
        if np.sum(1 / intervals(mid)) > budget:
            low = mid
        else:
            high = mid
        if high / low < 1 + 1e-9:
            break
    chosen = intervals(high)
    # Spending jumps where a page too fast to keep fresh drops to its ceiling (and is steep just
    # before it): what the bisection leaves unspent goes, evenly in crawls a day, first to the
    # pages that dropped, else to every page not at its floor. More crawls never add staleness.
    leftover = budget - np.sum(1 / chosen)
    if leftover > 1e-9 * budget:
        dropped = high * lam >= 1
        eligible = dropped if dropped.any() else chosen > floor * (1 + 1e-9)
        if eligible.any():
            extra = leftover / eligible.sum()
            chosen = np.where(eligible, np.maximum(1 / (1 / chosen + extra), floor), chosen)
    return Allocation(chosen, high, "")


def intervals_at_price(rates: np.ndarray, floors_s: np.ndarray, ceilings_s: np.ndarray,
                       price: float) -> np.ndarray:
    """Each page's interval where one more push buys ``price`` of freshness (see `allocate`): how a
    page whose estimate moved between two allocations is rescheduled at the last one's price."""
    lam = np.maximum(np.asarray(rates, dtype=float), 1e-15)
    ceiling = np.asarray(ceilings_s, dtype=float)
    if math.isinf(price):
        return ceiling.copy()
    y = price * lam
    x = np.interp(np.minimum(y, _G[-1]), _G, _X)
    return np.clip(np.where(y < 1, x / lam, ceiling), np.asarray(floors_s, dtype=float), ceiling)


def explain_allocated(rate: float, interval_s: float, price: float, bounds: Bounds) -> str:
    """Why the budget gave this page this interval (for `cadence show`)."""
    if math.isinf(price):
        return "the crawl budget holds every page at its ceiling"
    if price * rate >= 1:
        return ("it changes faster than any interval the budget affords keeps it fresh: at the rule's "
                "ceiling, its pushes buy more freshness elsewhere")
    if interval_s <= bounds.floor_s:
        return "the crawl budget would crawl it more often: held at the rule's floor"
    if interval_s >= bounds.ceiling_s:
        return "the crawl budget would crawl it less often: held at the rule's ceiling"
    return "where one more push buys the freshness the budget's last push buys elsewhere"


def _human(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    for size, unit in ((DAY_S, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"
