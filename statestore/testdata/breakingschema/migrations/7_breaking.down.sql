ALTER TABLE port_allocations DROP COLUMN required;
DELETE FROM schema_history WHERE version = 7;
