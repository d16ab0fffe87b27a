DELETE FROM berth_schema_history WHERE version = 3;
-- Lease rows have no process to own them under the older schema.
DELETE FROM berth_port_allocations WHERE owner_kind = 'lease';
DROP INDEX berth_port_allocations_lease_expires;
ALTER TABLE berth_port_allocations
    DROP CONSTRAINT berth_port_allocations_owner,
    DROP COLUMN lease_expires,
    DROP COLUMN holder,
    DROP COLUMN owner_kind,
    ALTER COLUMN owner_start SET NOT NULL,
    ALTER COLUMN owner_pid SET NOT NULL,
    ALTER COLUMN host_no SET NOT NULL;
