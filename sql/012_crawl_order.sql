-- When each delivery's crawl was made (the time of our push, found by its rid; else its receipt),
-- and the newest crawl routed for each page: a crawler's late redelivery of an older crawl is
-- history (`superseded`), never applied over a newer one.
ALTER TABLE deliveries ADD COLUMN crawled_at timestamptz;
ALTER TABLE pages ADD COLUMN newest_crawl_at timestamptz;
