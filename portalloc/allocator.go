package portalloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/internal/safefs"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// The files an Allocator keeps in its state directory.
const (
	databaseFile = "berth.db" // the SQLite state store
	mruFile      = "mru.json" // the MRU fallback's record
)

// Allocator hands out ports. It is safe for concurrent use. Its zero value
// is not usable: call New.
type Allocator struct {
	cfg  Config
	log  logr.Logger
	warn logr.Logger // fallback warnings: cfg.Logger, or standard error
	set  *portrange.Set
	excl excluded
	h    *handle // the process's handle of the store, shared

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	ctr    counters
	closed atomic.Bool
	done   chan struct{} // closed by Close
}

// New validates cfg (its zero fields filled in from the BERTH_* variables,
// see Config) and returns an Allocator of the SQLite store in
// cfg.StateDir, which it opens (creating it if need be), waiting at most
// until ctx is done or cfg.Timeout has passed.
//
// A store that is busy (another process holds its lock for longer), that
// cannot be opened for a passing shortage of descriptors, memory or disk
// space (store.ErrTransient), or whose state directory cannot be created or
// is unsafe (store.ErrUnsafe) is an error wrapping store.ErrUnavailable in
// every mode: waiting and mistakes of configuration are not reasons to fall
// back. A store that cannot be used for another reason (a damaged or
// foreign file, a newer schema) is such an error in ModeStateStore; in
// ModeStateStoreWithFallback the Allocator serves from the MRU file
// instead, loudly, and tries the store again every 5 seconds.
//
// New links no PostgreSQL client: a Config.StoreDSN is refused with a
// *store.FieldError that says to call fleet.New of package
// github.com/berth-go/berth/portalloc/fleet.
func New(ctx context.Context, cfg Config) (a *Allocator, err error) {
	defer func() { err = opError("", err) }()
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.StoreDSN != "" {
		field := "Config.StoreDSN"
		if os.Getenv(envStore) == cfg.StoreDSN {
			field = envStore
		}
		return nil, &store.FieldError{Field: field, Value: dsn.Redact(cfg.StoreDSN),
			Want: "no PostgreSQL store with portalloc.New, which links no PostgreSQL client: import \"github.com/berth-go/berth/portalloc/fleet\" and call fleet.New, which opens it; or leave it empty for the SQLite store of this host"}
	}
	a, err = prepare(cfg)
	if err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	path := filepath.Join(cfg.StateDir, databaseFile)
	// A store locked by something else for half a call's time is busy:
	// the call gets an error wrapping store.ErrUnavailable.
	opts := statestore.Options{Logger: cfg.Logger, BusyTimeout: min(cfg.Timeout/2, 5*time.Second)}
	open := func(ctx context.Context) (store.Store, error) {
		return openWithin(ctx, path, func(ctx context.Context) (store.Store, error) { return statestore.Open(ctx, path, opts) })
	}
	name := "sqlite " + canonical(path)
	if cfg.Mode == ModeMRU {
		// The MRU file alone: the store is not opened.
		name = "mru " + canonical(path)
		open = func(context.Context) (store.Store, error) { return nil, errors.New("Config.Mode is mru") }
	}
	m := mru.New(filepath.Join(cfg.StateDir, mruFile), mru.Options{Logger: cfg.Logger})
	a.h, err = share(octx, name, path, open, true, m, a, a.log, a.warn, func(err error) bool {
		return cfg.Mode != ModeStateStore && !transient(err) && !errors.Is(err, store.ErrUnsafe) && !errors.Is(err, safefs.ErrNoDir)
	})
	if err != nil {
		_ = m.Close()
		return nil, openErr(ctx, path, err)
	}
	if s := a.h.store(); s == nil && cfg.Mode != ModeMRU {
		down := a.h.downNow()
		if down != nil {
			a.ctr.fallbacks.Add(1)
		}
		a.warn.Error(down, "state store unavailable; allocating from the MRU file instead, where every port is still locked (no port a live berth holder keeps is handed out), but recorded nowhere a listing shows; retrying the store periodically",
			"store", path, "mru", m.Path(), "retryEvery", storeRetryInterval.String())
	}
	return a, nil
}

// NewWithStore returns an Allocator of the store that open opens, given
// cfg as New completes it: a PostgreSQL store of a fleet (package pgstore,
// as fleet.New does), a SQLite store of a file of the caller's choosing
// (statestore.Open), or a store of the caller's own; cfg's other fields
// apply as for New. The Allocators of a process with the same
// Config.StoreDSN share one store, which the first of them opens; without a
// StoreDSN each call opens its own. The store is closed with the last
// Allocator that uses it (on an error of NewWithStore, one open returned is
// closed too). It never falls back to the MRU file: a store that fails is
// an error wrapping store.ErrUnavailable. A store whose rows are lost (a
// failover) gets them back from this process, as New's does; one whose
// file is lost is not opened again: make a new Allocator.
func NewWithStore(ctx context.Context, cfg Config, open func(context.Context, Config) (store.Store, error)) (a *Allocator, err error) {
	defer func() { err = opError("", err) }()
	if open == nil {
		return nil, &store.FieldError{Field: "open", Value: "nil", Want: "a function that opens the store"}
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Mode == ModeMRU {
		return nil, &store.FieldError{Field: "Config.Mode", Value: string(cfg.Mode), Want: `"statestore": an Allocator of a store given to NewWithStore serves from that store only`}
	}
	cfg.Mode = ModeStateStore
	a, err = prepare(cfg)
	if err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	what := "the store given to NewWithStore"
	name := fmt.Sprintf("given %p", a) // its own
	if cfg.StoreDSN != "" {
		what = "PostgreSQL store " + dsn.Redact(cfg.StoreDSN)
		name = "dsn " + cfg.Host + " " + cfg.StoreDSN
	}
	a.h, err = share(octx, name, what, func(ctx context.Context) (store.Store, error) {
		return openWithin(ctx, what, func(ctx context.Context) (store.Store, error) { return open(ctx, cfg) })
	}, false, nil, a, a.log, a.warn, func(error) bool { return false })
	if err != nil {
		return nil, openErr(ctx, what, err)
	}
	return a, nil
}

// prepare returns an Allocator of cfg, complete but for its handle.
func prepare(cfg Config) (*Allocator, error) {
	local, err := portrange.LocalReserved()
	if err != nil {
		cfg.Logger.Info("could not read the ports the administrator reserves; not leaving them out", "file", portrange.LocalReservedFile, "error", err.Error())
	}
	excl := excluded{local: local, browser: !cfg.AllowBrowserRestricted}
	set, err := candidateSet(cfg, excl)
	if err != nil {
		return nil, err
	}
	return &Allocator{
		cfg:  cfg,
		log:  cfg.Logger,
		warn: warnLogger(cfg),
		set:  set,
		excl: excl,
		rng:  rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		done: make(chan struct{}),
	}, nil
}

// openErr is the error of a store that could not be opened: the caller's
// context when it ended, else one wrapping store.ErrUnavailable.
func openErr(ctx context.Context, what string, err error) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err // it names the store and the step
	case ctx.Err() != nil:
		return fmt.Errorf("open %s: %w", what, ctx.Err())
	case errors.Is(err, safefs.ErrNoDir):
		return fmt.Errorf("%w: %w; set BERTH_STATE_DIR or Config.StateDir to a directory this user can create and write", store.ErrUnavailable, err)
	case errors.Is(err, store.ErrUnavailable):
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}

// openWithin runs open, giving up when ctx is done. A store's open honours
// ctx between its steps, but a step inside SQLite can outlast it (reading a
// WAL whose index another process was stopped in the middle of writing
// retries for up to ten seconds): so it runs aside, and a store it still
// makes after ctx ended is closed when it does.
func openWithin(ctx context.Context, what string, open func(context.Context) (store.Store, error)) (store.Store, error) {
	type opened struct {
		s   store.Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := open(ctx)
		done <- opened{s, err}
	}()
	select {
	case o := <-done:
		return o.s, o.err
	case <-ctx.Done():
	}
	// A store's own error says which step timed out: worth a moment's wait.
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case o := <-done:
		return o.s, o.err
	case <-t.C:
	}
	go func() {
		if o := <-done; o.err == nil && o.s != nil {
			_ = o.s.Close()
		}
	}()
	return nil, fmt.Errorf("open %s: %w", what, ctx.Err())
}

// canonical returns path absolute, its directory's symbolic links resolved,
// so two spellings of one state directory share a handle.
func canonical(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// Config returns the configuration in effect, with the environment's
// values and the defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

// Held returns the reservations this Allocator holds: made by it (or its
// sets, pools and helpers, through it) and not yet released or
// transferred, each once. After Close it returns none.
func (a *Allocator) Held() []store.Reservation { return a.h.heldBy(a) }

// Files returns copies of the descriptors that hold r's kernel lock, for a
// child to inherit before it is started (exec.Cmd.ExtraFiles): once r is
// transferred to that child, the child holds the lock itself for as long
// as it runs, and no keeper process is needed for it (see Transfer). The
// caller closes the files once the child has started. A reservation this
// Allocator does not hold is an error wrapping store.ErrNotFound. On
// systems where locks are files, the copies hold the lock the same way.
func (a *Allocator) Files(r store.Reservation) ([]*os.File, error) {
	files, err := a.h.files(a, r.Key)
	if err != nil {
		return nil, opError("files of "+r.String(), err)
	}
	return files, nil
}

// Done returns a channel that Close closes, for what a program builds on
// an Allocator (a pool's background work, say) to stop with it.
func (a *Allocator) Done() <-chan struct{} { return a.done }

// Close drops every hold this Allocator has: the reservations no other
// Allocator of the process holds are released. Later calls return errors
// wrapping store.ErrClosed; Close itself is idempotent. A call in flight
// when Close runs either completes (and its reservation is released with
// the rest) or returns an error wrapping store.ErrClosed. Reservations
// transferred to other processes, and named holders', stay theirs.
//
// Close waits at most Config.Timeout. Its error is for logging: what it
// could not release is reaped once this process exits.
func (a *Allocator) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	close(a.done)
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	err := errors.Join(a.h.dropAll(ctx, a), a.h.unref(ctx, a))
	return opError("close", err)
}

// Counts counts by the kind of an allocation, as Kubernetes' port
// allocator labels its metrics: Dynamic for Allocate (berth chose the
// port), Static for Reserve (the caller named it).
type Counts struct {
	Dynamic int64
	Static  int64
}

// Stats are an Allocator's counters since New, what it holds now, and the
// counters of the store it shares with the process's other Allocators.
type Stats struct {
	Held  int // how many reservations this Allocator holds now
	Ports int // how many ports Allocate may hand out: the range less what is left out
	// Allocations counts successful Allocate and Reserve calls; Errors
	// failed ones, whatever the cause.
	Allocations, Errors Counts
	// Fallbacks counts this Allocator's switches from the state store to
	// the MRU file; Fallback says why it serves from the MRU file now, ""
	// when it serves from the store (and in ModeMRU).
	Fallbacks int64
	Fallback  string
	// The store's: ProbeFailures counts candidates free in the store that
	// another process's lock or bind refused; Reaped rows of exited owners
	// deleted.
	ProbeFailures, Reaped int64
	// Restored counts the process's reservations put back in the store
	// after it lost them (a file deleted, replaced or truncated, a
	// failover); Lost those another owner's row stood in the way of (logged;
	// their locks still keep the ports); Rereleased the releases done again
	// where a failover brought a row back or a release had failed.
	Restored, Lost, Rereleased int64
}

// counters are the Allocator's own counts.
type counters struct {
	alloc, allocErr Counts // updated atomically
	fallbacks       atomic.Int64
}

func (c *counters) count(kind store.Kind, err error) {
	if errors.Is(err, store.ErrClosed) {
		return
	}
	n := &c.alloc
	if err != nil {
		n = &c.allocErr
	}
	p := &n.Dynamic
	if kind == store.Static {
		p = &n.Static
	}
	atomic.AddInt64(p, 1)
}

// Stats returns the Allocator's counters. It takes no lock of the store
// and does no I/O: it is cheap enough for every scrape.
func (a *Allocator) Stats() Stats {
	load := func(c *Counts) Counts { return Counts{atomic.LoadInt64(&c.Dynamic), atomic.LoadInt64(&c.Static)} }
	st := Stats{
		Held:        len(a.Held()),
		Ports:       a.set.Len(),
		Allocations: load(&a.ctr.alloc),
		Errors:      load(&a.ctr.allocErr),
		Fallbacks:   a.ctr.fallbacks.Load(),
		Restored:    a.h.restored.Load(),
		Lost:        a.h.lost.Load(),
		Rereleased:  a.h.rereleased.Load(),
	}
	if s := a.h.store(); s != nil {
		ss := s.Stats()
		st.ProbeFailures, st.Reaped = ss.ProbeFailures, ss.Reaped
	} else if a.cfg.Mode == ModeStateStoreWithFallback {
		st.Fallback = "the state store cannot be used"
		if err := a.h.downNow(); err != nil {
			st.Fallback = err.Error()
		}
	}
	return st
}

// Usage returns how many ports Allocate may hand out, and how many of them
// have a live reservation in the store now (any owner's): the range's use,
// read from the store. Served from the MRU file, it reports the ports
// only.
func (a *Allocator) Usage(ctx context.Context) (ports, reserved int, err error) {
	if a.closed.Load() {
		return 0, 0, opError("usage", store.ErrClosed)
	}
	ports = a.set.Len()
	s := a.h.store()
	if s == nil {
		return ports, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	rows, err := s.List(ctx, store.Filter{})
	if err != nil {
		return 0, 0, opError("usage", err)
	}
	seen := map[uint16]bool{}
	for _, r := range rows {
		if a.set.Contains(r.Port) && !seen[r.Port] && r.Live(ctx) {
			seen[r.Port] = true
			reserved++
		}
	}
	return ports, reserved, nil
}
