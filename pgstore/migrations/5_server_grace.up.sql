-- The fleet's grace period after a change of server. A failover to an
-- asynchronous standby, a crash with synchronous_commit off or a restore
-- from backup can lose the last commits: reservations of live holders
-- among them. So berth records the identity of the server that serves the
-- database, and a transaction that finds another one records it and
-- starts a grace period, in which grants of ports that are not already
-- the asker's are refused while the holders put back what they hold. See
-- pgstore's grace.go.

-- berth_server_timeline and berth_server_system read the server's
-- timeline (it changes at a promotion) and system identifier (another
-- cluster) for the record, or NULL where the role may not read them.
CREATE FUNCTION berth_server_timeline() RETURNS integer
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN (SELECT timeline_id FROM pg_control_checkpoint());
EXCEPTION WHEN insufficient_privilege THEN
    RETURN NULL;
END
$$;
CREATE FUNCTION berth_server_system() RETURNS text
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RETURN (SELECT system_identifier::text FROM pg_control_system());
EXCEPTION WHEN insufficient_privilege THEN
    RETURN NULL;
END
$$;

-- One row: the server that last recorded itself. started is its
-- pg_postmaster_start_time(), which every restart, promotion or restore
-- changes: it is what berth compares. grace_until ends the grace period
-- the change at changed_at started (NULL: none); it ends earlier once
-- every live session has re-asserted (berth_sessions.acked).
CREATE TABLE berth_server (
    id          integer     PRIMARY KEY CHECK (id = 1),
    started     timestamptz NOT NULL,
    system_id   text,
    timeline    integer,
    previous    timestamptz,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    grace_until timestamptz
);
-- The first record, in the migration's own transaction: a fresh database
-- starts no grace period.
INSERT INTO berth_server (id, started, system_id, timeline)
    VALUES (1, pg_postmaster_start_time(), berth_server_system(), berth_server_timeline());

-- One row per open Store (a berth process's connection pool), renewed with
-- its host's lease. acked is the server (its started) for whose change the
-- Store has re-asserted: every reservation granted through it and still
-- held is in the table again. grace_ms is the Store's grace period; the
-- longest of the live sessions' is the next one's.
CREATE TABLE berth_sessions (
    session_id  text        PRIMARY KEY CHECK (session_id <> '' AND length(session_id) <= 64),
    host_id     text        NOT NULL,
    owner_pid   integer     NOT NULL,
    owner_start bigint      NOT NULL,
    owner_scope text        NOT NULL DEFAULT '',
    boot_id     text        NOT NULL DEFAULT '',
    expires_at  timestamptz NOT NULL,
    grace_ms    bigint      NOT NULL CHECK (grace_ms >= 0),
    acked       timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX berth_sessions_host ON berth_sessions (host_id);
CREATE INDEX berth_sessions_expires_at ON berth_sessions (expires_at);

INSERT INTO berth_schema_history (version) VALUES (5);
