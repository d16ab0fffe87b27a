package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// qFleetReserve grants the first port of the band $3..$4, going up
	// from $3 + $8 and wrapping round to $3, that no row of any host holds
	// for an address conflicting with $2, as a row of no host held by $5
	// until $6 ms from now. The walk visits every port of the band once,
	// so "no row" means exactly that the band is exhausted; the offset $8
	// (0 to the band's size less one) only says where it starts. It
	// returns one row: the gate's wait (see qGate; while it is not 0
	// nothing is inserted), and the free port found (NULL: none) with the
	// created_at and lease_expires of its row (NULL when the insert lost a
	// race for it).
	qFleetReserve = "WITH " + qGate + ", free AS (" +
		" SELECT c.port FROM generate_series(0, $4::int - $3::int) AS g(i)," +
		"  LATERAL (SELECT $3::int + ($8::int + g.i) % ($4::int - $3::int + 1) AS port) AS c" +
		" WHERE NOT EXISTS (SELECT 1 FROM berth_port_allocations p" +
		"  WHERE p.protocol = $1 AND p.port = c.port AND p.addr_span && berth_addr_span($2::inet))" +
		" ORDER BY g.i LIMIT 1)," +
		" ins AS (INSERT INTO berth_port_allocations" +
		" (host_no, protocol, port, address, owner_kind, holder, lease_expires, label, kind)" +
		" SELECT NULL, $1, free.port, $2::inet, 'lease', $5, now() + $6::bigint * interval '1 millisecond', $7, 'dynamic'" +
		" FROM free WHERE (SELECT wait_ms FROM gate) = 0 ON CONFLICT DO NOTHING RETURNING created_at, lease_expires)" +
		" SELECT gate.wait_ms, free.port, ins.created_at, ins.lease_expires FROM gate LEFT JOIN free ON true LEFT JOIN ins ON true"

	// leaseMatch picks holder $4's lease row of key $1..$3, fleet-wide or
	// narrowed to any host.
	leaseMatch = "owner_kind = 'lease' AND protocol = $1 AND port = $2 AND address = $3::inet AND holder = $4"

	// qFleetRenew renews holder $4's lease of the key to $5 ms from now.
	// Where the row is missing while a grace period holds grants (see
	// qGate), the holder's re-assertion puts it back when its lease, as
	// last granted or renewed through this Store, ends after now ($8):
	// fleet-wide, or on host $6 when it was narrowed there, with label
	// $7. It returns the rows renewed and put back, the lease's new end,
	// and whether the row was to be put back (then none put back means
	// another row holds the port).
	qFleetRenew = "WITH " + qGate + "," +
		" upd AS (UPDATE berth_port_allocations SET lease_expires = now() + $5::bigint * interval '1 millisecond' WHERE " + leaseMatch + " RETURNING lease_expires)," +
		" ins AS (INSERT INTO berth_port_allocations (host_no, protocol, port, address, owner_kind, holder, lease_expires, label, kind)" +
		" SELECT (SELECT host_no FROM berth_hosts WHERE host_id = $6), $1, $2, $3::inet, 'lease', $4, now() + $5::bigint * interval '1 millisecond', $7, 'dynamic'" +
		" WHERE NOT EXISTS (SELECT 1 FROM upd) AND (SELECT wait_ms FROM gate) <> 0 AND $8::timestamptz > now()" +
		" ON CONFLICT DO NOTHING RETURNING lease_expires)" +
		" SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM ins), coalesce((SELECT max(lease_expires) FROM upd), (SELECT max(lease_expires) FROM ins))," +
		" coalesce((SELECT wait_ms FROM gate) <> 0 AND $8::timestamptz > now(), false)"
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

	// qSetLockTimeout bounds how long a set's transaction waits for a
	// port another transaction holds uncommitted: far longer than a set
	// of free ports takes to commit, far shorter than the deadlock check.
	qSetLockTimeout = "SET LOCAL lock_timeout = '100ms'"

	qLeases = "SELECT p.protocol, p.port, host(p.address), p.holder, p.label, coalesce(h.host_id, ''), p.lease_expires, p.created_at" +
		" FROM berth_port_allocations p LEFT JOIN berth_hosts h USING (host_no)" +
		" WHERE p.owner_kind = 'lease' ORDER BY p.holder, p.protocol, p.port, p.address"
)

// DefaultFleetTTL is the lease of a fleet-wide reservation when the
// request's TTL is zero.
const DefaultFleetTTL = 5 * time.Minute

// MaxFleetSet is the most ports one ReserveFleetSet reserves.
const MaxFleetSet = 1024

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
	// Band is where the port is drawn from, from a random port of it
	// onwards (see ReserveFleet): a band of the caller's own for
	// fleet-wide ports, apart from the ranges hosts hand out to processes,
	// so that per-host grants rarely stand in the way (a port any host
	// holds is skipped). Required.
	Band store.Range
	// Holder names the owner, e.g. "pod/default/web-0": at most 255
	// bytes, no control characters. Required.
	Holder string
	// Label is stored with the row, as a Request's.
	Label string
	// TTL is how long the lease lasts from the grant, by the store's
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
	// Expires is when the lease runs out, by the store's clock (the
	// PostgreSQL server's): compare it with the server's time, not the
	// local clock.
	Expires time.Time
	Created time.Time
}

// ReserveFleet reserves for req.Holder, under a lease of req.TTL, a port
// of req.Band that is free on every host: a row of no host,
// which the exclusion constraint keeps out of every host's way and every
// host's out of its way. The search starts at a random port of the band
// and goes up, wrapping round to its first port, so controllers that
// reserve at the same moment rarely want the same port (all starting at
// the lowest, each but one would lose the race for it and try again); it
// is still one round trip, and it still visits every port of the band,
// so a band with no free port is told apart exactly. No process of any
// host can reserve the port
// while the row lasts; a process Reserve or Scan that meets it gets a
// *store.ConflictError whose holder is the named holder (Owner.Holder).
//
// The row lasts until ReleaseFleet, or until its lease runs out unless
// RenewFleet extends it: then the Reap and the sweep of any host delete
// it. A band with no port free everywhere is an error wrapping
// store.ErrExhausted. The Store's own host plays no part.
func (s *Store) ReserveFleet(ctx context.Context, req FleetRequest) (FleetReservation, error) {
	key, ttl, err := checkFleet(&req)
	if err != nil {
		return FleetReservation{}, err
	}
	op := fmt.Sprintf("reserve a fleet-wide %s port on %s in %d-%d for %s", key.Protocol, key.Addr, req.Band.First, req.Band.Last, strconv.Quote(req.Holder))
	reaped := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		port, created, expires, ok, wait, err := s.fleetOnce(ctx, op, key, req, ttl)
		switch {
		case err != nil:
			return FleetReservation{}, err
		case wait != 0:
			if err := s.waitGrace(ctx, op, wait); err != nil {
				return FleetReservation{}, err
			}
			attempt-- // the grace period is over: not an attempt
			continue
		case ok:
			key.Port = port
			r := FleetReservation{Key: key, Holder: req.Holder, Label: req.Label, Created: created, Expires: expires}
			s.book.lease(r)
			return r, nil
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

// checkFleet validates req, filling in its default address, and returns
// its key (port 1: the search sets it) and lease.
func checkFleet(req *FleetRequest) (store.Key, time.Duration, error) {
	if req.Addr == (netip.Addr{}) {
		req.Addr = netip.IPv4Unspecified()
	}
	key, err := store.Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}.Normalize()
	if err != nil {
		return store.Key{}, 0, err
	}
	if req.Band.First == 0 || req.Band.Last < req.Band.First {
		return store.Key{}, 0, &store.FieldError{Field: "band", Value: fmt.Sprintf("%d-%d", req.Band.First, req.Band.Last),
			Want: "a band of ports First to Last, 1 <= First <= Last <= 65535"}
	}
	if err := checkHolder(req.Holder); err != nil {
		return store.Key{}, 0, err
	}
	if err := store.CheckLabel(req.Label); err != nil {
		return store.Key{}, 0, err
	}
	ttl, err := leaseTTL(req.TTL)
	if err != nil {
		return store.Key{}, 0, err
	}
	return key, ttl, nil
}

// ReserveFleetSet reserves a port for each of reqs, all of them or none:
// the ports of a set of named ports for one holder (every request's
// Holder must be the same), each drawn as ReserveFleet draws one, from
// its own request's Band, Protocol and Addr, under its own TTL. The ports
// are granted in one transaction: when one of them cannot be had, the
// transaction rolls back and no row of the set is left behind. Ports are
// distinct wherever they would conflict (two requests of one protocol on
// one band get two ports). It returns the reservations in the order of
// reqs.
//
// A band with no port free for some request is an error wrapping
// store.ErrExhausted that names the request; as with ReserveFleet, lapsed
// leases are reaped once before that is decided. A set that loses races
// to concurrent reservations (another transaction took a port between
// this one's look and its insert, or kept one uncommitted for longer
// than 100ms, as two sets that want each other's next port do) is tried
// again, whole, from other random ports, up to a bound; past it the
// error wraps store.ErrBusy. One round trip per port, plus
// BEGIN and COMMIT, when nothing is in the way.
func (s *Store) ReserveFleetSet(ctx context.Context, reqs []FleetRequest) ([]FleetReservation, error) {
	if len(reqs) == 0 || len(reqs) > MaxFleetSet {
		return nil, &store.FieldError{Field: "set", Value: fmt.Sprintf("%d ports", len(reqs)), Want: fmt.Sprintf("1 to %d ports (MaxFleetSet)", MaxFleetSet)}
	}
	reqs = slices.Clone(reqs)
	keys := make([]store.Key, len(reqs))
	ttls := make([]time.Duration, len(reqs))
	for i := range reqs {
		var err error
		if keys[i], ttls[i], err = checkFleet(&reqs[i]); err != nil {
			return nil, fmt.Errorf("port %d of the set: %w", i, err)
		}
		if reqs[i].Holder != reqs[0].Holder {
			return nil, &store.FieldError{Field: fmt.Sprintf("holder of port %d of the set", i), Value: reqs[i].Holder,
				Want: strconv.Quote(reqs[0].Holder) + ", the holder of the set's first port: a set has one holder"}
		}
	}
	op := fmt.Sprintf("reserve a fleet-wide set of %d ports for %s", len(reqs), strconv.Quote(reqs[0].Holder))
	reaped := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		out, full, wait, err := s.fleetSetOnce(ctx, op, keys, reqs, ttls)
		switch {
		case err != nil:
			return nil, err
		case wait != 0:
			if err := s.waitGrace(ctx, op, wait); err != nil {
				return nil, err
			}
			attempt-- // the grace period is over: not an attempt
			continue
		case full < 0:
			for _, r := range out {
				s.book.lease(r)
			}
			return out, nil
		case out == nil && full == len(reqs):
			continue // a race lost: the whole set again
		case !reaped:
			reaped = true
			n, err := s.reapLeases(ctx)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				continue
			}
		}
		r := reqs[full]
		return nil, fmt.Errorf("%s: %w: no port of the band %d-%d is free on every host for port %d of the set (%s on %s, label %s); nothing was reserved: widen the band or release fleet-wide reservations",
			op, store.ErrExhausted, r.Band.First, r.Band.Last, full, keys[full].Protocol, keys[full].Addr, strconv.Quote(r.Label))
	}
	return nil, fmt.Errorf("%s: %w: lost the race for its ports %d times; nothing was reserved; try again", op, store.ErrBusy, maxAttempts)
}

// fleetSetOnce tries to grant the set in one transaction. It returns the
// reservations and -1; or nil and the index of the first request whose
// band had no free port (the transaction rolled back); or nil and
// len(reqs) when a race was lost and the whole set should be tried again;
// or nil and the gate's wait when a grace period holds grants (see
// qGate).
func (s *Store) fleetSetOnce(ctx context.Context, op string, keys []store.Key, reqs []FleetRequest, ttls []time.Duration) ([]FleetReservation, int, int64, error) {
	if err := s.grantable(); err != nil {
		return nil, 0, 0, fmt.Errorf("%s: %w", op, err)
	}
	// One deadline for the transaction: a port per round trip.
	cctx, cancel := context.WithTimeout(ctx, s.timeout*time.Duration(min(len(reqs), 10)+2))
	defer cancel()
	out := make([]FleetReservation, len(reqs))
	full := -1
	var wait int64
	err := pgx.BeginFunc(cctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(cctx, qSetLockTimeout); err != nil {
			return err
		}
		for i, req := range reqs {
			key := keys[i]
			granted := false
			for range maxAttempts {
				var (
					port             *int32
					created, expires *time.Time
				)
				err := tx.QueryRow(cctx, qFleetReserve, string(key.Protocol), key.Addr.String(), int32(req.Band.First), int32(req.Band.Last),
					req.Holder, ttls[i].Milliseconds(), req.Label, s.bandStart(req.Band)).Scan(&wait, &port, &created, &expires)
				switch {
				case err != nil:
					return err
				case wait != 0:
					return errSetGated
				case port == nil:
					full = i
					return errSetFull
				case created == nil || expires == nil:
					continue // a port committed by another meanwhile: look again
				}
				key.Port = uint16(*port)
				out[i] = FleetReservation{Key: key, Holder: req.Holder, Label: req.Label, Created: *created, Expires: *expires}
				granted = true
				break
			}
			if !granted {
				return errSetRace
			}
		}
		return nil
	})
	switch {
	case err == nil:
		return out, -1, 0, nil
	case errors.Is(err, errSetGated):
		return nil, 0, wait, nil
	case errors.Is(err, errSetFull):
		return nil, full, 0, nil
	case errors.Is(err, errSetRace), isExclusion(err), isLockWait(err):
		// A port another transaction inserted but has not committed is
		// waited for; two sets that took each other's next port would
		// wait for each other until the server's deadlock check (a
		// second by default). lock_timeout cuts such waits short, and the
		// set starts again from other random ports.
		return nil, len(reqs), 0, nil
	}
	return nil, 0, 0, s.fail(ctx, op, err)
}

// errSetFull, errSetRace and errSetGated roll a set's transaction back: a
// band had no free port, a port was lost to other transactions too often,
// or a grace period holds grants.
var (
	errSetFull  = errors.New("a band of the set has no free port")
	errSetRace  = errors.New("lost the race for a port of the set")
	errSetGated = errors.New("grants are paused")
)

// isLockWait reports whether err is a set's transaction that waited too
// long for another one: lock_timeout ran out, or the server found the two
// waiting for each other.
func isLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.LockNotAvailable || pgErr.Code == pgerrcode.DeadlockDetected)
}

// fleetOnce runs qFleetReserve: the port granted and true; a port that was
// free but lost to a concurrent insert and false; port 0 when the band
// has no free port; or the gate's wait when a grace period holds grants
// (see qGate).
func (s *Store) fleetOnce(ctx context.Context, op string, key store.Key, req FleetRequest, ttl time.Duration) (uint16, time.Time, time.Time, bool, int64, error) {
	if err := s.grantable(); err != nil {
		return 0, time.Time{}, time.Time{}, false, 0, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	var (
		wait             int64
		port             *int32
		created, expires *time.Time
	)
	err := s.pool.QueryRow(cctx, qFleetReserve, string(key.Protocol), key.Addr.String(), int32(req.Band.First), int32(req.Band.Last),
		req.Holder, ttl.Milliseconds(), req.Label, s.bandStart(req.Band)).Scan(&wait, &port, &created, &expires)
	switch {
	case isExclusion(err):
		return 1, time.Time{}, time.Time{}, false, 0, nil // a race lost; which port does not matter
	case err != nil:
		return 0, time.Time{}, time.Time{}, false, 0, s.fail(ctx, op, err)
	case wait != 0:
		return 0, time.Time{}, time.Time{}, false, wait, nil
	case port == nil:
		return 0, time.Time{}, time.Time{}, false, 0, nil
	case created == nil || expires == nil:
		return uint16(*port), time.Time{}, time.Time{}, false, 0, nil
	}
	return uint16(*port), *created, *expires, true, 0, nil
}

// RenewFleet extends holder's lease on its reservation of key, fleet-wide
// or narrowed, to ttl from now by the server's clock (zero ttl:
// DefaultFleetTTL). Renew every third of the TTL or so, so that a slow
// round trip does not let it run out. A lease that has run out but whose
// row no reaping has deleted yet is renewed too: its port never changed
// hands. No such row of holder's (another holder's row included) is an
// error wrapping store.ErrNotFound: the port may be someone else's now;
// reserve again.
//
// It is also the holder's re-assertion after a change of server: in the
// grace period that follows one (see the package doc), a row the change
// lost is put back, with the label and host it had, when it was granted,
// renewed or narrowed through this Store and its lease had not run out,
// unless another row now holds the port: then the error wraps
// store.ErrGrace, and the renewal is to be tried again (it is most likely
// a row released before the change, which the change brought back and
// its holder releases again; this Store does so for the leases released
// through it). A holder's controller that
// keeps its Store open, calls Check every second or so and renews every
// lease it holds when Check reports store.ErrLost keeps its ports across
// a failover.
func (s *Store) RenewFleet(ctx context.Context, key store.Key, holder string, ttl time.Duration) error {
	key, err := checkLease(key, holder)
	if err != nil {
		return err
	}
	if ttl, err = leaseTTL(ttl); err != nil {
		return err
	}
	op := "renew the lease of " + strconv.Quote(holder) + " on " + key.String()
	if err := s.open(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	known, ok := s.book.leaseOf(key, holder)
	var until *time.Time // no re-assertion of a lease unknown here
	if ok {
		until = &known.Expires
	}
	var (
		renewed, restored int64
		expires           *time.Time
		restoring         bool
	)
	cctx, cancel := s.call(ctx)
	defer cancel()
	err = s.pool.QueryRow(cctx, qFleetRenew, string(key.Protocol), int32(key.Port), key.Addr.String(), holder, ttl.Milliseconds(), known.Host, known.Label, until).
		Scan(&renewed, &restored, &expires, &restoring)
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if renewed+restored == 0 && restoring {
		// In a grace period no port is granted anew: a row the change
		// brought back, released before it, holds the port; its holder
		// releases it again.
		return fmt.Errorf("%s: %w", op, &graceError{Blocked: errors.New("another row holds the port")})
	}
	if renewed+restored == 0 || expires == nil {
		s.book.unlease(key, holder)
		return fmt.Errorf("%s: %w: it was released or its lease ran out and was reaped; reserve again", op, store.ErrNotFound)
	}
	known.Key, known.Holder, known.Expires = key, holder, *expires
	s.book.lease(known)
	if restored > 0 {
		s.log.Info("put back a fleet-wide reservation a change of server had lost, renewed by its holder in the grace period",
			"holder", holder, "key", key.String())
		s.reassertNow(ctx)
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
	s.book.releaseLease(key, holder)
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
	if err := s.grantable(); err != nil {
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
		s.book.narrow(key, holder, host)
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

// bandStart returns where a search of band starts: an offset from its
// first port, drawn at random (or by Store.fleetStart, in tests).
func (s *Store) bandStart(band store.Range) int32 {
	n := int(band.Last) - int(band.First) + 1
	if s.fleetStart != nil {
		return int32(s.fleetStart(n) % n)
	}
	return int32(rand.IntN(n))
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
