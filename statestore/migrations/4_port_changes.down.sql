DROP TRIGGER port_allocations_update;
DROP TRIGGER port_allocations_delete;
DROP TRIGGER port_allocations_insert;
DROP TABLE port_changes;
DELETE FROM schema_history WHERE version = 4;
