-- Nothing grows without bound: the ledger's old rows roll up into daily totals per space, and a
-- retired space's vector table (and its HNSW index) is dropped after a retention period unless an
-- operator keeps it (`rag-pipeline space keep`).
CREATE TABLE embedding_ledger_daily (
    day              date NOT NULL,
    space_id         integer NOT NULL REFERENCES embedding_spaces (space_id),
    switches         bigint NOT NULL,
    chunks_total     bigint NOT NULL,
    chunks_embedded  bigint NOT NULL,
    tokens_embedded  bigint NOT NULL,
    tokens_reused    bigint NOT NULL,
    requests         bigint NOT NULL,
    PRIMARY KEY (day, space_id)
);

ALTER TABLE embedding_spaces
    ADD COLUMN retired_at timestamptz,
    ADD COLUMN keep_table boolean NOT NULL DEFAULT false,
    ADD COLUMN table_dropped_at timestamptz;
-- A space retired before this migration starts its retention now.
UPDATE embedding_spaces SET retired_at = now() WHERE status = 'retired';
