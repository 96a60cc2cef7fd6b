-- Adaptive recrawl cadence. Every routed crawl after a page's first is one observation: over the
-- interval since its previous crawl, did the content change? The recrawl sensor estimates each
-- page's change rate from its newest observations and derives the page's cadence from it.
ALTER TABLE pages ADD COLUMN crawl_hash text;            -- the newest routed crawl's content hash
ALTER TABLE pages ADD COLUMN change_rate double precision;   -- estimated changes per second
ALTER TABLE pages ADD COLUMN cadence_why text;           -- how the cadence was derived (cadence show)
ALTER TABLE pages ADD COLUMN cadence_updated_at timestamptz;

CREATE TABLE crawl_observations (
    page_id uuid NOT NULL REFERENCES pages (page_id) ON DELETE CASCADE,
    crawled_at timestamptz NOT NULL,
    interval_s double precision NOT NULL CHECK (interval_s > 0),
    changed boolean NOT NULL,
    PRIMARY KEY (page_id, crawled_at)
);

-- The newest allocation of the crawl budget (one row), for the `index` asset and `status`.
CREATE TABLE crawl_budget (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    refreshed_at timestamptz NOT NULL,
    budget_per_day double precision NOT NULL,
    planned_per_day double precision NOT NULL,
    adaptive_pages integer NOT NULL,
    note text NOT NULL DEFAULT ''
);
