-- The exact text each chunk was embedded from, so a new embedding space can be built from the
-- index itself (no recrawl, no re-chunk). Rows switched before this migration have NULL here:
-- a re-chunk backfill fills them.
ALTER TABLE chunks ADD COLUMN embed_text text;
