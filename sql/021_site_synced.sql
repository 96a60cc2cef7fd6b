-- When a running code location last synced each site's declaration: its discovery sensor, on its
-- ticks (at most once a minute), and its discovery runs; never `rag-pipeline site discover` from a
-- shell. `status` run in a shell that declares no such site tells one the running location still
-- declares (recently synced) from one no location declares any more. NULL: not since this column.
ALTER TABLE sites ADD COLUMN synced_at timestamptz;
