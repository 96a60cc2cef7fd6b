-- Base schema: deliveries in, pages and chunks out, vectors addressed by the hash of their text.
CREATE EXTENSION IF NOT EXISTS vector;

-- One row per crawler delivery, written before the receiver answers 200.
CREATE TABLE deliveries (
    id               bigserial PRIMARY KEY,           -- receipt order
    rid              text NOT NULL UNIQUE,
    url              text NOT NULL,                   -- the delivered (final) URL
    pushed_url       text,                            -- the URL we asked for, where known
    crawler_status   integer,
    original_status  integer,
    content_type     text,
    body             bytea NOT NULL,                  -- as received, validated
    body_encoding    text NOT NULL CHECK (body_encoding IN ('gzip', 'identity')),
    received_at      timestamptz NOT NULL DEFAULT now(),
    page_url         text,                            -- normalized URL, set when routed
    processed_at     timestamptz,                     -- set by the delivery sensor
    outcome          text CHECK (outcome IN
                       ('queued', 'embedded', 'unchanged', 'deleted', 'skipped', 'superseded', 'failed')),
    applied_at       timestamptz,
    error            text
);
-- The sensor's queue: rows nobody routed yet.
CREATE INDEX deliveries_unrouted ON deliveries (id) WHERE processed_at IS NULL;
-- A run's work: the queued deliveries of one page.
CREATE INDEX deliveries_queued ON deliveries (page_url, id) WHERE outcome = 'queued';

CREATE TABLE embedding_spaces (
    space_id      serial PRIMARY KEY,
    model         text NOT NULL,
    dimensions    integer NOT NULL CHECK (dimensions BETWEEN 1 AND 16000),
    status        text NOT NULL CHECK (status IN ('building', 'active', 'retired')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    activated_at  timestamptz,
    UNIQUE (model, dimensions)
);
CREATE UNIQUE INDEX embedding_spaces_one_active ON embedding_spaces ((true)) WHERE status = 'active';

-- One row per normalized URL. The row outlives a 404: deleted_at marks the tombstone.
CREATE TABLE pages (
    page_id              uuid PRIMARY KEY,            -- UUIDv5 of url
    url                  text NOT NULL UNIQUE,        -- normalized
    source_text          text,                        -- normalized markdown, kept for re-chunking
    source_hash          text,                        -- newest content received
    source_delivery_id   bigint,
    indexed_hash         text,                        -- what chunks and vectors reflect
    applied_delivery_id  bigint,                      -- newest delivery whose effect search shows
    original_status      integer,
    first_seen_at        timestamptz NOT NULL DEFAULT now(),
    last_crawled_at      timestamptz,
    last_verified_at     timestamptz,
    last_changed_at      timestamptz,
    deleted_at           timestamptz,
    recrawl_every        interval NOT NULL DEFAULT interval '7 days',
    next_crawl_at        timestamptz,
    chunker_version      text
);

-- The chunks search sees. The vector is copied onto the row so search is one HNSW scan
-- over live chunks only (a tombstone deletes its rows, so nothing dead is ever returned).
CREATE TABLE chunks (
    chunk_id         uuid PRIMARY KEY,                -- UUIDv5 of url#index
    page_id          uuid NOT NULL REFERENCES pages (page_id) ON DELETE CASCADE,
    chunk_index      integer NOT NULL,
    content          text NOT NULL,
    embed_hash       bytea NOT NULL,                  -- SHA-256 of the exact embedded text
    token_count      integer NOT NULL,
    chunker_version  text NOT NULL,
    space_id         integer NOT NULL REFERENCES embedding_spaces (space_id),
    embedding        vector NOT NULL
);
CREATE INDEX chunks_page ON chunks (page_id, chunk_index);
CREATE INDEX chunks_embed_hash ON chunks (embed_hash);

-- A new generation of chunks, written by the chunks step and swapped in by the embeddings step.
CREATE TABLE staged_chunks (
    page_id          uuid NOT NULL REFERENCES pages (page_id) ON DELETE CASCADE,
    source_hash      text NOT NULL,
    chunk_index      integer NOT NULL,
    chunk_id         uuid NOT NULL,
    content          text NOT NULL,
    embed_text       text NOT NULL,
    embed_hash       bytea NOT NULL,
    token_count      integer NOT NULL,
    chunker_version  text NOT NULL,
    staged_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (page_id, source_hash, chunk_index)
);

-- The vector cache: the same text is embedded once per space, whatever its URL or position.
CREATE TABLE vectors (
    space_id     integer NOT NULL REFERENCES embedding_spaces (space_id),
    embed_hash   bytea NOT NULL,
    embedding    vector NOT NULL,
    token_count  integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space_id, embed_hash)
);

-- What each page switch cost and saved.
CREATE TABLE embedding_ledger (
    id               bigserial PRIMARY KEY,
    run_id           text,
    page_url         text NOT NULL,
    space_id         integer NOT NULL REFERENCES embedding_spaces (space_id),
    chunks_total     integer NOT NULL,
    chunks_embedded  integer NOT NULL,
    tokens_embedded  bigint NOT NULL,
    tokens_reused    bigint NOT NULL,
    requests         integer NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);
