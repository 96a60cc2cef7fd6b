-- Re-chunks at site scale (issue 44).
--   rechunks   one row per chunker signature a re-chunk was started for: its plan (sampled when
--              recorded by a sensor tick or a run), and when something last worked on it. While a
--              re-chunk is under way (seen_at recent), the rows it has left to write count in the
--              bulk-load policy as a delivery backlog does: the search indexes make way for a
--              re-chunk that rewrites most rows, and stay for one that rewrites few.
CREATE TABLE rechunks (
    signature     text PRIMARY KEY,
    planned_at    timestamptz NOT NULL DEFAULT now(),
    seen_at       timestamptz NOT NULL DEFAULT now(),
    pages         bigint NOT NULL,       -- pages outdated when planned
    rows_written  bigint NOT NULL,       -- vector rows the re-chunk of those pages writes (estimated)
    plan          jsonb NOT NULL
);

-- When a batch's run started on it: the rates a plan's time estimate is measured from.
ALTER TABLE batches ADD COLUMN started_at timestamptz;

-- A run's ledger rows, read by run (its batch's rates, `make run`'s line for a batch).
CREATE INDEX embedding_ledger_run ON embedding_ledger (run_id);
