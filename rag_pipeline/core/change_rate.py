"""How often a page changes, estimated from what its crawls saw.

Each crawl after the first is one observation: over the interval since the previous crawl, the
page's content changed or it did not. Intervals are irregular (cadences move, pushes fail, a
person recrawls by hand), and a crawl sees only *whether* the page changed, never how many times.
Under a Poisson model of rate λ, an interval t holds no change with probability e^(−λt), so the
likelihood of the observations is

    L(λ) = Π_changed (1 − e^(−λ·tᵢ)) · Π_unchanged e^(−λ·tⱼ)

and its maximum (Cho & Garcia-Molina, "Estimating frequency of change", ACM TOIT 2003, the
irregular-access estimator) solves Σ_changed tᵢ / (e^(λ·tᵢ) − 1) = Σ_unchanged tⱼ. Counting changes
over the total time instead (changes / Σt) underestimates λ whenever an interval holds more than
one change, and the more the longer the intervals.

Alone, the maximum is 0 for a page never seen changing and ∞ for one seen changing at every
crawl. A prior fixes both: ``weight`` pseudo-observations, each over the prior's mean time between
changes 1/λ₀ and changed with the probability 1 − 1/e that a page of rate λ₀ would show there
(λ₀: the page's URL pattern's pages, else its rule's interval). The estimate is the posterior mode.
Counted in observations, not in seconds, the prior weighs as much for a page crawled every 15
minutes as for one crawled monthly: a new page starts at λ₀, one observation moves it only so far,
and after n crawls the prior counts for weight / (weight + n) of the evidence (a prior in seconds,
from a pattern of mostly static pages, would drown a busy page's data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Pseudo-changes the prior counts for: two, so one observation cannot swing an estimate.
PRIOR_WEIGHT = 2.0
# Rates are searched within these bounds (per second): one change in ~30,000 years to one a millisecond.
_LOW, _HIGH = 1e-12, 1e3


@dataclass(frozen=True)
class Observation:
    interval_s: float      # since the previous crawl of the page
    changed: bool          # the content differed from the previous crawl's


@dataclass(frozen=True)
class Prior:
    rate: float                    # changes per second expected of a page of this pattern
    weight: float = PRIOR_WEIGHT   # how many changes' worth of evidence that expectation counts for

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"a prior rate must be positive and finite, not {self.rate}")
        if self.weight <= 0:
            raise ValueError(f"a prior weight must be positive, not {self.weight}")


def estimate(observations: Sequence[Observation], prior: Prior) -> float:
    """Changes per second: the posterior mode of λ given the observations and the prior."""
    intervals = np.array([o.interval_s for o in observations], dtype=float).reshape(1, -1)
    changed = np.array([o.changed for o in observations], dtype=bool).reshape(1, -1)
    return float(estimate_many(intervals, changed, np.array([prior.rate]), prior.weight)[0])


def estimate_many(intervals_s: np.ndarray, changed: np.ndarray, prior_rates: np.ndarray,
                  weight: float = PRIOR_WEIGHT) -> np.ndarray:
    """`estimate` for many pages at once: row i holds page i's observations (intervals ≤ 0 or NaN
    are padding), ``prior_rates[i]`` its prior. Bisection in log space, all rows together."""
    t = np.nan_to_num(np.asarray(intervals_s, dtype=float), nan=0.0)
    real = t > 0
    hit = np.asarray(changed, dtype=bool) & real
    tau = 1 / np.asarray(prior_rates, dtype=float)          # the pseudo-observations' interval
    p0 = -math.expm1(-1.0)                                  # … and the share of them that changed
    right = np.where(real & ~hit, t, 0.0).sum(axis=1) + weight * (1 - p0) * tau
    t_hit = np.where(hit, t, 0.0)

    def slope(rate: np.ndarray) -> np.ndarray:
        """d/dλ of the log posterior, per row: strictly decreasing in λ, so one root."""
        x = np.minimum(rate[:, None] * t_hit, 700.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(hit, t_hit / np.expm1(np.where(hit, x, 1.0)), 0.0)
        pseudo = weight * p0 * tau / np.expm1(np.minimum(rate * tau, 700.0))
        return terms.sum(axis=1) + pseudo - right

    low = np.full(len(t), math.log(_LOW))
    high = np.full(len(t), math.log(_HIGH))
    for _ in range(64):             # the log range (~35) halved 64 times: exact to double precision
        mid = (low + high) / 2
        up = slope(np.exp(mid)) > 0
        low = np.where(up, mid, low)
        high = np.where(up, high, mid)
    return np.exp((low + high) / 2)


def pattern_rate(estimates: Sequence[float], fallback: float) -> float:
    """The prior for a URL pattern: the geometric mean of its pages' estimates (rates spread over
    orders of magnitude: an arithmetic mean would be one busy page's), else the fallback."""
    rates = [r for r in estimates if r > 0 and math.isfinite(r)]
    if not rates:
        return fallback
    return math.exp(sum(math.log(r) for r in rates) / len(rates))
