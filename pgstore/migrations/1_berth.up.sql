-- berth's tables in PostgreSQL. Every table is named berth_* so that berth
-- can share a database or schema with other programs; every row of a
-- reservation carries the host it is on, because ports are per host.

-- btree_gist lets one GiST index, the exclusion constraint's, compare the
-- plain columns (protocol, port) with = next to the ranges.
CREATE EXTENSION IF NOT EXISTS btree_gist;

-- One row per host of the fleet. host_id is the host's stable name (the
-- configured name, else the hostname); host_no is what reservations
-- carry. expires_at is the host's lease: it is only ever set from the
-- server's clock (now() + ttl), never from a client's.
CREATE TABLE berth_hosts (
    host_no    integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    host_id    text        NOT NULL UNIQUE CHECK (host_id <> '' AND length(host_id) <= 255),
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A range of addresses: one address is the point [a, a], a wildcard is
-- (,) and so overlaps every address of both families. inet orders IPv4
-- before IPv6, and within a family by address, so two different specific
-- addresses are two different points and never overlap.
CREATE TYPE berth_inetrange AS RANGE (subtype = inet);

-- berth_addr_span maps an address to its span under berth's conflict rule
-- (package store): 0.0.0.0 and :: conflict with every address.
CREATE FUNCTION berth_addr_span(a inet) RETURNS berth_inetrange
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT CASE WHEN a = '0.0.0.0'::inet OR a = '::'::inet
                      THEN berth_inetrange(NULL, NULL, '()')
                      ELSE berth_inetrange(a, a, '[]') END $$;

-- One row per reservation. The whole conflict rule is the exclusion
-- constraint: no two rows on overlapping hosts, of one protocol and port,
-- with overlapping address spans. The spans are generated from host_no and
-- address, so no writer, however buggy, can store a span that lies about
-- its row. A host_no of NULL would span every host (a reservation for a
-- host not yet known); this version requires a host.
CREATE TABLE berth_port_allocations (
    host_no     integer     NOT NULL REFERENCES berth_hosts (host_no),
    host_span   int4range   NOT NULL GENERATED ALWAYS AS (
                    CASE WHEN host_no IS NULL THEN int4range(NULL, NULL)
                         ELSE int4range(host_no, host_no, '[]') END) STORED,
    protocol    text        NOT NULL CHECK (protocol IN ('tcp', 'udp')),
    port        integer     NOT NULL CHECK (port BETWEEN 1 AND 65535),
    -- One host address in normal form: no netmask, and an IPv4 address as
    -- IPv4, never as ::ffff:a.b.c.d (which would be a second spelling, a
    -- second point, of the same address).
    address     inet        NOT NULL
        CONSTRAINT berth_port_allocations_host_address
            CHECK (masklen(address) = CASE family(address) WHEN 4 THEN 32 ELSE 128 END)
        CONSTRAINT berth_port_allocations_unmapped_address
            CHECK (NOT address << '::ffff:0.0.0.0/96'::inet),
    addr_span   berth_inetrange NOT NULL GENERATED ALWAYS AS (berth_addr_span(address)) STORED,
    owner_pid   integer     NOT NULL CHECK (owner_pid > 0),
    owner_start bigint      NOT NULL,
    owner_scope text        NOT NULL DEFAULT '',
    owner_name  text        NOT NULL DEFAULT '',
    label       text        NOT NULL DEFAULT '',
    kind        text        NOT NULL CHECK (kind IN ('dynamic', 'static')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT berth_port_allocations_no_conflict EXCLUDE USING gist (
        host_span WITH &&, protocol WITH =, port WITH =, addr_span WITH &&)
);

-- A host's own rows by key: Release, Transfer, List, ReservedPorts, Reap.
CREATE INDEX berth_port_allocations_host ON berth_port_allocations (host_no, protocol, port);

-- The last port handed out under a label, per host, so that a sticky
-- request gets the same port after a restart when it is free.
CREATE TABLE berth_sticky_ports (
    host_no    integer     NOT NULL REFERENCES berth_hosts (host_no),
    label      text        NOT NULL,
    protocol   text        NOT NULL CHECK (protocol IN ('tcp', 'udp')),
    port       integer     NOT NULL CHECK (port BETWEEN 1 AND 65535),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (host_no, label, protocol)
);

-- One row per migration applied, written by the migration itself in the
-- same transaction as its body: it tells whether a migration marked dirty
-- committed.
CREATE TABLE berth_schema_history (
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO berth_schema_history (version) VALUES (1);
