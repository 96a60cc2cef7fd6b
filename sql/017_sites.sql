-- Sites: what an operator declares (a component under rag_pipeline/defs/sites/), and what each
-- reading of its robots.txt and sitemaps found. A page belongs to one site; `site` NULL is the
-- catch-all, which keeps the asset keys and partition set of the deployments before sites.
CREATE TABLE sites (
    name               text PRIMARY KEY,
    shards             smallint NOT NULL DEFAULT 1,
    scope              text[] NOT NULL DEFAULT '{}',   -- include globs as applied (default: start hosts)
    exclude            text[] NOT NULL DEFAULT '{}',
    max_pages          integer NOT NULL,
    discover_every     interval NOT NULL,
    link_depth         smallint NOT NULL DEFAULT 0,         -- link discovery: hops followed (0: off)
    boilerplate        jsonb NOT NULL DEFAULT '[]',         -- the site's own rules, added to the deployment's
    crawler            text,                                -- local or crawlbase; NULL: CRAWLER
    declared_at        timestamptz NOT NULL DEFAULT now(),   -- first seen by the discovery sensor
    next_discovery_at  timestamptz                          -- NULL: read at once
);

-- One row per reading (a discovery run): its figures and what went wrong, for `site show`,
-- `status` and the next reading. Pruned with the other history (retention).
CREATE TABLE site_readings (
    reading_id   bigserial PRIMARY KEY,
    site         text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    complete     boolean,              -- every file read: only then are missing URLs `gone`
    counts       jsonb NOT NULL DEFAULT '{}',
    errors       text[] NOT NULL DEFAULT '{}',
    run_id       text
);
CREATE INDEX site_readings_newest ON site_readings (site, reading_id DESC);

-- What a reading listed, staged a batch at a time (COPY) while the files stream in, then applied
-- to `pages` in one transaction and deleted. Unlogged: a crash loses only a reading in progress.
CREATE UNLOGGED TABLE site_listing (
    reading_id  bigint NOT NULL,
    page_id     uuid NOT NULL,
    url         text NOT NULL,          -- normalized
    crawl_url   text NOT NULL,          -- as listed (scheme kept)
    lastmod     timestamptz,
    shard       smallint,
    every       interval NOT NULL       -- the site's cadence rule for it
);
CREATE INDEX site_listing_reading ON site_listing (reading_id, page_id);

ALTER TABLE pages ADD COLUMN site text;
ALTER TABLE pages ADD COLUMN shard smallint;
ALTER TABLE pages ADD COLUMN discovered_by text;        -- sitemap, link, seed, redirect, delivery
ALTER TABLE pages ADD COLUMN listed_at timestamptz;     -- since when its site's sitemaps list it
ALTER TABLE pages ADD COLUMN sitemap_lastmod timestamptz;
ALTER TABLE pages ADD COLUMN unlisted_at timestamptz;   -- gone from the sitemaps that listed it
ALTER TABLE pages ADD COLUMN link_depth smallint;       -- link discovery: hops from a start page
CREATE INDEX pages_site ON pages (site, page_id);

ALTER TABLE pushes DROP CONSTRAINT pushes_reason_check;
ALTER TABLE pushes ADD CONSTRAINT pushes_reason_check
    CHECK (reason IN ('seed', 'schedule', 'manual', 'discovery')) NOT VALID;
ALTER TABLE pushes VALIDATE CONSTRAINT pushes_reason_check;
