-- Lexical retrieval (search --mode lexical|hybrid): each chunk's embedded text (breadcrumb,
-- overlap and content) as a tsvector, kept by PostgreSQL itself, with a GIN index. The text
-- search configuration it is built with is recorded in text_search_config; `rag-pipeline db
-- migrate` rebuilds the column when SEARCH_TEXT_CONFIG names another one.
ALTER TABLE chunks ADD COLUMN IF NOT EXISTS text_search tsvector
    GENERATED ALWAYS AS (to_tsvector('english'::regconfig, embed_text)) STORED;
CREATE INDEX IF NOT EXISTS chunks_text_search ON chunks USING gin (text_search);

CREATE TABLE IF NOT EXISTS text_search_config (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    config   regconfig NOT NULL
);
INSERT INTO text_search_config (config) VALUES ('english') ON CONFLICT DO NOTHING;
