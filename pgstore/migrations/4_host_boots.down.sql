DELETE FROM berth_schema_history WHERE version = 4;
ALTER TABLE berth_hosts DROP COLUMN boot_id;
