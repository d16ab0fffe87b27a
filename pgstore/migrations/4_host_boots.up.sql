-- The boot of the machine that holds each host's lease, so that a second
-- machine configured with the same host name is refused while the first
-- one's lease is live, instead of taking the first one's processes for
-- exited (another boot) and handing their ports out again.
--
-- boot_id: the boot id (Linux /proc/sys/kernel/random/boot_id) of the
-- machine that last took or renewed the lease; '' when unknown (a host
-- registered before this migration, one only seen by NarrowFleet, or a
-- system without boot ids), which any machine may take over.
ALTER TABLE berth_hosts ADD COLUMN boot_id text NOT NULL DEFAULT ''
    CHECK (length(boot_id) <= 255);

INSERT INTO berth_schema_history (version) VALUES (4);
