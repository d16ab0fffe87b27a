DELETE FROM berth_schema_history WHERE version = 2;
DROP INDEX berth_hosts_expires_at;
ALTER TABLE berth_hosts DROP COLUMN lost_rows, DROP COLUMN retired_at;
