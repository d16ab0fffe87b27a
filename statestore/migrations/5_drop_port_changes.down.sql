CREATE TABLE port_changes (
    seq      INTEGER PRIMARY KEY,
    protocol TEXT    NOT NULL,
    port     INTEGER NOT NULL
);
CREATE TRIGGER port_allocations_insert AFTER INSERT ON port_allocations BEGIN
    INSERT INTO port_changes (protocol, port) VALUES (NEW.protocol, NEW.port);
END;
CREATE TRIGGER port_allocations_delete AFTER DELETE ON port_allocations BEGIN
    INSERT INTO port_changes (protocol, port) VALUES (OLD.protocol, OLD.port);
END;
CREATE TRIGGER port_allocations_update AFTER UPDATE ON port_allocations BEGIN
    INSERT INTO port_changes (protocol, port) VALUES (OLD.protocol, OLD.port);
    INSERT INTO port_changes (protocol, port) SELECT NEW.protocol, NEW.port
        WHERE NEW.protocol <> OLD.protocol OR NEW.port <> OLD.port;
END;
DELETE FROM schema_history WHERE version = 5;
