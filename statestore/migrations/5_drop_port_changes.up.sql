-- The change journal of version 4 goes: every commit wrote a row of it (a
-- second page in the WAL, and the trigger programs), which was about an
-- eighth of what an Allocate+Release cost. A connection now keeps its view
-- exact by PRAGMA data_version alone: when another connection has
-- committed, every key the view knows counts as stale and is read again,
-- by its primary key, the next time a scan visits it. What a call costs
-- still follows the keys it visits, not the size of the table.
DROP TRIGGER port_allocations_update;
DROP TRIGGER port_allocations_delete;
DROP TRIGGER port_allocations_insert;
DROP TABLE port_changes;
INSERT INTO schema_history (version, applied_at) VALUES (5, CAST(unixepoch('subsec') * 1000 AS INTEGER));
