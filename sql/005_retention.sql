-- Retention (`rag-pipeline prune`). A vector no chunk uses is kept VECTOR_RETENTION_DAYS for reuse
-- (an edit reverted, a page that comes back, a switch back to a previous model), counted from when
-- a prune first found it unused: created_at says nothing about when it stopped being used. Only
-- the prune writes this column (a chunk using the vector again clears it at the next prune), so
-- the indexing path pays nothing for it. Adding a nullable column rewrites nothing.
ALTER TABLE vectors ADD COLUMN unused_since timestamptz;
