package pgstore

// The store's SQL. Every statement names this host by host_no ($1), and
// sees another host's rows only where they conflict, which the exclusion
// constraint (see migrations/1_berth.up.sql) decides with host_span.

// leaseKind is what a lease row reads as its owner's namespace: scanRow
// makes such an owner a named holder.
const leaseKind = "lease"

const (
	// rowColumns are the columns scanRow reads. A lease row reads as host
	// 0 when fleet-wide, with the holder's name and namespace leaseKind.
	rowColumns = "coalesce(host_no, 0), protocol, port, host(address), coalesce(owner_pid, 0), coalesce(owner_start, 0)," +
		" CASE owner_kind WHEN 'lease' THEN '" + leaseKind + "' ELSE owner_scope END, coalesce(holder, owner_name)," +
		" label, kind, created_at"

	// qInsert grants a key when nothing conflicts and no grace period holds grants ($11: a restore,
	// which a grace period lets through). It returns the row's creation time (NULL: none) and the gate's wait.
	qInsert = "WITH " + qGate + ", ins AS (INSERT INTO berth_port_allocations" +
		" (host_no, protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind)" +
		" SELECT $1, $2, $3, $4::inet, $5, $6, $7, $8, $9, $10 WHERE $11::bool OR (SELECT wait_ms FROM gate) = 0" +
		" ON CONFLICT DO NOTHING RETURNING created_at)" +
		" SELECT (SELECT created_at FROM ins), (SELECT wait_ms FROM gate)"

	// qHolders reads the rows that conflict with an address on any of
	// some ports: the exclusion constraint's own test, served by its index.
	qHolders = "SELECT " + rowColumns + " FROM berth_port_allocations" +
		" WHERE host_span && int4range($1, $1, '[]') AND protocol = $2 AND port = ANY($3::int[])" +
		" AND addr_span && berth_addr_span($4::inet)" +
		" ORDER BY port, address"

	// qScan grants the first of the candidates $5 that no row conflicts
	// with; when it grants none, the result holds the candidates' holders
	// instead, to be judged without another round trip. The first column
	// tells which a row is; while a grace period holds grants the result
	// is one row of port 0 whose second column is the gate's wait.
	qScan = "WITH " + qGate + ", free AS (" +
		" SELECT c.port FROM unnest($5::int[]) WITH ORDINALITY AS c(port, ord)" +
		" WHERE NOT EXISTS (SELECT 1 FROM berth_port_allocations p" +
		"  WHERE p.host_span && int4range($1, $1, '[]') AND p.protocol = $2 AND p.port = c.port" +
		"  AND p.addr_span && berth_addr_span($3::inet))" +
		" ORDER BY c.ord LIMIT 1)," +
		" ins AS (" +
		" INSERT INTO berth_port_allocations" +
		" (host_no, protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind)" +
		" SELECT $1, $2, free.port, $3::inet, $6, $7, $8, $9, $10, $4 FROM free WHERE (SELECT wait_ms FROM gate) = 0" +
		" ON CONFLICT DO NOTHING RETURNING " + rowColumns + ")" +
		" SELECT true, 0::bigint, * FROM ins" +
		" UNION ALL" +
		" SELECT false, 0::bigint, " + rowColumns + " FROM berth_port_allocations" +
		" WHERE (SELECT wait_ms FROM gate) = 0 AND NOT EXISTS (SELECT 1 FROM ins)" +
		" AND host_span && int4range($1, $1, '[]') AND protocol = $2 AND port = ANY($5::int[])" +
		" AND addr_span && berth_addr_span($3::inet)" +
		" UNION ALL" +
		" SELECT false, wait_ms, 0, '', 0, '0.0.0.0', 0, 0::bigint, '', '', '', '', now() FROM gate WHERE wait_ms <> 0"

	// qBlock grants the ports $5 to $6 in one statement: one conflict
	// fails it whole. While a grace period holds grants it inserts nothing.
	qBlock = "WITH " + qGate + " INSERT INTO berth_port_allocations" +
		" (host_no, protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind)" +
		" SELECT $1, $2, g.port, $3::inet, $7, $8, $9, $10, $11, $4 FROM generate_series($5::int, $6::int) AS g(port)" +
		" WHERE (SELECT wait_ms FROM gate) = 0" +
		" RETURNING " + rowColumns

	// ownerMatch: owners match exactly; the name is for people.
	ownerMatch = "owner_pid = $5 AND owner_start = $6 AND owner_scope = $7"
	keyMatch   = "host_no = $1 AND protocol = $2 AND port = $3 AND address = $4::inet"

	// qDeleteOwned is Release, and the reaping of a dead holder's row.
	qDeleteOwned = "DELETE FROM berth_port_allocations WHERE " + keyMatch + " AND " + ownerMatch
	// qDeleteBlock deletes a block (or a row) whose probe failed.
	qDeleteBlock = "DELETE FROM berth_port_allocations WHERE host_no = $1 AND protocol = $2 AND port BETWEEN $3 AND $4" +
		" AND address = $8::inet AND " + ownerMatch

	qTransfer = "UPDATE berth_port_allocations SET owner_pid = $8, owner_start = $9, owner_scope = $10, owner_name = $11" +
		" WHERE " + keyMatch + " AND " + ownerMatch

	qOwners = "SELECT DISTINCT owner_pid, owner_start, owner_scope FROM berth_port_allocations WHERE host_no = $1 AND owner_kind = 'process'"
	// qReapOwners deletes the rows of the listed owners, exited all.
	qReapOwners = "DELETE FROM berth_port_allocations p" +
		" USING unnest($2::int[], $3::bigint[], $4::text[]) AS d(pid, start, scope)" +
		" WHERE p.host_no = $1 AND p.owner_pid = d.pid AND p.owner_start = d.start AND p.owner_scope = d.scope"

	qRemember = "INSERT INTO berth_sticky_ports (host_no, label, protocol, port) VALUES ($1, $2, $3, $4)" +
		" ON CONFLICT (host_no, label, protocol) DO UPDATE SET port = excluded.port, updated_at = now()"
	qRecall = "SELECT port FROM berth_sticky_ports WHERE host_no = $1 AND label = $2 AND protocol = $3"
	// qPruneSticky keeps the host's $2 most recently remembered ports.
	qPruneSticky = "DELETE FROM berth_sticky_ports WHERE host_no = $1 AND (label, protocol) IN" +
		" (SELECT label, protocol FROM berth_sticky_ports WHERE host_no = $1 ORDER BY updated_at DESC OFFSET $2)"
)
