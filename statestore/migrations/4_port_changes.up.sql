-- A journal of the keys whose rows changed, written by triggers, so that
-- every connection keeps its in-memory view of the table exact by reading
-- the journal from its last position and re-reading only those keys,
-- instead of the whole table whenever another connection has committed.
-- seq is the rowid: it only grows, since the newest entry is never pruned.
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
INSERT INTO schema_history (version, applied_at) VALUES (4, CAST(unixepoch('subsec') * 1000 AS INTEGER));
