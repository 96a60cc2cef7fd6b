-- The receiver answers a delivery only once its INSERT is committed, and a commit waits for its
-- WAL flush, which waits for every write queued before it. Autovacuum of the inbox (chiefly the
-- TOAST table of its write-once bodies) otherwise writes in bursts that delay those flushes by
-- 30-300 ms. Throttled 4x below the default here, it still dirties ~10 MB/s; nothing reads these
-- tables for speed. Measured: open-loop p99 at 1,000 deliveries/s 85-211 ms -> 6 ms (README).
ALTER TABLE deliveries SET (autovacuum_vacuum_cost_limit = 50, toast.autovacuum_vacuum_cost_limit = 50);
