-- Crawling: what we asked the crawler for (pushes), each page's own cadence, and redirects.

-- The URL as it was seeded (scheme and spelling kept): what gets pushed. `url` stays the
-- normalized identity; a loopback http:// site must not be crawled as https://.
ALTER TABLE pages ADD COLUMN crawl_url text;
-- Where the cadence came from: NULL (not assigned yet), default (cadence.yaml), seed, manual, redirect.
ALTER TABLE pages ADD COLUMN cadence_source text;
-- A redirect: this URL now answers with another page. Indexed under the target, never recrawled.
ALTER TABLE pages ADD COLUMN alias_of text;
ALTER TABLE pages ADD COLUMN redirected_at timestamptz;

-- Pages first seen through a delivery get a cadence from cadence.yaml on the next sensor tick.
UPDATE pages SET next_crawl_at = coalesce(last_crawled_at, first_seen_at) + recrawl_every
 WHERE next_crawl_at IS NULL;

-- The recrawl sensor's queue: due pages in order; aliases have next_crawl_at NULL.
CREATE INDEX pages_next_crawl ON pages (next_crawl_at) WHERE alias_of IS NULL;
CREATE INDEX pages_cadence_unassigned ON pages (first_seen_at) WHERE cadence_source IS NULL;

-- One row per push to the crawler, written before the push and finished with its result.
CREATE TABLE pushes (
    push_id      bigserial PRIMARY KEY,
    url          text NOT NULL,                  -- the URL pushed (as crawled)
    page_url     text NOT NULL,                  -- its normalized form
    reason       text NOT NULL CHECK (reason IN ('seed', 'schedule', 'manual')),
    crawler      text NOT NULL,                  -- crawlbase, local
    run_id       text,                           -- the Dagster run that pushed it, if any
    pushed_at    timestamptz NOT NULL DEFAULT now(),
    result       text NOT NULL DEFAULT 'pending' CHECK (result IN ('pending', 'pushed', 'failed')),
    rid          text,                           -- the crawler's request id (deliveries.rid)
    attempts     integer NOT NULL DEFAULT 0,
    error        text,
    finished_at  timestamptz
);
CREATE UNIQUE INDEX pushes_rid ON pushes (rid) WHERE rid IS NOT NULL;
CREATE INDEX pushes_page ON pushes (page_url, pushed_at);
-- Health: recent pushes whose delivery is still missing.
CREATE INDEX pushes_time ON pushes (pushed_at);
