-- Routing normalizes a delivered page to hash it; a queued (changed) delivery keeps that text
-- until it is applied or superseded, so the batch run does not decompress and normalize it again.
ALTER TABLE deliveries ADD COLUMN normalized_text text;
