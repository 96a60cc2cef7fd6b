-- Batch runs (issue 10): one Dagster run applies many changed pages. A page is in at most one
-- live batch: `batch_key` names the batch that leased it and `leased_until` when the lease ends
-- (a run that never starts or dies frees its pages then). `text_chars` is the normalized length
-- of a queued delivery, measured by routing, so the sensor can bound the tokens of a batch.
ALTER TABLE pages ADD COLUMN batch_key text;
ALTER TABLE pages ADD COLUMN leased_until timestamptz;
ALTER TABLE deliveries ADD COLUMN text_chars integer;
-- The sensor's view of the work: queued deliveries, newest per page.
CREATE INDEX deliveries_queued_work ON deliveries (page_url, id DESC) INCLUDE (attempts, text_chars)
    WHERE outcome = 'queued';
