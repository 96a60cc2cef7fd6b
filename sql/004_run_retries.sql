-- A page run that fails is tried again later, a bounded number of times (delivery_failure_sensor
-- schedules it, delivery_sensor launches it). `attempts` counts failed runs of this delivery;
-- `retry_at` is when the next one is due (NULL: none scheduled, given up, or not retryable).
ALTER TABLE deliveries ADD COLUMN attempts smallint NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN retry_at timestamptz;
CREATE INDEX deliveries_retry_due ON deliveries (retry_at) WHERE retry_at IS NOT NULL;
-- A newer delivery taken as source supersedes older queued and failed ones of its page alike.
DROP INDEX deliveries_queued;
CREATE INDEX deliveries_pending ON deliveries (page_url, id) WHERE outcome IN ('queued', 'failed');
