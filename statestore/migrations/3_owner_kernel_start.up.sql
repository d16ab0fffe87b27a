-- From this version on, owner_start holds the process start as the kernel
-- records it (on Linux clock ticks since boot; on macOS and Windows unix
-- milliseconds), compared exactly, and owner_scope is in the format
-- "<boot id>/k1/<pid namespace>/<time namespace>" (or "k1"). Earlier rows
-- hold a start in unix milliseconds derived from the wall clock, which a
-- clock step moves, and the scope "<boot id>/<pid namespace>" (or "").
--
-- The columns keep their types, so the schema itself does not change; the
-- new version makes earlier berth releases, which refuse a schema newer than
-- they know, stop writing rows of the old format. Rows already written are
-- rewritten by berth in Go (statestore/legacy.go) when it opens the store:
-- deciding whether their owners still run needs the process table.
INSERT INTO schema_history (version, applied_at) VALUES (3, CAST(unixepoch('subsec') * 1000 AS INTEGER));
-- The migration writes its own version record, in the transaction of its
-- body, so that the schema and its version never disagree.
DELETE FROM schema_migrations;
INSERT INTO schema_migrations (version, dirty) VALUES (3, 0);
