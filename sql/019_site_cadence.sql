-- A site's own recrawl rules: its component's `cadence:` block, in cadence.yaml's form. NULL: the
-- deployment's (CADENCE_FILE). The recrawl sensor, the cadence refresh, seeding and `cadence show`
-- give each page its site's rules; before this only discovery did.
ALTER TABLE sites ADD COLUMN cadence jsonb;
