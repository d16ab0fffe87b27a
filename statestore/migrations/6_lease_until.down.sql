ALTER TABLE port_allocations DROP COLUMN lease_until;
DELETE FROM schema_history WHERE version = 6;
