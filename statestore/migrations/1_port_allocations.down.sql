DROP TABLE schema_history;
DROP TABLE port_allocations;
