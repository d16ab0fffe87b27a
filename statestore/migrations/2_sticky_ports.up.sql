-- The last port handed out under a label, so that a sticky request gets
-- the same port after a restart when it is free.
CREATE TABLE sticky_ports (
    label      TEXT    NOT NULL,
    protocol   TEXT    NOT NULL CHECK (protocol IN ('tcp', 'udp')),
    port       INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (label, protocol)
) WITHOUT ROWID;
INSERT INTO schema_history (version, applied_at) VALUES (2, CAST(unixepoch('subsec') * 1000 AS INTEGER));
