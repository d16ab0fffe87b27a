package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-go/berth/store"
)

// Fleet-wide reservations: ports held by a named holder under a renewable
// lease rather than by a process of a host, for owners whose host is not
// known yet (a pod not yet scheduled) or that are not processes at all (a
// pod, a job). Such a row starts with no host, so the exclusion constraint
// keeps its port taken on every host of the fleet; NarrowFleet gives it
// its host once that is known. Every lease time is the server's: set as
// now() + ttl and compared with now() in SQL, never with a client's clock.
const (
	// qFleetReserve grants the first port of the band $3..$4 that no row
	// of any host holds for an address conflicting with $2, as a row of no
	// host held by $5 until $6 ms from now. It returns one row when the
	// band had a free port: its created_at and lease_expires are NULL when
	// the insert lost a race for it. No row: the band is exhausted.
	qFleetReserve = "WITH free AS (" +
		" SELECT c.port FROM generate_series($3::int, $4::int) AS c(port)" +
		" WHERE NOT EXISTS (SELECT 1 FROM berth_port_allocations p" +
		"  WHERE p.protocol = $1 AND p.port = c.port AND p.addr_span && berth_addr_span($2::inet))" +
		" ORDER BY c.port LIMIT 1)," +
		" ins AS (INSERT INTO berth_port_allocations" +
		" (host_no, protocol, port, address, owner_kind, holder, lease_expires, label, kind)" +
		" SELECT NULL, $1, free.port, $2::inet, 'lease', $5, now() + $6::bigint * interval '1 millisecond', $7, 'dynamic'" +
		" FROM free ON CONFLICT DO NOTHING RETURNING created_at, lease_expires)" +
		" SELECT free.port, ins.created_at, ins.lease_expires FROM free LEFT JOIN ins ON true"

	// leaseMatch picks holder $4's lease row of key $1..$3, fleet-wide or
	// narrowed to any host.
	leaseMatch = "owner_kind = 'lease' AND protocol = $1 AND port = $2 AND address = $3::inet AND holder = $4"

	qFleetRenew   = "UPDATE berth_port_allocations SET lease_expires = now() + $5::bigint * interval '1 millisecond' WHERE " + leaseMatch
	qFleetRelease = "DELETE FROM berth_port_allocations WHERE " + leaseMatch

	// qHostSeen registers host $1, should no berth process of it have
	// opened a store yet, with a lease that has ended: it becomes a host
	// of the fleet whose berth renews the lease once it runs there.
	qHostSeen = "INSERT INTO berth_hosts (host_id, expires_at) VALUES ($1, now()) ON CONFLICT (host_id) DO NOTHING"
	// qFleetNarrow moves holder $4's fleet-wide row of the key to host $5
	// (idempotent when it is there already). The exclusion constraint
	// checks the row again.
	qFleetNarrow = "UPDATE berth_port_allocations p SET host_no = h.host_no FROM berth_hosts h" +
		" WHERE h.host_id = $5 AND (p.host_no IS NULL OR p.host_no = h.host_no) AND p." + leaseMatch
	// qFleetWhere names the host holder $4's row of the key is on: ''
	// fleet-wide.
	qFleetWhere = "SELECT coalesce(h.host_id, '') FROM berth_port_allocations p LEFT JOIN berth_hosts h USING (host_no)" +
		" WHERE p." + leaseMatch

	// qReapLeases deletes the lease rows, of every host and of none,
	// whose lease has run out.
	qReapLeases = "DELETE FROM berth_port_allocations WHERE owner_kind = 'lease' AND lease_expires < now()"

	qLeases = "SELECT p.protocol, p.port, host(p.address), p.holder, p.label, coalesce(h.host_id, ''), p.lease_expires, p.created_at" +
		" FROM berth_port_allocations p LEFT JOIN berth_hosts h USING (host_no)" +
		" WHERE p.owner_kind = 'lease' ORDER BY p.holder, p.protocol, p.port, p.address"
)

// DefaultFleetTTL is the lease of a fleet-wide reservation when the
// request's TTL is zero.
const DefaultFleetTTL = 5 * time.Minute

// Band is a range of ports, First to Last inclusive.
type Band struct {
	First, Last uint16
}

// FleetRequest asks ReserveFleet for a port. Every zero value is
// documented; Holder and Band are required.
type FleetRequest struct {
	// Protocol is tcp or udp; required.
	Protocol store.Protocol
	// Addr is the address the holder will bind; zero: 0.0.0.0, which
	// under berth's conflict rule takes the port on every address, IPv4
	// and IPv6: "this port on whatever host, whatever address", the usual
	// meaning of a fleet-wide port.
	Addr netip.Addr
	// Band is where the port is drawn from, lowest first: a band of the
	// caller's own for fleet-wide ports, apart from the ranges hosts
	// hand out to processes, so that per-host grants rarely stand in the
	// way (a port any host holds is skipped). Required.
	Band Band
	// Holder names the owner, e.g. "pod/default/web-0": at most 255
	// bytes, no control characters. Required.
	Holder string
	// Label is stored with the row, as store.Request's.
	Label string
	// TTL is how long the lease lasts from the grant, by the server's
	// clock; zero: DefaultFleetTTL. RenewFleet extends it.
	TTL time.Duration
}

// FleetReservation is a reservation held under a lease.
type FleetReservation struct {
	store.Key
	Holder string
	Label  string
	// Host is the host it was narrowed to; "" while it is fleet-wide.
	Host string
	// Expires is when the lease runs out, by the PostgreSQL server's
	// clock: compare it with the server's time, not the local clock.
	Expires time.Time
	Created time.Time
}

// ReserveFleet reserves for req.Holder, under a lease of req.TTL, the
// lowest port of req.Band that is free on every host: a row of no host,
// which the exclusion constraint keeps out of every host's way and every
// host's out of its way. No process of any host can reserve the port
// while the row lasts; a process Reserve or Scan that meets it gets a
// *store.ConflictError whose holder has Scope store.LeaseScope.
//
// The row lasts until ReleaseFleet, or until its lease runs out unless
// RenewFleet extends it: then the Reap and the sweep of any host delete
// it. A band with no port free everywhere is an error wrapping
// store.ErrExhausted. The Store's own host plays no part.
func (s *Store) ReserveFleet(ctx context.Context, req FleetRequest) (FleetReservation, error) {
	if req.Addr == (netip.Addr{}) {
		req.Addr = netip.IPv4Unspecified()
	}
	key, err := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}.Normalize()
	if err != nil {
		return FleetReservation{}, err
	}
	if req.Band.First == 0 || req.Band.Last < req.Band.First {
		return FleetReservation{}, &store.FieldError{Field: "band", Value: fmt.Sprintf("%d-%d", req.Band.First, req.Band.Last),
			Want: "a band of ports First to Last, 1 <= First <= Last <= 65535"}
	}
	if err := checkHolder(req.Holder); err != nil {
		return FleetReservation{}, err
	}
	if err := store.CheckLabel(req.Label); err != nil {
		return FleetReservation{}, err
	}
	ttl, err := leaseTTL(req.TTL)
	if err != nil {
		return FleetReservation{}, err
	}
	op := fmt.Sprintf("reserve a fleet-wide %s port on %s in %d-%d for %s", key.Protocol, key.Addr, req.Band.First, req.Band.Last, strconv.Quote(req.Holder))
	reaped := false
	for range maxAttempts {
		port, created, expires, ok, err := s.fleetOnce(ctx, op, key, req, ttl)
		switch {
		case err != nil:
			return FleetReservation{}, err
		case ok:
			key.Port = port
			return FleetReservation{Key: key, Holder: req.Holder, Label: req.Label, Created: created, Expires: expires}, nil
		case port != 0:
			continue // a race lost for port: the next free one
		case !reaped:
			// Lapsed leases may stand in the way until a sweep: delete
			// them and look once more.
			reaped = true
			n, err := s.reapLeases(ctx)
			if err != nil {
				return FleetReservation{}, err
			}
			if n > 0 {
				continue
			}
		}
		return FleetReservation{}, fmt.Errorf("%s: %w: every port of the band is held on some host; widen the band or release fleet-wide reservations", op, store.ErrExhausted)
	}
	return FleetReservation{}, fmt.Errorf("%s: %w: lost the race for a port %d times; try again", op, store.ErrBusy, maxAttempts)
}

// fleetOnce runs qFleetReserve: the port granted and true; a port that was
// free but lost to a concurrent insert and false; or port 0 when the band
// has no free port.
func (s *Store) fleetOnce(ctx context.Context, op string, key store.Key, req FleetRequest, ttl time.Duration) (uint16, time.Time, time.Time, bool, error) {
	if err := s.open(); err != nil {
		return 0, time.Time{}, time.Time{}, false, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var (
		port             int32
		created, expires *time.Time
	)
	err := s.pool.QueryRow(cctx, qFleetReserve, string(key.Protocol), key.Addr.String(), int32(req.Band.First), int32(req.Band.Last),
		req.Holder, ttl.Milliseconds(), req.Label).Scan(&port, &created, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, time.Time{}, time.Time{}, false, nil
	case isExclusion(err):
		return 1, time.Time{}, time.Time{}, false, nil // a race lost; which port does not matter
	case err != nil:
		return 0, time.Time{}, time.Time{}, false, s.fail(ctx, op, err)
	case created == nil || expires == nil:
		return uint16(port), time.Time{}, time.Time{}, false, nil
	}
	return uint16(port), *created, *expires, true, nil
}

// RenewFleet extends holder's lease on its reservation of key, fleet-wide
// or narrowed, to ttl from now by the server's clock (zero ttl:
// DefaultFleetTTL). Renew every third of the TTL or so, so that a slow
// round trip does not let it run out. A lease that has run out but whose
// row no reaping has deleted yet is renewed too: its port never changed
// hands. No such row of holder's (another holder's row included) is an
// error wrapping store.ErrNotFound: the port may be someone else's now;
// reserve again.
func (s *Store) RenewFleet(ctx context.Context, key store.Key, holder string, ttl time.Duration) error {
	key, err := checkLease(key, holder)
	if err != nil {
		return err
	}
	if ttl, err = leaseTTL(ttl); err != nil {
		return err
	}
	op := "renew the lease of " + strconv.Quote(holder) + " on " + key.String()
	n, err := s.exec(ctx, op, qFleetRenew, string(key.Protocol), int32(key.Port), key.Addr.String(), holder, ttl.Milliseconds())
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w: it was released or its lease ran out and was reaped; reserve again", op, store.ErrNotFound)
	}
	return nil
}

// ReleaseFleet deletes holder's reservation of key, fleet-wide or
// narrowed to a host: the release path of a holder's controller, e.g. a
// pod's finalizer. Another holder's row is never touched: no such row of
// holder's is an error wrapping store.ErrNotFound.
func (s *Store) ReleaseFleet(ctx context.Context, key store.Key, holder string) error {
	key, err := checkLease(key, holder)
	if err != nil {
		return err
	}
	op := "release the lease of " + strconv.Quote(holder) + " on " + key.String()
	n, err := s.exec(ctx, op, qFleetRelease, string(key.Protocol), int32(key.Port), key.Addr.String(), holder)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, store.ErrNotFound)
	}
	return nil
}

// NarrowFleet makes holder's fleet-wide reservation of key a reservation
// of host, e.g. once its pod is bound to a node: the port is free again on
// every other host and stays taken on host. The row stays the holder's,
// under its lease: RenewFleet, ReleaseFleet and lapsing work as before,
// and host's processes cannot take it over. It never conflicts: the
// fleet-wide row excluded the port on host already.
//
// host is a name as Options.Host takes it. A host no berth of which has
// opened a store yet is registered, with a lease that has ended (its
// berth renews it when it runs there): check the name, a misspelt one
// holds the port on a host that does not exist. Narrowing to the host the
// row is on already does nothing; a row narrowed to another host is an
// error wrapping store.ErrInvalid (release it and reserve again). No such
// row of holder's is an error wrapping store.ErrNotFound.
func (s *Store) NarrowFleet(ctx context.Context, key store.Key, holder, host string) error {
	key, err := checkLease(key, holder)
	if err != nil {
		return err
	}
	if host == "" {
		return &store.FieldError{Field: "host", Value: host, Want: "the name of the host to narrow the reservation to"}
	}
	if err := checkHost(host); err != nil {
		return err
	}
	op := "narrow the lease of " + strconv.Quote(holder) + " on " + key.String() + " to host " + strconv.Quote(host)
	if err := s.open(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	args := []any{string(key.Protocol), int32(key.Port), key.Addr.String(), holder}
	var (
		moved bool
		where string
	)
	err = pgx.BeginFunc(cctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(cctx, qHostSeen, host); err != nil {
			return err
		}
		tag, err := tx.Exec(cctx, qFleetNarrow, append(args, host)...)
		if err != nil || tag.RowsAffected() > 0 {
			moved = err == nil
			return err
		}
		return tx.QueryRow(cctx, qFleetWhere, args...).Scan(&where)
	})
	switch {
	case moved:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s: %w", op, store.ErrNotFound)
	case err != nil:
		return s.fail(ctx, op, err)
	}
	return &store.FieldError{Field: "host", Value: host,
		Want: "the host the reservation is narrowed to already, " + strconv.Quote(where) + "; release it and reserve again to move it"}
}

// Leases returns every reservation held under a lease, fleet-wide or
// narrowed to any host, ordered by holder, protocol, port and address.
// Leases that have run out are included until reaped.
func (s *Store) Leases(ctx context.Context) ([]FleetReservation, error) {
	if err := s.open(); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	rows, err := s.pool.Query(cctx, qLeases)
	if err != nil {
		return nil, s.fail(ctx, "list leases", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FleetReservation, error) {
		var (
			f           FleetReservation
			proto, addr string
			port        int32
		)
		if err := r.Scan(&proto, &port, &addr, &f.Holder, &f.Label, &f.Host, &f.Expires, &f.Created); err != nil {
			return FleetReservation{}, err
		}
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return FleetReservation{}, fmt.Errorf("lease row of port %d has address %q: %w", port, addr, err)
		}
		f.Key = store.Key{Protocol: store.Protocol(proto), Addr: a.Unmap(), Port: uint16(port)}
		return f, nil
	})
	if err != nil {
		return nil, s.fail(ctx, "list leases", err)
	}
	return out, nil
}

// reapLeases deletes the lease rows whose lease has run out, by the
// server's clock, and returns how many.
func (s *Store) reapLeases(ctx context.Context) (int64, error) {
	n, err := s.exec(ctx, "reap lapsed leases", qReapLeases)
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.reaped.Add(n)
		s.log.Info("deleted reservations whose lease ran out", "rows", n)
	}
	return n, nil
}

// checkLease validates what RenewFleet, ReleaseFleet and NarrowFleet
// share: the key, in normal form, and the holder.
func checkLease(key store.Key, holder string) (store.Key, error) {
	key, err := key.Normalize()
	if err != nil {
		return store.Key{}, err
	}
	return key, checkHolder(holder)
}

func checkHolder(h string) error {
	if h == "" || len(h) > 255 {
		return &store.FieldError{Field: "holder", Value: h, Want: `the holder's name, 1 to 255 bytes, e.g. "pod/default/web-0"`}
	}
	for _, r := range h {
		if r < 0x20 || r == 0x7f {
			return &store.FieldError{Field: "holder", Value: h, Want: "a holder name without control characters"}
		}
	}
	return nil
}

// maxFleetTTL bounds a lease, so that a unit mistake (hours for seconds)
// does not hold a port for years.
const maxFleetTTL = 7 * 24 * time.Hour

func leaseTTL(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultFleetTTL, nil
	case ttl < time.Millisecond || ttl > maxFleetTTL:
		return 0, &store.FieldError{Field: "ttl", Value: ttl.String(), Want: "a lease of 1ms to 168h (zero: " + DefaultFleetTTL.String() + ")"}
	}
	return ttl, nil
}
