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
// either a wildcard). The ranges the constraint compares are generated
// from the row's own host and address, so no writer, berth or a buggy
// script, can store a double grant: the database refuses it.
//
// # Owners and hosts
//
// An owner is a process of the Store's host (for other owners see
// Fleet-wide reservations below). A row of this host whose
// owner has exited is deleted when it stands in the way of a reservation,
// by Reap, and by the background sweep; its liveness is judged exactly as
// the SQLite store judges it (store.Owner.Alive). The processes of another
// host cannot be seen from here, so its rows are never judged one by one.
//
// Each host holds a lease in berth_hosts, set and renewed (every third of
// Options.LeaseTTL) from the server's clock: every lease comparison is
// made in SQL against now(), never against the clock of a client. A
// lapsed lease makes a host unknown, not dead: a partitioned host keeps
// its sockets, and the children of an exited orchestrator keep the ports
// transferred to them. So another host's rows are deleted only
//
//   - by Retire (berth host retire), for a host that is gone for good,
//     or
//   - by the Reap and background sweep of another host, once the host's
//     lease ended more than Options.ReapAfter (default a day) ago.
//
// Stale rows cost capacity; wrong deletions cost correctness, hence the
// long default. Retire refuses a host whose lease is live (a
// *hostLiveError), unless forced (Retire with RetireOptions.Force). A host whose berth processes are all short commands has a
// lease only while one runs: its rows go ReapAfter after its last command.
//
// The lease records the boot id of the machine that holds it. Open under
// a name whose lease is live and held by another boot fails with a
// *hostInUseError and changes nothing: it is most likely a second machine
// configured with the same name, which would otherwise take the first
// one's processes for exited and hand their ports out again. Once that
// lease has run out (or the host was retired), a new boot takes the name
// over: a reboot, whose first Store deletes the old boot's rows.
//
// The host's row counts the rows deleted either way. A host that comes
// back learns the count when it next opens a Store or renews its lease:
// the Store logs an error and adds it to Stats.LostRows, and the host
// carries on with a fresh lease (a retired host included).
//
// # Fleet-wide reservations
//
// An owner whose host is not known yet (a pod not yet scheduled), or that
// is no process at all (a pod, a job), holds a port under a renewable
// lease instead: ReserveFleet draws it from a band of the caller's own as
// a row of no host, which the exclusion constraint keeps taken on every
// host, starting its search at a random port of the band so that
// controllers reserving at once rarely want the same port; ReserveFleetSet
// draws the several ports of a set for one holder in one transaction, all
// of them or none. NarrowFleet makes a row one of a host once that is
// known. The holder's controller renews the lease (RenewFleet) and
// releases the port (ReleaseFleet); a lease that runs out, by the server's clock, is deleted
// by the Reap and the sweep of any host. Lease rows are not judged by any
// process table, and neither Retire nor the reaping of lapsed hosts deletes them.
// List shows process rows only; Leases lists the lease rows of the fleet.
//
// # Failures
//
// An error from the server, a lost connection or a server that does not
// answer within Options.Timeout (a network partition looks like that)
// wraps store.ErrStorage, and names the operation and the store (by
// its DSN with the password hidden); the pool opens new connections for
// the calls after it. No error or log line of a Store shows the DSN's
// password: where pgx or the server quote it, it is replaced. A call cut short by its context returns the context's error.
// Either way an insert the server had already received may still commit:
// that reservation stays, owned by the caller, until released or reaped,
// so a caller that retries elsewhere wastes a port but never shares one.
// Reservations already granted are unaffected by a partition: they are
// rows, and the processes holding the ports go on.
//
// # Failover
//
// A Store connects through pgx, so a multi-host connection string with
// target_session_attrs=read-write follows a failover to a promoted
// standby; the calls on connections that died with the old primary fail
// (store.ErrStorage), the next ones connect to the new one. A synchronous
// standby (synchronous_standby_names, synchronous_commit on) loses
// nothing. An asynchronous one loses the commits it had not received:
// reservations of live holders, releases, a host's registration; so do a
// crash of a server with synchronous_commit off and a restore from
// backup. A Store notices a connection to another or a restarted server
// (at once: a Store that renews a lease keeps an idle connection that
// watches for it), registers its host again when its row is gone (under
// its old number when that is free, so nothing cached goes stale), and
// reports through Check, at those times and at every lease renewal, that
// its holders are to compare what they hold with the store and put back
// what is missing; portalloc's Allocator does so. See failover.go.
//
// # Grace period
//
// After any change of server the database pauses grants until the holders
// have put back what the change may have lost: the first transaction on
// the new server records it, and every grant statement (Reserve, Scan,
// ScanBlock, ReserveFleet, ReserveFleetSet) refuses, in its own
// statement, any port that is not already the asker's, so no client's
// timing matters. A holder's re-assertion goes through: Reserve with
// store.Request.Restore, and RenewFleet of a lease granted or renewed
// through the same Store. Any other grant waits within its context and
// then fails with an error wrapping store.ErrGrace; a Store whose own
// holders have yet to put their rows back refuses at once. The period
// ends once every open Store of the fleet has its rows back (a second
// after the change at the earliest), or after the longest Options.Grace
// of the open Stores. Grace reports it. See grace.go for what is covered
// and what is not.
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
	// It must name one machine: a Store judges the owners of its host's
	// rows by this machine's process table, so two machines under one
	// name would take each other's owners for exited (another boot) and
	// hand their ports out again. Open therefore refuses a name whose
	// lease another boot holds (see BootID).
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
	// (a failover, a restart, a restore): see "Grace period" in the
	// package doc. Zero: a third of LeaseTTL (the longest a live Store
	// takes to notice the change, at its lease renewal) plus 5s (for its
	// holders to put back what they hold); at least a third of LeaseTTL
	// plus 2s, at most 10 minutes. A change pauses grants for the longest
	// Grace of the fleet's live Stores.
	Grace time.Duration
	// BootID identifies this machine's current boot; it is recorded with
	// the host's lease, so that a machine whose Host is already held
	// under a live lease by another boot (another machine configured with
	// the same name) is refused with a *hostInUseError instead of taking
	// the other machine's processes for exited. Zero: this machine's boot
	// id (Linux /proc/sys/kernel/random/boot_id), or none where the system
	// has none, which turns the check off. Tests set it to play two
	// machines from one.
	BootID string
}

// Store is an open PostgreSQL store for one host. Its zero value is not
// usable; call Open. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	log     logr.Logger
	self    store.Owner
	host    string
	bootID  string // Options.BootID, recorded with the host's lease
	timeout time.Duration
	name    string         // "PostgreSQL store " and the DSN, its password hidden: for messages
	scrub   pgdsn.Scrubber // hides the DSN's password in errors
	ttl     time.Duration
	reap    time.Duration // Options.ReapAfter; negative: no reaping of lapsed hosts
	grace   time.Duration // Options.Grace
	// session is this Store's row in berth_sessions, sessTTL its lease;
	// book is what was granted through it (see grace.go).
	session string
	sessTTL time.Duration
	book    ledger
	// watchCfg connects the connection that watches for a change of
	// server (see watch); nil: none.
	watchCfg *pgx.ConnConfig

	closed   atomic.Bool
	guardErr atomic.Pointer[guardError] // set while grants are refused: see guard.go
	stop     chan struct{}              // closed by Close to end the background goroutine
	wg       sync.WaitGroup             // the background goroutine

	remembered    atomic.Int64 // Remember calls, to prune sticky ports now and then
	reaped        atomic.Int64
	probeFailures atomic.Int64
	lost          atomic.Int64 // rows of this host other hosts deleted, reported since Open

	num        atomic.Int32 // the host's number in berth_hosts; see hostNo
	losses                  // what Check reports: see failover.go
	graceState              // the server seen and re-asserted for: see grace.go

	// fleetStart, when set (by tests, before any call), picks the offset
	// in a band of n ports where ReserveFleet's search starts; nil: random.
	fleetStart func(n int) int
}

var _ store.Store = (*Store)(nil)

// Open connects to the PostgreSQL database dsn names (a postgres:// URL or
// a key=value string; a unix socket directory works as host; any other
// form is refused before connecting, with a *store.FieldError for "dsn"
// that never shows the password), brings
// berth's tables up to date and registers this host. The migrations are
// embedded; concurrent Opens apply them once, serialised by an advisory
// lock. A database whose berth schema is newer than this berth's is
// refused with an error wrapping store.ErrSchemaTooNew.
//
// The role needs to create tables, and the btree_gist extension must be
// available (in Debian's postgresql-contrib; it is a trusted extension,
// so a database owner may create it). The first migration creates it in
// the first schema of the search path; where that is a schema that may be
// dropped, create it beforehand in one that stays (CREATE EXTENSION
// btree_gist SCHEMA public): dropping the extension drops the exclusion
// constraint of berth's table. A Store notices that at Open and at every
// renewal of the host's lease and puts the constraint back, or, when rows
// granted meanwhile conflict, grants nothing (an error wrapping store.ErrDamaged) until they are
// released.
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
		opts.ReapAfter = defaultReapAfter
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
		ttl:     opts.LeaseTTL,
		reap:    opts.ReapAfter,
		grace:   grace,
		session: newSessionID(),
		sessTTL: openTTL(opts.LeaseTTL),
		stop:    make(chan struct{}),
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
	if opts.SweepInterval > 0 || opts.LeaseTTL > 0 {
		s.wg.Add(1)
		go s.background(opts.SweepInterval, opts.LeaseTTL) //nolint:contextcheck // it outlives Open's context; Close stops it
	}
	if opts.LeaseTTL > 0 {
		// A Store that renews a lease lives long enough for a change of
		// server to matter to it: it watches for one.
		s.watchCfg = cfg.ConnConfig.Copy()
		s.wg.Add(1)
		go s.watch() //nolint:contextcheck // it outlives Open's context; Close stops it
	}
	return s, nil
}

// checkHost validates a host name as the hosts table takes it.
func checkHost(h string) error {
	if len(h) > 255 {
		return &store.FieldError{Field: "host", Value: h, Want: "a host name of at most 255 bytes"}
	}
	for _, r := range h {
		if r < 0x20 || r == 0x7f {
			return &store.FieldError{Field: "host", Value: h, Want: "a host name without control characters"}
		}
	}
	return nil
}

// hostNo returns the host's number in berth_hosts: what its rows carry.
// It changes only when the host's registration was lost (a failover to a
// standby that had not received it, or the row deleted by hand) and its
// old number was taken meanwhile: see register.
func (s *Store) hostNo() int32 { return s.num.Load() }

// Host returns the name of the host this store acts for.
func (s *Store) Host() string { return s.host }

// Close stops the background sweep and lease renewal and closes the
// connections. It does not release reservations: they belong to their
// owners. Close is idempotent.
//
// Close returns within Options.Timeout even when the server does not
// answer: closing a connection whose call timed out sends the server a
// cancel request, which pgx waits up to 15 seconds for. What is not
// closed by then goes on closing in the background, and ends once the
// server answers, or after those 15 seconds; Close then returns an error
// that says so, wrapping store.ErrStorage.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
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

// background renews the host's lease every third of ttl and reaps every
// sweep (this host's rows of exited owners, other hosts' rows past
// ReapAfter), until Close.
func (s *Store) background(sweep, ttl time.Duration) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	never := make(<-chan time.Time)
	renewC, sweepC := never, never
	var (
		renewT  *time.Ticker
		failing bool // the last renewal failed: the next comes sooner
	)
	if ttl > 0 {
		renewT = time.NewTicker(ttl / 3)
		defer renewT.Stop()
		renewC = renewT.C
	}
	var sweepT *time.Timer
	if sweep > 0 {
		sweepT = time.NewTimer(0)
		defer sweepT.Stop()
		sweepC = sweepT.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-renewC:
			err := s.renew(ctx, ttl)
			if err == nil && failing {
				failing = false
				renewT.Reset(ttl / 3)
			}
			if err != nil && ctx.Err() == nil {
				// Tried again soon rather than a period later: a
				// server that came back (a failover) is to learn of
				// this host, and its holders to put back what they
				// hold, within seconds.
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

// renew extends the host's lease to ttl from now by the server's clock,
// and reports rows other hosts deleted meanwhile.
func (s *Store) renew(ctx context.Context, ttl time.Duration) error {
	return s.claim(ctx, "renew lease of "+strconv.Quote(s.host), ttl)
}

// Stats returns the store's counters. It is cheap and takes no lock.
func (s *Store) Stats() store.Stats {
	return store.Stats{Reaped: s.reaped.Load(), ProbeFailures: s.probeFailures.Load(), LostRows: s.lost.Load()}
}

// call returns the context for one round trip: ctx bounded by the store's
// Timeout.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// fail turns an error of a round trip into the store's error: the
// caller's context's error when that context ended, ErrClosed after Close,
// else an error wrapping store.ErrStorage. Each names the store (its
// password hidden) and the operation, and has the DSN's password hidden
// wherever pgx or the server quoted it.
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

// open fails with ErrClosed once the store is closed.
func (s *Store) open() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// exec runs one statement in one round trip and returns the rows it
// affected.
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
