// Package pgstore keeps berth's port reservations in PostgreSQL, so that
// the berth processes of many hosts share one store: the first part of
// berth's fleet mode. A Store implements store.Store for one host, named
// by Options.Host; the rows of every host live in the same tables.
//
// # The conflict rule in the database
//
// Every reservation row carries its host, and the table's exclusion
// constraint enforces package store's conflict rule by itself: no two rows
// of one host, protocol and port whose addresses conflict (equal, or
// either a wildcard). The ranges it compares are generated from the row's
// own host and address, so no writer, berth or a buggy script, can store
// a double grant.
//
// # Owners and hosts
//
// An owner is a process of the Store's host (for others see Fleet-wide
// reservations). A row of this host whose owner has exited is deleted when
// it stands in the way, by Reap, and by the background sweep. Another
// host's processes cannot be seen from here: its rows are never judged one by one.
//
// Each host holds a lease in berth_hosts, renewed every third of
// Options.LeaseTTL, by the server's clock. A lapsed lease makes a host
// unknown, not dead: a partitioned host keeps its sockets. So another
// host's rows are deleted only by Retire (berth host retire), for a host
// that is gone for good, or by the Reap and background sweep of another
// host once the host's lease ended more than Options.ReapAfter (default
// a day) ago: stale rows cost capacity, wrong deletions correctness.
// Retire refuses a host whose lease is live (an error wrapping
// store.ErrInvalid), unless forced (RetireOptions.Force).
//
// The lease records the boot id of the machine that holds it. Open under
// a name whose lease is live and held by another boot fails with an error
// wrapping store.ErrInvalid and changes nothing: most likely a second
// machine configured with the same name. Once that lease has run out, a
// new boot takes the name over: a reboot, whose first Store deletes the
// old boot's rows.
//
// A host that comes back learns at its next Open or lease renewal how many of its
// rows were deleted either way: the Store logs an error and adds them to Stats.LostRows.
//
// # Fleet-wide reservations
//
// An owner whose host is not known yet (a pod not yet scheduled), or that
// is no process at all (a pod, a job), holds a port under a renewable
// lease instead: ReserveFleet draws it from a band of the caller's own as
// a row of no host, which the exclusion constraint keeps taken on every
// host; ReserveFleetSet draws the ports of a set for one holder, all of
// them or none. NarrowFleet gives such a row its host once that is known.
// The holder's controller renews the lease (RenewFleet) and releases the
// port (ReleaseFleet); a lease that runs out, by the server's clock, is
// deleted by the Reap and the sweep of any host. Neither Retire nor the
// reaping of lapsed hosts deletes lease rows. List shows process rows
// only; Leases lists the lease rows.
//
// # Failures
//
// An error from the server, a lost connection or a server that does not
// answer within Options.Timeout wraps store.ErrStorage and names the
// operation and the store (by its DSN, the password hidden: no error or
// log line of a Store shows it). A call cut short by its context returns
// the context's error. Either way an insert the server had received may
// still commit: that reservation stays, owned by the caller, until
// released or reaped, so a retry elsewhere wastes a port but never shares
// one.
//
// # Failover
//
// A multi-host connection string with target_session_attrs=read-write
// follows a failover to a promoted standby: the calls on connections that
// died with the old primary fail (store.ErrStorage), the next ones
// connect to the new one. An asynchronous standby loses the commits it
// had not received (so do a crash with synchronous_commit off and a
// restore from backup). A Store notices a connection to another or a
// restarted server, registers its host again when its row is gone, and
// reports through Check, then and at every lease renewal, that its
// holders are to put back what is missing; portalloc's Allocator does so.
//
// # Grace period
//
// After any change of server the database pauses grants until the holders
// have put back what the change may have lost: every grant statement
// refuses, in its own statement, any port that is not already the
// asker's, but lets a holder's re-assertion through (Reserve with
// store.Request.Restore, RenewFleet). Any other grant waits within its
// context and then fails with an error wrapping store.ErrGrace. The
// period ends once every open Store of the fleet has its rows back (a
// second after the change at the earliest), or after the longest
// Options.Grace of the open Stores. Grace reports it.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgdsn "github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/store"
)

// Options tune a Store. The zero value of every field is a working default.
type Options struct {
	// Host is this host's stable name in the fleet; zero: the hostname.
	// It must name one machine: two machines under one name would take
	// each other's owners for exited and hand their ports out again, so
	// Open refuses a name whose lease another boot holds (see BootID).
	Host string
	// Logger receives the store's log; zero: discard.
	Logger logr.Logger
	// Timeout bounds each round trip to the server; a server that does
	// not answer in time fails the call with store.ErrStorage. Zero: 10s.
	Timeout time.Duration
	// SweepInterval is the period of the background reaping sweep of this
	// host's rows, which also runs right after Open; zero: 1 minute;
	// negative: no sweep.
	SweepInterval time.Duration
	// LeaseTTL is how long the host's lease lasts past each renewal; the
	// store renews it every third of it. Zero: 30s; negative: no renewal
	// after Open.
	LeaseTTL time.Duration
	// ReapAfter is how long after another host's lease ended, by the
	// server's clock, this store's Reap and sweep delete that host's rows;
	// zero: 24h; negative: never (only Retire deletes them).
	ReapAfter time.Duration
	// Grace is the longest pause of grants after a change of the server
	// (see "Grace period" in the package doc). Zero: a third of LeaseTTL
	// (the longest a live Store takes to notice the change) plus 5s (for
	// its holders to put back what they hold); at least a third of
	// LeaseTTL plus 2s, at most 10 minutes.
	Grace time.Duration
	// BootID identifies this machine's current boot, recorded with the
	// host's lease (see Host). Zero: this machine's boot id (Linux
	// /proc/sys/kernel/random/boot_id), or none where the system has none,
	// which turns the check off. Tests set it to play two machines.
	BootID string
}

// Store is an open PostgreSQL store for one host. Its zero value is not
// usable; call Open. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	log      logr.Logger
	self     store.Owner
	host     string
	bootID   string // Options.BootID, recorded with the host's lease
	timeout  time.Duration
	name     string         // "PostgreSQL store " and the DSN, its password hidden: for messages
	scrub    pgdsn.Scrubber // hides the DSN's password in errors
	reap     time.Duration  // Options.ReapAfter; negative: no reaping of lapsed hosts
	grace    time.Duration  // Options.Grace
	session  string         // this Store's row in berth_sessions (see grace.go)
	sessTTL  time.Duration
	book     ledger
	watchCfg *pgx.ConnConfig // connects watch's connection; nil: none

	closed   atomic.Bool
	guardErr atomic.Pointer[guardError] // set while grants are refused: see guard.go
	life     context.Context            // the background goroutines' context, until Close
	stop     context.CancelFunc         // Close's end of life
	wg       sync.WaitGroup             // the background goroutine

	remembered    atomic.Int64 // Remember calls, to prune sticky ports now and then
	reaped        atomic.Int64
	probeFailures atomic.Int64
	lost          atomic.Int64 // rows of this host other hosts deleted, reported since Open

	num        atomic.Int32 // the host's number in berth_hosts; see hostNo
	losses                  // what Check reports: see failover.go
	graceState              // the server seen and re-asserted for: see grace.go

	// fleetStart, set by tests, replaces bandStart's random draw.
	fleetStart func(n int) int
}

var _ store.Store = (*Store)(nil)

// Open connects to the PostgreSQL database dsn names (a postgres:// URL or
// a key=value string; any other form is refused before connecting, with a
// *store.FieldError for "dsn" that never shows the password), brings
// berth's tables up to date (the embedded migrations; concurrent Opens
// apply them once) and registers this host. A database whose berth schema
// is newer than this berth's is refused with an error wrapping
// store.ErrSchemaTooNew.
//
// The role needs to create tables, and the btree_gist extension must be
// available (a trusted extension, in Debian's postgresql-contrib). The
// first migration creates it in the first schema of the search path;
// where that schema may be dropped, create it beforehand in one that
// stays (CREATE EXTENSION btree_gist SCHEMA public): dropping it drops
// the exclusion constraint of berth's table. A Store notices that at Open
// and at every lease renewal and puts the constraint back, or, when rows
// granted meanwhile conflict, grants nothing (store.ErrDamaged) until they
// are released.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	if opts.ReapAfter == 0 {
		opts.ReapAfter = 24 * time.Hour
	}
	grace, err := checkGrace(opts.Grace, opts.LeaseTTL)
	if err != nil {
		return nil, err
	}
	if opts.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("open: name this host: %w; set Options.Host", err)
		}
		opts.Host = h
	}
	if err := checkHost(opts.Host); err != nil {
		return nil, err
	}
	if opts.BootID == "" {
		opts.BootID = owner.BootID()
	}
	if len(opts.BootID) > 255 {
		return nil, &store.FieldError{Field: "boot id", Value: opts.BootID, Want: "a boot id of at most 255 bytes"}
	}
	self, err := store.Self()
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	var bad *pgdsn.Error
	if err := pgdsn.Check(dsn); errors.As(err, &bad) {
		return nil, fmt.Errorf("open: %w", &store.FieldError{Field: "dsn", Value: pgdsn.Redact(dsn), Want: pgdsn.Forms + "; " + bad.Reason})
	} else if err != nil {
		return nil, fmt.Errorf("open: dsn %s: %w", pgdsn.Redact(dsn), err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgconn hides passwords only as far as it recognises them, and
		// its error keeps the DSN whole in a field: only its message,
		// scrubbed, is kept.
		return nil, fmt.Errorf("open: %w", &store.FieldError{Field: "dsn", Value: pgdsn.Redact(dsn),
			Want: "a connection string pgx can read; " + pgdsn.NewScrubber(dsn).String(err.Error())})
	}
	s := &Store{
		name:    "PostgreSQL store " + pgdsn.Redact(dsn),
		scrub:   pgdsn.NewScrubber(dsn, cfg.ConnConfig.Password),
		log:     opts.Logger,
		self:    self,
		host:    opts.Host,
		bootID:  opts.BootID,
		timeout: opts.Timeout,
		reap:    opts.ReapAfter,
		grace:   grace,
		session: newSessionID(),
		sessTTL: openTTL(opts.LeaseTTL),
		book:    newLedger(),
	}
	if err := migrateUp(ctx, cfg.ConnConfig, opts.Timeout, opts.Logger, s.name); err != nil {
		return nil, s.scrub.Err(err)
	}
	cfg.AfterConnect = s.afterConnect
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, s.fail(ctx, "open", err)
	}
	if err := s.claim(ctx, "open: register host "+strconv.Quote(s.host), s.sessTTL); err != nil {
		s.pool.Close()
		return nil, err
	}
	s.life, s.stop = context.WithCancel(context.Background()) // it outlives Open's context; Close ends it
	if opts.SweepInterval > 0 || opts.LeaseTTL > 0 {
		s.wg.Add(1)
		go s.background(opts.SweepInterval, opts.LeaseTTL) //nolint:contextcheck // it outlives Open's context; Close stops it
	}
	if opts.LeaseTTL > 0 {
		// A Store that renews a lease lives long enough for a change of server to matter.
		s.watchCfg = cfg.ConnConfig.Copy()
		s.wg.Add(1)
		go s.watch() //nolint:contextcheck // it outlives Open's context; Close stops it
	}
	return s, nil
}

func checkHost(h string) error { return checkName("host", h, true, "a host name of at most 255 bytes") }

// checkName wants v ok, at most 255 bytes (else a *store.FieldError that wants want), with no control characters.
func checkName(field, v string, ok bool, want string) error {
	if !ok || len(v) > 255 {
		return &store.FieldError{Field: field, Value: v, Want: want}
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return &store.FieldError{Field: field, Value: v, Want: "a " + field + " name without control characters"}
		}
	}
	return nil
}

// hostNo is the host's number in berth_hosts, which its rows carry. It changes only when its
// registration was lost and its old number taken meanwhile (see register).
func (s *Store) hostNo() int32 { return s.num.Load() }

// Host returns the name of the host this store acts for.
func (s *Store) Host() string { return s.host }

// Close stops the background sweep and lease renewal and closes the
// connections; reservations stay their owners'. Close is idempotent.
//
// Close returns within Options.Timeout even when the server does not
// answer (pgx waits up to 15 seconds for the cancel request of a call that
// timed out): what is not closed by then goes on closing in the
// background, and Close returns an error that says so, wrapping
// store.ErrStorage.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stop()
	s.wg.Wait() // its calls end with the stop
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.endSession() // so that a grace period does not wait for it
		s.pool.Close() // waits for the connections in use to come back
	}()
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("close %s: %w: its connections did not close within %v (the server does not answer); they go on closing in the background", s.name, store.ErrStorage, s.timeout)
	}
}

// background renews the host's lease every third of ttl and reaps (Reap) every sweep, until Close.
func (s *Store) background(sweep, ttl time.Duration) {
	defer s.wg.Done()
	ctx := s.life
	var (
		renewC, sweepC <-chan time.Time // nil: never
		renewT         *time.Ticker
		sweepT         *time.Timer
		failing        bool // the last renewal failed: the next comes sooner
	)
	if ttl > 0 {
		renewT = time.NewTicker(ttl / 3)
		defer renewT.Stop()
		renewC = renewT.C
	}
	if sweep > 0 {
		sweepT = time.NewTimer(0)
		defer sweepT.Stop()
		sweepC = sweepT.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-renewC:
			err := s.claim(ctx, "renew lease of "+strconv.Quote(s.host), ttl)
			if err == nil && failing {
				failing = false
				renewT.Reset(ttl / 3)
			}
			if err != nil && ctx.Err() == nil {
				// Soon: a server that came back is to learn of this host within seconds.
				again := min(ttl/3, retryRenew)
				s.log.Error(err, "renewing this host's lease failed; it is tried again", "host", s.host, "in", again.String())
				renewT.Reset(again)
				failing = true
			}
		case <-sweepC:
			if _, err := s.Reap(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrClosed) {
				s.log.Error(err, "background reaping sweep failed; it runs again", "in", sweep.String())
			}
			sweepT.Reset(sweep)
		}
	}
}

// Stats returns the store's counters, taking no lock.
func (s *Store) Stats() store.Stats {
	return store.Stats{Reaped: s.reaped.Load(), ProbeFailures: s.probeFailures.Load(), LostRows: s.lost.Load()}
}

func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// fail turns a round trip's error into the store's: the caller's context's error, ErrClosed after
// Close, else one wrapping store.ErrStorage; each names the operation and the store, never the password.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %s: %w", op, s.name, ctx.Err())
	case s.closed.Load():
		return fmt.Errorf("%s: %w", op, store.ErrClosed)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w: %s did not answer within %v", op, store.ErrStorage, s.name, s.timeout)
	default:
		return s.scrub.Err(fmt.Errorf("%s: %w: %s: %w", op, store.ErrStorage, s.name, err))
	}
}

func (s *Store) open() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

func (s *Store) exec(ctx context.Context, op, q string, args ...any) (int64, error) {
	if err := s.open(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	tag, err := s.pool.Exec(cctx, q, args...)
	if err != nil {
		return 0, s.fail(ctx, op, err)
	}
	return tag.RowsAffected(), nil
}
