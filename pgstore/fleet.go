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

// Fleet-wide reservations (see the package doc). Every lease time is the
// server's: set as now() + ttl and compared with now() in SQL.
const (
	// qFleetReserve grants the first port of the band $3..$4, going up
	// from $3 + $8 and wrapping round, that no row of any host holds for an
	// address conflicting with $2, as a row of no host held by $5 until $6
	// ms from now. The walk visits every port of the band once, so "no
	// row" means exactly that the band is exhausted. See fleetQuery for
	// what it returns.
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

	// leaseMatch picks holder $4's lease row of key $1..$3.
	leaseMatch = "owner_kind = 'lease' AND protocol = $1 AND port = $2 AND address = $3::inet AND holder = $4"

	// qFleetRenew renews holder $4's lease of the key to $5 ms from now.
	// A row missing in a grace period is put back when its lease, as known
	// to this Store, ends after now ($8), on host $6 (or none) with label
	// $7. It returns the rows renewed and put back, the lease's new end,
	// and whether the row was to be put back.
	qFleetRenew = "WITH " + qGate + "," +
		" upd AS (UPDATE berth_port_allocations SET lease_expires = now() + $5::bigint * interval '1 millisecond' WHERE " + leaseMatch + " RETURNING lease_expires)," +
		" ins AS (INSERT INTO berth_port_allocations (host_no, protocol, port, address, owner_kind, holder, lease_expires, label, kind)" +
		" SELECT (SELECT host_no FROM berth_hosts WHERE host_id = $6), $1, $2, $3::inet, 'lease', $4, now() + $5::bigint * interval '1 millisecond', $7, 'dynamic'" +
		" WHERE NOT EXISTS (SELECT 1 FROM upd) AND (SELECT wait_ms FROM gate) <> 0 AND $8::timestamptz > now()" +
		" ON CONFLICT DO NOTHING RETURNING lease_expires)" +
		" SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM ins), coalesce((SELECT max(lease_expires) FROM upd), (SELECT max(lease_expires) FROM ins))," +
		" coalesce((SELECT wait_ms FROM gate) <> 0 AND $8::timestamptz > now(), false)"
	qFleetRelease = "DELETE FROM berth_port_allocations WHERE " + leaseMatch

	// qHostSeen registers host $1, unknown yet, with an ended lease for its berth to renew.
	qHostSeen = "INSERT INTO berth_hosts (host_id, expires_at) VALUES ($1, now()) ON CONFLICT (host_id) DO NOTHING"
	// qFleetNarrow moves holder $4's row of the key to host $5 (idempotent when there already).
	qFleetNarrow = "UPDATE berth_port_allocations p SET host_no = h.host_no FROM berth_hosts h" +
		" WHERE h.host_id = $5 AND (p.host_no IS NULL OR p.host_no = h.host_no) AND p." + leaseMatch
	// qFleetWhere names the host holder $4's row of the key is on.
	qFleetWhere = "SELECT coalesce(h.host_id, '') FROM berth_port_allocations p LEFT JOIN berth_hosts h USING (host_no)" +
		" WHERE p." + leaseMatch

	qReapLeases = "DELETE FROM berth_port_allocations WHERE owner_kind = 'lease' AND lease_expires < now()"

	// qSetLockTimeout bounds a set's wait for a port held uncommitted: far shorter than the deadlock check.
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

// FleetRequest asks ReserveFleet for a port.
type FleetRequest struct {
	// Protocol is tcp or udp; required.
	Protocol store.Protocol
	// Addr is the address the holder will bind; zero: 0.0.0.0, which
	// under berth's conflict rule takes the port on every address.
	Addr netip.Addr
	// Band is where the port is drawn from (see ReserveFleet): best a
	// band apart from the ranges hosts hand out to processes, so that
	// per-host grants rarely stand in the way. Required.
	Band store.Range
	// Holder names the owner, e.g. "pod/default/web-0"; required.
	Holder string
	// Label is stored with the row, as a Request's.
	Label string
	// TTL is how long the lease lasts from the grant; zero:
	// DefaultFleetTTL.
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
	// clock, not the local one.
	Expires time.Time
	Created time.Time
}

// ReserveFleet reserves for req.Holder, under a lease of req.TTL, a port
// of req.Band that is free on every host: a row of no host. The search,
// one round trip, starts at a random port of the band and goes up,
// wrapping round, so controllers that reserve at the same moment rarely
// want the same port. While the row lasts, a process Reserve or Scan of
// any host that meets it gets a *store.ConflictError whose holder is the
// named holder (Owner.Holder).
//
// The row lasts until ReleaseFleet, or until its lease runs out unless
// RenewFleet extends it. A band with no port free everywhere is an error
// wrapping store.ErrExhausted.
func (s *Store) ReserveFleet(ctx context.Context, req FleetRequest) (FleetReservation, error) {
	key, ttl, err := checkFleet(&req)
	if err != nil {
		return FleetReservation{}, err
	}
	op := fmt.Sprintf("reserve a fleet-wide %s port on %s in %d-%d for %s", key.Protocol, key.Addr, req.Band.First, req.Band.Last, strconv.Quote(req.Holder))
	reaped := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := s.grantable(); err != nil {
			return FleetReservation{}, fmt.Errorf("%s: %w", op, err)
		}
		cctx, cancel := s.call(ctx)
		wait, port, created, expires, err := s.fleetQuery(cctx, s.pool, key, req, ttl)
		cancel()
		switch {
		case isExclusion(err):
			continue // a race lost; which port does not matter
		case err != nil:
			return FleetReservation{}, s.fail(ctx, op, err)
		case wait != 0:
			if err := s.waitGrace(ctx, op, wait); err != nil {
				return FleetReservation{}, err
			}
			attempt-- // the grace period is over: not an attempt
			continue
		case port != nil && created != nil && expires != nil:
			key.Port = uint16(*port)
			r := FleetReservation{Key: key, Holder: req.Holder, Label: req.Label, Created: *created, Expires: *expires}
			s.book.lease(r)
			return r, nil
		case port != nil:
			continue // a race lost for port: the next free one
		case !reaped:
			// Lapsed leases may stand in the way: reap, look once more.
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
// its key (port 1) and lease.
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

// ReserveFleetSet reserves a port for each of reqs, all of them or none,
// in one transaction: the ports of a set of named ports for one holder
// (every request's Holder must be the same), each drawn as ReserveFleet
// draws one, from its own request's Band, Protocol and Addr, under its own
// TTL. Ports are distinct wherever they would conflict. It returns the
// reservations in the order of reqs.
//
// A band with no port free for some request is an error wrapping
// store.ErrExhausted that names the request (lapsed leases are reaped once
// before that is decided). A set that loses races to concurrent
// reservations (or waits more than 100ms for a port another transaction
// holds uncommitted) is tried again, whole, up to a bound; past it the
// error wraps store.ErrBusy.
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

// fleetSetOnce tries the set in one transaction: the reservations and -1; or nil and the index
// of the first request whose band had no free port, or len(reqs) for a race lost; or the gate's wait.
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
				w, port, created, expires, err := s.fleetQuery(cctx, tx, key, req, ttls[i])
				wait = w
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
		// Two sets that took each other's next port would wait for each
		// other until the server's deadlock check; lock_timeout cuts such
		// waits short, and the set starts again from other random ports.
		return nil, len(reqs), 0, nil
	}
	return nil, 0, 0, s.fail(ctx, op, err)
}

// These roll a set's transaction back.
var (
	errSetFull  = errors.New("a band of the set has no free port")
	errSetRace  = errors.New("lost the race for a port of the set")
	errSetGated = errors.New("grants are paused")
)

func isLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.LockNotAvailable || pgErr.Code == pgerrcode.DeadlockDetected)
}

// fleetQuery runs qFleetReserve: the gate's wait, and the free port found (nil: none)
// with its row's creation and lease's end (nil: a race lost for the port).
func (s *Store) fleetQuery(ctx context.Context, q querier, key store.Key, req FleetRequest, ttl time.Duration) (
	wait int64, port *int32, created, expires *time.Time, err error) {
	err = q.QueryRow(ctx, qFleetReserve, string(key.Protocol), key.Addr.String(), int32(req.Band.First), int32(req.Band.Last),
		req.Holder, ttl.Milliseconds(), req.Label, s.bandStart(req.Band)).Scan(&wait, &port, &created, &expires)
	return wait, port, created, expires, err
}

// RenewFleet extends holder's lease on its reservation of key, fleet-wide
// or narrowed, to ttl from now by the server's clock (zero ttl:
// DefaultFleetTTL). Renew every third of the TTL or so. A lease that has
// run out but whose row no reaping has deleted yet is renewed too. No such
// row of holder's is an error wrapping store.ErrNotFound: the port may be
// someone else's now; reserve again.
//
// It is also the holder's re-assertion after a change of server: in the
// grace period (see the package doc), a row the change lost is put back
// as it was when it was granted, renewed or narrowed through this Store
// and its lease had not run out, unless another row now holds the port:
// then the error wraps store.ErrGrace, and the renewal is to be tried
// again. A controller that keeps its Store open, calls Check every second
// or so and renews every lease it holds when Check reports store.ErrLost
// keeps its ports across a failover.
func (s *Store) RenewFleet(ctx context.Context, key store.Key, holder string, ttl time.Duration) error {
	key, err := checkLease(key, holder)
	if err != nil {
		return err
	}
	if ttl, err = leaseTTL(ttl); err != nil {
		return err
	}
	op := "renew the lease of " + strconv.Quote(holder) + " on " + key.String()
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
	if err := s.queryRow(ctx, op, qFleetRenew, []any{string(key.Protocol), int32(key.Port), key.Addr.String(), holder, ttl.Milliseconds(),
		known.Host, known.Label, until}, &renewed, &restored, &expires, &restoring); err != nil {
		return err
	}
	if renewed+restored == 0 && restoring {
		// No port is granted anew in a grace period: a row the change brought back,
		// released before it, holds the port; its holder releases it again.
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
// narrowed to a host, e.g. in a pod's finalizer. No such row of holder's
// is an error wrapping store.ErrNotFound.
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
// every other host and stays taken on host, still the holder's under its
// lease. It never conflicts: the fleet-wide row excluded the port on host
// already.
//
// host is a name as Options.Host takes it; one no berth of which has
// opened a store yet is registered (check the name: a misspelt one holds
// the port on a host that does not exist). Narrowing to the host the row
// is on already does nothing; a row narrowed to another host is an error
// wrapping store.ErrInvalid (release it and reserve again). No such row
// of holder's is an error wrapping store.ErrNotFound.
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

// Leases returns every reservation held under a lease, ordered by holder,
// protocol, port and address, those run out included until reaped.
func (s *Store) Leases(ctx context.Context) ([]FleetReservation, error) {
	return query(ctx, s, s.open, "list leases", func(r pgx.CollectableRow) (FleetReservation, error) {
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
	}, qLeases)
}

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

// bandStart returns where a search of band starts: a random offset.
func (s *Store) bandStart(band store.Range) int32 {
	n := int(band.Last) - int(band.First) + 1
	if s.fleetStart != nil {
		return int32(s.fleetStart(n) % n)
	}
	return int32(rand.IntN(n))
}

func checkLease(key store.Key, holder string) (store.Key, error) {
	key, err := key.Normalize()
	if err != nil {
		return store.Key{}, err
	}
	return key, checkHolder(holder)
}

func checkHolder(h string) error {
	return checkName("holder", h, h != "", `the holder's name, 1 to 255 bytes, e.g. "pod/default/web-0"`)
}

// maxFleetTTL bounds a lease against unit mistakes (hours for seconds).
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
