-- A delivery routing will not index: `refused`, its URL an address the network guard refuses
-- (loopback, private, link-local…, unless CRAWLER_ALLOW_NETWORKS lets it in). Stored and visible,
-- never indexed. `unsolicited` is kept for deliveries that answer no push of ours.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_outcome_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_outcome_check CHECK (outcome IN
    ('queued', 'embedded', 'unchanged', 'deleted', 'skipped', 'superseded', 'failed', 'refused', 'unsolicited'))
    NOT VALID;
ALTER TABLE deliveries VALIDATE CONSTRAINT deliveries_outcome_check;
