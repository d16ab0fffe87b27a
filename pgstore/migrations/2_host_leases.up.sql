-- Host leases that other hosts act on: a host can be retired, and the rows
-- of a host whose lease lapsed long ago are deleted by the others. Either
-- way the host's row keeps the count of its reservations so deleted, for
-- the host to report when it comes back (it reads and resets the count).
--
-- retired_at: set by RetireHost; cleared when the host renews its lease
-- again. lost_rows: reservations of this host deleted by retirement or by
-- another host's grace reaping since the host last read it.
ALTER TABLE berth_hosts
    ADD COLUMN retired_at timestamptz,
    ADD COLUMN lost_rows  bigint NOT NULL DEFAULT 0 CHECK (lost_rows >= 0);

-- Grace reaping looks for hosts whose lease lapsed long ago.
CREATE INDEX berth_hosts_expires_at ON berth_hosts (expires_at);

INSERT INTO berth_schema_history (version) VALUES (2);
