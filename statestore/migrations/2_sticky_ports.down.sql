DROP TABLE sticky_ports;
DELETE FROM schema_history WHERE version = 2;
