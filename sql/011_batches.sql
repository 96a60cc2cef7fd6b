-- Each batch a sensor leased pages to, and how its run is doing. The run's worker beats here while
-- it works, which is how a run whose worker is gone (killed, its machine rebooted) is told from a
-- slow one; the reconciler on every delivery_sensor tick frees the pages of a batch whose run is
-- gone, ended, or was never launched.
CREATE TABLE batches (
    batch_key     text PRIMARY KEY,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    run_id        text,                       -- set by the run when its op starts
    heartbeat_at  timestamptz,                -- the run's worker, every BATCH_HEARTBEAT_S
    ended_at      timestamptz,
    end_reason    text
);
CREATE INDEX batches_open ON batches (requested_at) WHERE ended_at IS NULL;
