-- write-version: 1
--
-- A migration of a newer berth, for tests only (see compat_test.go): the
-- changes that older writers tolerate, one of each kind.
CREATE TABLE port_notes (
    protocol TEXT    NOT NULL,
    port     INTEGER NOT NULL,
    note     TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (protocol, port)
) WITHOUT ROWID;
ALTER TABLE port_allocations ADD COLUMN note TEXT NOT NULL DEFAULT '';
CREATE INDEX port_allocations_label ON port_allocations (label);
INSERT INTO schema_history (version, applied_at) VALUES (7, CAST(unixepoch('subsec') * 1000 AS INTEGER));
