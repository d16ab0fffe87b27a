-- Fleet-wide reservations held under a lease: for owners whose host is not
-- known yet (a pod not yet scheduled) and owners that are not processes (a
-- pod, a job), released by their controller.
--
-- A row with no host_no spans every host (host_span is (,), see migration
-- 1): the exclusion constraint then keeps its port taken on every host.
-- Narrowing it sets host_no, and the constraint checks it again.
ALTER TABLE berth_port_allocations ALTER COLUMN host_no DROP NOT NULL;

-- owner_kind 'process': a process of the row's host, as before (owner_pid,
-- owner_start, owner_scope, owner_name). owner_kind 'lease': a named
-- holder, e.g. 'pod/default/web-0', whose lease ends at lease_expires, a
-- time only ever set from the server's clock (now() + ttl).
ALTER TABLE berth_port_allocations
    ALTER COLUMN owner_pid DROP NOT NULL,
    ALTER COLUMN owner_start DROP NOT NULL,
    ADD COLUMN owner_kind    text NOT NULL DEFAULT 'process'
        CHECK (owner_kind IN ('process', 'lease')),
    ADD COLUMN holder        text
        CHECK (holder <> '' AND length(holder) <= 255),
    ADD COLUMN lease_expires timestamptz,
    -- A process row has a host, a pid and a start and no lease; a lease
    -- row has a holder and an expiry and no process.
    ADD CONSTRAINT berth_port_allocations_owner CHECK (
        CASE owner_kind
        WHEN 'process' THEN host_no IS NOT NULL AND owner_pid IS NOT NULL AND owner_start IS NOT NULL
                            AND holder IS NULL AND lease_expires IS NULL
        ELSE holder IS NOT NULL AND lease_expires IS NOT NULL
             AND owner_pid IS NULL AND owner_start IS NULL
        END);

-- Any host's reaping deletes lapsed leases.
CREATE INDEX berth_port_allocations_lease_expires ON berth_port_allocations (lease_expires)
    WHERE owner_kind = 'lease';

INSERT INTO berth_schema_history (version) VALUES (3);
