DROP TABLE berth_schema_history;
DROP TABLE berth_sticky_ports;
DROP TABLE berth_port_allocations;
DROP FUNCTION berth_addr_span(inet);
DROP TYPE berth_inetrange;
DROP TABLE berth_hosts;
