-- One row per reservation. The primary key leads with what every conflict
-- lookup has (protocol, port), so that lookup is a range scan of the key.
CREATE TABLE port_allocations (
    protocol    TEXT    NOT NULL CHECK (protocol IN ('tcp', 'udp')),
    port        INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    address     BLOB    NOT NULL CHECK (length(address) IN (4, 16)),
    owner_pid   INTEGER NOT NULL CHECK (owner_pid > 0),
    owner_start INTEGER NOT NULL,
    owner_scope TEXT    NOT NULL DEFAULT '',
    owner_name  TEXT    NOT NULL DEFAULT '',
    label       TEXT    NOT NULL DEFAULT '',
    kind        TEXT    NOT NULL CHECK (kind IN ('dynamic', 'static')),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (protocol, port, address)
) WITHOUT ROWID;

-- No index on the owner: every commit would write its page too, which
-- costs the hot path more than the rare whole-owner operations (ReleaseOwner,
-- Reap) lose by scanning the table.

-- One row per migration applied, written by the migration itself: it shows
-- when the schema changed, and that no migration ever ran twice.
CREATE TABLE schema_history (
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL
);
INSERT INTO schema_history (version, applied_at) VALUES (1, CAST(unixepoch('subsec') * 1000 AS INTEGER));
