DROP INDEX port_allocations_label;
ALTER TABLE port_allocations DROP COLUMN note;
DROP TABLE port_notes;
DELETE FROM schema_history WHERE version = 7;
