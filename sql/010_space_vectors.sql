-- The vectors search reads move off `chunks` into one table per embedding space (partitions of
-- space_vectors), each with its own HNSW index. A model switch then fills the new space's table
-- while page switches keep writing both, builds its index once after the bulk load, and
-- `space activate` flips a status: no rewrite of `chunks`, no table lock held while embedding.
CREATE TABLE space_vectors (
    chunk_id    uuid NOT NULL REFERENCES chunks (chunk_id) ON DELETE CASCADE,
    space_id    integer NOT NULL REFERENCES embedding_spaces (space_id),
    embed_hash  bytea NOT NULL,                       -- the text the vector is of
    embedding   vector NOT NULL,
    PRIMARY KEY (chunk_id, space_id)
) PARTITION BY LIST (space_id);

-- Live chunks a page switch could not give a vector of a space being built (its text was new):
-- the build embeds them, and `space activate` flips only when none is left.
CREATE TABLE space_backlog (
    space_id  integer NOT NULL REFERENCES embedding_spaces (space_id),
    chunk_id  uuid NOT NULL,
    PRIMARY KEY (space_id, chunk_id)
);

-- The index as it was: the active space's vectors were on `chunks` (a building space's only in
-- the cache). Give each such space its table, filled from there, and its index.
DO $$
DECLARE
    s record;
    ops text;
BEGIN
    FOR s IN SELECT space_id, dimensions, status FROM embedding_spaces WHERE status IN ('active', 'building') LOOP
        EXECUTE format('CREATE TABLE space_vectors_%s PARTITION OF space_vectors FOR VALUES IN (%s)',
                       s.space_id, s.space_id);
        IF s.status = 'active' THEN
            EXECUTE format('INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)'
                           ' SELECT chunk_id, space_id, embed_hash, embedding FROM chunks WHERE space_id = %s',
                           s.space_id);
        ELSE
            EXECUTE format('INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)'
                           ' SELECT c.chunk_id, v.space_id, c.embed_hash, v.embedding FROM chunks c'
                           ' JOIN vectors v ON v.space_id = %s AND v.embed_hash = c.embed_hash',
                           s.space_id);
            EXECUTE format('INSERT INTO space_backlog (space_id, chunk_id) SELECT %s, c.chunk_id FROM chunks c'
                           ' WHERE NOT EXISTS (SELECT 1 FROM space_vectors_%s v WHERE v.chunk_id = c.chunk_id)',
                           s.space_id, s.space_id);
        END IF;
        ops := CASE WHEN s.dimensions <= 2000 THEN format('vector(%s)) vector_cosine_ops', s.dimensions)
                    ELSE format('halfvec(%s)) halfvec_cosine_ops', s.dimensions) END;
        EXECUTE format('CREATE INDEX space_vectors_%s_hnsw ON space_vectors_%s USING hnsw ((embedding::%s)',
                       s.space_id, s.space_id, ops);
    END LOOP;
    FOR s IN SELECT indexname FROM pg_indexes WHERE tablename = 'chunks' AND indexname LIKE 'chunks_hnsw_space_%' LOOP
        EXECUTE format('DROP INDEX %I', s.indexname);
    END LOOP;
END $$;

ALTER TABLE chunks DROP COLUMN embedding, DROP COLUMN space_id;

-- Where a space's walk over `chunks` got to (a build that stopped resumes there), and when it
-- ended with the space's index built.
ALTER TABLE embedding_spaces ADD COLUMN fill_cursor uuid, ADD COLUMN filled_at timestamptz;
UPDATE embedding_spaces SET filled_at = now() WHERE status = 'active';
