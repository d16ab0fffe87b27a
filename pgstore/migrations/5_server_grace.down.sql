DELETE FROM berth_schema_history WHERE version = 5;
DROP TABLE berth_sessions;
DROP TABLE berth_server;
DROP FUNCTION berth_server_system();
DROP FUNCTION berth_server_timeline();
