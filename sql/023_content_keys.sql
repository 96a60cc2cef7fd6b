-- The hash gate past the learned template (issue 43). A crawl whose text differs from the indexed
-- source is compared with it by content key: the hash of the page without its site's template
-- and with its confirmed volatile lines masked (core/content_gate.py).
--   content_key      the stored source's key, cached: NULL whenever the source moves
--   content_key_tag  what it was computed under (the template's learning time, the volatile set):
--                    a template learned again recomputes it from the source, never a re-route
--   volatile_counts  the page's own history: line shape -> crawls in a row it changed in place
ALTER TABLE pages ADD COLUMN content_key text;
ALTER TABLE pages ADD COLUMN content_key_tag text;
ALTER TABLE pages ADD COLUMN volatile_counts jsonb NOT NULL DEFAULT '{}';

-- A site's template pins (its YAML's template_pins, in that form), synced with its declaration:
-- an index_batch run that learns a young site's template uses them as its discovery run does.
ALTER TABLE sites ADD COLUMN template_pins jsonb NOT NULL DEFAULT '[]';
