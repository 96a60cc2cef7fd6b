-- Routing hashes the text it normalizes; a queued delivery keeps that hash beside the text, so the
-- batch run that applies it neither normalizes nor hashes it again.
ALTER TABLE deliveries ADD COLUMN normalized_hash text;
