"""Adaptive recrawl cadence against fixed cadence per rule, on a simulated clock (no network).

10,000 pages with URL patterns (pricing, blog, docs, changelog archive, others) and change
behaviour drawn from a mix: a few change a few times an hour, many about weekly, many never, some
in bursts (quiet for weeks, then several changes within a day). Patterns and behaviour correlate as
they do on real sites, imperfectly: most blog posts never change after publication, a few docs
pages change hourly. Crawled for 90 simulated days under
  (a) fixed: every page at its rule's interval (what the project did before);
  (b) adaptive: each page's interval from its estimated change rate (rag_pipeline.core), within
      its rule's floor and ceiling, no budget set: the default CADENCE_BUDGET_SHARE of what the
      rules' intervals would push, allocated where it buys the most freshness;
  (c) adaptive at equal budget: the same estimates, intervals allocated to minimize mean
      staleness for as many pushes as (a) made.
The estimator sees only what a crawl sees: whether the page changed since the previous crawl.
Priors per URL pattern are pooled from the pattern's pages every 6 simulated hours, as the
recrawl sensor does. Staleness is the fraction of time the index differs from the live page;
the age of an unseen change is how long after it happened the next crawl saw it.

    .venv/bin/python -m bench.cadence_sim [--pages 10000] [--days 90] [--seed 7]

Last line: CADENCE pushes_ratio=… staleness_ratio=… at_equal_budget_staleness_ratio=…
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from rag_pipeline.core.change_rate import PRIOR_WEIGHT, estimate_many, pattern_rate
from rag_pipeline.core.recrawl_policy import BUDGET_SHARE, allocate, implied_budget, intervals_at_price

H, D = 3600.0, 86400.0
STEP_S = 900.0                 # the recrawl sensor's tick, coarsened: 15 simulated minutes
REFRESH_S = 6 * H              # priors pooled and the budget reallocated this often
HISTORY = 32                   # observations kept per page (as crawl_observations keeps)
MIN_OBS_FOR_PRIOR = 5

# Patterns as config/cadence.yaml ships them: (share of pages, every, floor, ceiling, behaviour mix).
PATTERNS = {
    "pricing": (0.01, 1 * H, 15 * 60, 1 * D, {"hourly": 0.7, "weekly": 0.3}),
    "blog": (0.20, 1 * D, 1 * H, 30 * D, {"never": 0.75, "weekly": 0.15, "bursty": 0.10}),
    "docs": (0.50, 7 * D, 1 * D, 60 * D, {"weekly": 0.45, "never": 0.45, "bursty": 0.08, "hourly": 0.02}),
    "archive": (0.05, 30 * D, 7 * D, 90 * D, {"never": 0.95, "weekly": 0.05}),
    "other": (0.24, 7 * D, 1 * D, 60 * D, {"weekly": 0.35, "never": 0.32, "bursty": 0.30, "hourly": 0.03}),
}


@dataclass
class Population:
    pattern: np.ndarray            # index into PATTERNS
    every: np.ndarray
    floor: np.ndarray
    ceiling: np.ndarray
    changes: list[np.ndarray]      # sorted change times per page
    behaviour: np.ndarray


def population(n: int, days: float, rng: np.random.Generator) -> Population:
    names = list(PATTERNS)
    shares = np.array([PATTERNS[p][0] for p in names])
    pattern = rng.choice(len(names), size=n, p=shares / shares.sum())
    horizon = days * D
    changes, behaviour = [], []
    for k in pattern:
        mix = PATTERNS[names[k]][4]
        kind = rng.choice(list(mix), p=np.array(list(mix.values())) / sum(mix.values()))
        behaviour.append(kind)
        if kind == "never":
            times = np.empty(0)
        elif kind in ("hourly", "weekly"):
            # log-normal around a few an hour / one a week: rates spread over an order of magnitude
            median = 2 / H if kind == "hourly" else 1 / (7 * D)
            rate = median * np.exp(rng.normal(0, 0.6))
            count = rng.poisson(rate * horizon)
            times = np.sort(rng.uniform(0, horizon, count))
        else:   # bursts: about one a month, each 3–8 changes within a day
            starts = rng.uniform(0, horizon, rng.poisson(horizon / (30 * D)))
            times = np.sort(np.concatenate(
                [s + rng.uniform(0, D, rng.integers(3, 9)) for s in starts] or [np.empty(0)]))
            times = times[times < horizon]
        changes.append(times)
    every = np.array([PATTERNS[names[k]][1] for k in pattern])
    floor = np.array([PATTERNS[names[k]][2] for k in pattern])
    ceiling = np.array([PATTERNS[names[k]][3] for k in pattern])
    return Population(pattern, every, floor, ceiling, changes, np.array(behaviour))


def measure(pop: Population, crawls: list[np.ndarray], horizon: float) -> dict:
    """Staleness per page, ages of unseen changes, pushes, from change and crawl times."""
    stale_fraction, ages = [], []
    for changes, crawled in zip(pop.changes, crawls):
        crawled = np.sort(crawled)
        ends = np.append(crawled[1:], horizon)
        # first change after each crawl, stale from it until the next crawl
        first = np.searchsorted(changes, crawled, side="right")
        first_at = np.where(first < len(changes), changes[np.minimum(first, len(changes) - 1)]
                            if len(changes) else horizon, horizon)
        stale = np.clip(ends - first_at, 0, None).sum()
        stale_fraction.append(stale / horizon)
        if len(changes):
            seen_by = np.searchsorted(crawled, changes, side="left")
            seen_at = np.where(seen_by < len(crawled), crawled[np.minimum(seen_by, len(crawled) - 1)], horizon)
            ages.append(seen_at - changes)
    ages = np.concatenate(ages) if ages else np.empty(0)
    return {"pushes": int(sum(len(c) for c in crawls)), "staleness": float(np.mean(stale_fraction)),
            "age_mean_h": float(ages.mean() / H) if ages.size else 0.0,
            "age_p95_h": float(np.percentile(ages, 95) / H) if ages.size else 0.0,
            "stale_by_page": np.array(stale_fraction)}


def fixed(pop: Population, horizon: float) -> list[np.ndarray]:
    return [np.arange(0.0, horizon, every) for every in pop.every]


def adaptive(pop: Population, horizon: float, budget_per_day: float) -> list[np.ndarray]:
    """The recrawl sensor's policy: estimates after every crawl, priors and the allocation every
    REFRESH_S; between two allocations a page is rescheduled at the last one's price."""
    n = len(pop.every)
    last = np.zeros(n)
    obs_t = np.zeros((n, HISTORY))
    obs_c = np.zeros((n, HISTORY), dtype=bool)
    count = np.zeros(n, dtype=int)
    prior = 1 / pop.every                      # before any page of a pattern is known: its rule
    rate = prior.copy()
    plan = allocate(rate, pop.floor, pop.ceiling, budget_per_day)
    price, interval = plan.price, plan.intervals_s
    next_at = interval.copy()
    crawls: list[list[float]] = [[0.0] for _ in range(n)]   # every page seeded at t=0
    seen = np.zeros(n, dtype=int)                            # changes seen up to the last crawl
    next_refresh = REFRESH_S
    t = STEP_S
    while t < horizon:
        if t >= next_refresh:
            next_refresh += REFRESH_S
            for k in np.unique(pop.pattern):
                members = (pop.pattern == k)
                known = members & (count >= MIN_OBS_FOR_PRIOR)
                prior[members] = pattern_rate(rate[known].tolist(), 1 / pop.every[members][0])
            plan = allocate(rate, pop.floor, pop.ceiling, budget_per_day)
            price, interval = plan.price, plan.intervals_s
            next_at = np.maximum(last + interval, t)
        due = np.flatnonzero(next_at <= t)
        if due.size:
            upto = np.array([np.searchsorted(pop.changes[i], t, side="right") for i in due])
            changed = upto > seen[due]
            seen[due] = upto
            slot = count[due] % HISTORY
            obs_t[due, slot] = t - last[due]
            obs_c[due, slot] = changed
            count[due] += 1
            last[due] = t
            rate[due] = estimate_many(obs_t[due], obs_c[due], prior[due], PRIOR_WEIGHT)
            interval[due] = intervals_at_price(rate[due], pop.floor[due], pop.ceiling[due], price)
            next_at[due] = t + interval[due]
            for i in due:
                crawls[i].append(t)
        t += STEP_S
    return [np.array(c) for c in crawls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--share", type=float, default=BUDGET_SHARE,
                        help="(b): the budget as a share of what the rules' intervals push (CADENCE_BUDGET_SHARE)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    horizon = args.days * D
    pop = population(args.pages, args.days, rng)
    kinds, counts = np.unique(pop.behaviour, return_counts=True)
    print(f"{args.pages} pages, {args.days:g} days; behaviour: "
          + ", ".join(f"{k} {c}" for k, c in zip(kinds, counts))
          + f"; {sum(len(c) for c in pop.changes):,} changes")
    results = {}
    for name, run in (("fixed", lambda: fixed(pop, horizon)),
                      ("adaptive", lambda: adaptive(pop, horizon, implied_budget(pop.every, args.share))),
                      ("equal_budget", None)):
        started = time.perf_counter()
        if name == "equal_budget":
            crawls = adaptive(pop, horizon, budget_per_day=results["fixed"]["pushes"] / args.days)
        else:
            crawls = run()
        results[name] = measure(pop, crawls, horizon)
        r = results[name]
        print(f"{name:>13}: pushes {r['pushes']:>9,} ({r['pushes'] / args.days:,.0f}/day)  "
              f"staleness {r['staleness']:.4f}  unseen change age mean {r['age_mean_h']:.1f} h, "
              f"p95 {r['age_p95_h']:.1f} h  ({time.perf_counter() - started:.1f} s)")
    print("mean staleness by behaviour (fixed / adaptive / equal budget):")
    for kind in kinds:
        mask = pop.behaviour == kind
        print(f"  {kind:>7}: " + " / ".join(f"{results[n]['stale_by_page'][mask].mean():.3f}"
                                             for n in ("fixed", "adaptive", "equal_budget")))
    base = results["fixed"]
    print(f"CADENCE pushes_ratio={results['adaptive']['pushes'] / base['pushes']:.3f} "
          f"staleness_ratio={results['adaptive']['staleness'] / base['staleness']:.3f} "
          f"at_equal_budget_staleness_ratio={results['equal_budget']['staleness'] / base['staleness']:.3f}")


if __name__ == "__main__":
    main()
