-- write-version: 1
--
-- From this version on every migration declares, in a line like the one
-- above, the write version of the schema it makes, and berth records it
-- in the database header (PRAGMA user_version) in the transaction that
-- applies the migration. A berth writes to a store whose schema is newer
-- than it knows as long as it knows the store's write version: a change
-- that older writers tolerate (a new table, a new column with a default, a
-- new index) keeps the write version of the migration before it; any other
-- change takes the next one, and older berths refuse the store (see the
-- package doc of statestore).
--
-- lease_until is, for a reservation a named holder keeps under a lease,
-- when the lease ends: nanoseconds of CLOCK_BOOTTIME (time since boot,
-- suspend included) of the boot and time namespace that owner_scope names.
-- 0 for reservations owned by processes. No wall-clock step moves it.
ALTER TABLE port_allocations ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
INSERT INTO schema_history (version, applied_at) VALUES (6, CAST(unixepoch('subsec') * 1000 AS INTEGER));
