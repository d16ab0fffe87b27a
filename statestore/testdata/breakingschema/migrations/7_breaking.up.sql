-- write-version: 2
--
-- A migration of a newer berth, for tests only (see compat_test.go). It
-- stands for a change that older writers do not tolerate (say, a column
-- whose value they would leave wrong), so it takes the next write version,
-- and older berths must stop writing.
ALTER TABLE port_allocations ADD COLUMN required TEXT NOT NULL DEFAULT 'x';
INSERT INTO schema_history (version, applied_at) VALUES (7, CAST(unixepoch('subsec') * 1000 AS INTEGER));
