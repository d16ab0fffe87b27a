package portalloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/netaddr"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// Allocator hands out ports. It is safe for concurrent use. Its zero value
// is not usable: call New.
type Allocator struct {
	cfg    Config
	log    logr.Logger
	warn   logr.Logger // fallback warnings: cfg.Logger, or standard error
	set    *portrange.Set
	mru    *mru.File
	dbPath string // the state store's database file
	dbKey  string // dbPath as refKeys name it

	// store is nil in ModeMRU and while the store cannot be opened; a
	// retry after a fallback replaces it.
	store atomic.Pointer[backing]
	fb    fallback
	bg    sync.WaitGroup // closes of stores a retry replaced

	// repairMu is held by the one call that repairs a lost store or
	// compares the rows with a fleet's store, and read-held by each call
	// that grants, from the store's insert to the Allocator's hold, and by
	// each release, from dropping the hold to deleting the row: a repair
	// never finds a row just granted and not yet held, nor puts back one
	// just released.
	repairMu     sync.RWMutex
	restoreAgain atomic.Bool   // a reservation could not be put back for a passing reason
	stop         chan struct{} // closed by Close: ends watch

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	excl excluded // ports left out besides Config.Exclude (exclude.go)

	ctr counters

	mu     sync.Mutex // guards held, handed, handing, handedPruneAt, claimed, attached, attachOrder, closed and released
	held   map[heldKey]*holding
	handed map[heldKey]handed // rows Transfer gave to other processes
	// handing is the owner each Transfer in progress hands its row to:
	// a store made anew meanwhile may have that owner's row already,
	// from its mark, which a repair must not take for another's.
	handing map[heldKey]store.Owner
	// handedPruneAt is the size of handed at which a Transfer next looks
	// for exited owners in it (see handedPrune).
	handedPruneAt int
	// claimed are the names of the pools being made (package pool, through
	// package seam), attached those open, with what Close calls to close
	// them, in attachOrder.
	claimed     map[string]bool
	attached    map[string]func(context.Context) error
	attachOrder []string
	closed      bool
	released    map[store.Key]release // on a fleet's store: see redo in fleet.go

	// ext is true when the store is not the SQLite file in StateDir: one
	// of a Config.StoreDSN, opened by opener, or one given to NewWithStore.
	ext       bool
	opener    opener
	given     store.Store
	givenUsed atomic.Bool // given has been handed to the Allocator
}

// New validates cfg and returns an Allocator. In the state-store modes it
// opens (creating if needed) the store in cfg.StateDir, waiting at most
// until ctx is done or cfg.Timeout has passed. A store that is busy (another
// process holds its lock for longer) or that does not open in time is an
// error wrapping ErrStoreUnavailable in every mode, and so is one that
// cannot be opened for a passing shortage of descriptors, memory or disk
// space (an error wrapping ErrTransient too), and so is a state
// directory berth refuses as unsafe (an error wrapping ErrUnsafe too: see
// Config.StateDir). A store that cannot be used for another reason (a damaged or foreign file, a newer schema, a
// directory that cannot be written) is an error wrapping
// ErrStoreUnavailable in ModeStateStore; in ModeStateStoreWithFallback the
// Allocator serves from the MRU file instead, loudly, and tries the store
// again every 5 seconds.
//
// New links no PostgreSQL client: a Config.StoreDSN is refused with a
// *FieldError for Config.StoreDSN (Config.Store when the deprecated name
// set it) that says to call fleet.New of package
// github.com/berth-go/berth/portalloc/fleet, which opens that database
// and fails with ErrStoreUnavailable when it cannot: a
// fleet's store never falls back.
func New(ctx context.Context, cfg Config) (*Allocator, error) {
	a, err := newAllocator(ctx, cfg, nil, nil, "New")
	return a, opError("", err)
}

// newWithOpener is New for a program that can open the store a
// Config.StoreDSN names: open opens it (fleet.New passes its own). Any
// failure to open it is an error wrapping ErrStoreUnavailable, and the
// Allocator never falls back to the MRU file. Without a Config.StoreDSN, open
// is not used: the Allocator reserves in the SQLite store, as New's does.
func newWithOpener(ctx context.Context, cfg Config, open opener) (*Allocator, error) {
	a, err := newAllocator(ctx, cfg, open, nil, "New")
	return a, opError("", err)
}

// NewWithStore returns an Allocator that reserves in s, a store the
// caller opened (a statestore.Store of a file of its choosing, a
// pgstore.Store), instead of the one cfg names; cfg's other fields apply
// as for New. Once NewWithStore returns an Allocator, the Allocator owns
// s: its Close closes s (on an error, s stays the caller's to close). It
// uses s's lease calls where s offers them (store.LeaseStore) and its
// fleet-wide calls where s is a store.FleetStore. It never falls back to
// the MRU file (cfg.Mode may not be ModeMRU): a store that fails is an
// error wrapping ErrStoreUnavailable. Nor can it open s again: when s
// reports its file lost (store.ErrLost from a store that is no
// FleetStore), calls fail until the program replaces the Allocator.
func NewWithStore(ctx context.Context, cfg Config, s store.Store) (*Allocator, error) {
	if s == nil {
		return nil, opError("NewWithStore", &FieldError{Field: "store", Value: "nil", Want: "an open store.Store"})
	}
	a, err := newAllocator(ctx, cfg, nil, s, "NewWithStore")
	return a, opError("", err)
}

// newAllocator is New, newWithOpener and NewWithStore (call names which,
// for messages). Its errors have no prefix: the public call adds it.
func newAllocator(ctx context.Context, cfg Config, open opener, given store.Store, call string) (*Allocator, error) {
	db, field, _ := cfg.storeSetting() // withDefaults refuses two databases
	ext := db != "" || given != nil
	defaulted := cfg.StateDir == "" && !ext
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if given == nil && cfg.StoreDSN != "" && open == nil {
		return nil, errNoOpener(call, cfg.StoreDSN, field)
	}
	if given != nil {
		switch cfg.Mode {
		case ModeMRU:
			return nil, &FieldError{Field: "Config.Mode", Value: string(cfg.Mode), Want: `"statestore" with NewWithStore: the Allocator reserves in the store it is given`}
		case ModeStateStoreWithFallback:
			cfg.Mode = ModeStateStore // a given store never falls back
		}
	}
	excl := readExcluded(cfg)
	set, err := candidateSet(cfg, excl)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		excl:   excl,
		cfg:    cfg,
		log:    cfg.Logger,
		warn:   warnLogger(cfg),
		set:    set,
		mru:    mru.New(filepath.Join(cfg.StateDir, mruFile), mru.Options{Logger: cfg.Logger}),
		dbPath: filepath.Join(cfg.StateDir, databaseFile),
		dbKey:  "postgres " + cfg.Host + " " + cfg.StoreDSN, // replaced below for the SQLite file
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		held:   map[heldKey]*holding{},
		stop:   make(chan struct{}),

		ext:    ext,
		opener: open,
		given:  given,
	}
	if cfg.Mode == ModeMRU {
		a.fb.active.Store(true)
		return a, nil
	}
	switch {
	case given != nil:
		// What messages call the store, before anything can fail.
		a.dbPath = fmt.Sprintf("the store given to NewWithStore (%T)", given)
		a.dbKey = fmt.Sprintf("given %T %p", given, given)
		if cfg.StoreDSN != "" {
			a.dbPath = "PostgreSQL store " + dsn.Redact(cfg.StoreDSN)
		}
	case cfg.StoreDSN != "":
		a.dbPath = "PostgreSQL store " + dsn.Redact(cfg.StoreDSN)
	}
	octx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if defaulted { // ModeMRU opens no store, and returned above
		// Never an empty store beside the one that holds the
		// reservations: a failed take-over is an error in every mode.
		if err := takeOver(octx, cfg.StateDir, cfg.Logger, min(cfg.Timeout/2, maxBusyWait)); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, ctxErr
			}
			return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
	}
	opened, err := a.openStore(octx)
	if !ext {
		a.dbKey = canonicalDB(a.dbPath) // after Open, which creates the directory
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			if errors.Is(err, ctxErr) {
				return nil, err // it names the store and the step
			}
			return nil, fmt.Errorf("open %s: %w", a.dbPath, ctxErr)
		}
		if isTransient(err) && !errors.Is(err, store.ErrBusy) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, transientErr(err)
		}
		if cfg.Mode == ModeStateStore || isTransient(err) || errors.Is(err, ErrUnsafe) || errors.Is(err, statestore.ErrMoved) {
			return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		a.fallBack(err)
		return a, nil
	}
	a.store.Store(&backing{opened})
	a.bg.Add(1)
	go a.watch() //nolint:contextcheck // it outlives New's context; Close stops it
	return a, nil
}

// Config returns the configuration in effect, with defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

func (a *Allocator) normalize(req Request) (Request, error) {
	if err := checkLabel(req.Label); err != nil {
		return Request{}, err
	}
	switch req.Protocol {
	case "":
		req.Protocol = TCP
	case TCP, UDP:
	default:
		return Request{}, &FieldError{Field: "Request.Protocol", Value: string(req.Protocol), Want: `"tcp" or "udp"`}
	}
	if !req.Addr.IsValid() {
		req.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	addr, err := netaddr.Normalize(req.Addr)
	if err != nil {
		return Request{}, &FieldError{Field: "Request.Addr", Value: req.Addr.String(), Want: "an IPv4 or IPv6 address without a zone, such as 127.0.0.1, ::1, 0.0.0.0 or ::"}
	}
	req.Addr = addr
	switch {
	case req.Order == "":
		req.Order = a.cfg.Order
	case !req.Order.valid():
		return Request{}, &FieldError{Field: "Request.Order", Value: string(req.Order), Want: `"random" or "lowest"`}
	}
	if len(req.Prefer) > MaxPrefer {
		return Request{}, &FieldError{Field: "Request.Prefer", Value: fmt.Sprintf("%d ports", len(req.Prefer)), Want: fmt.Sprintf("at most %d ports (MaxPrefer)", MaxPrefer)}
	}
	if i := slices.Index(req.Prefer, 0); i >= 0 {
		return Request{}, &FieldError{Field: fmt.Sprintf("Request.Prefer[%d]", i), Value: "0", Want: "a port from 1 to 65535"}
	}
	if err := a.checkPrefer(req); err != nil {
		return Request{}, err
	}
	return a.scopeLabel(req)
}

func (a *Allocator) begin(ctx context.Context, req Request) (context.Context, context.CancelFunc, Request, error) {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, nil, Request{}, ErrClosed
	}
	req, err := a.normalize(req)
	if err != nil {
		return nil, nil, Request{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, Request{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	return ctx, cancel, req, nil
}

func (a *Allocator) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// closedErr returns ErrClosed for an error of a store that Close closed
// while the call ran, and err otherwise.
func (a *Allocator) closedErr(err error) error {
	if errors.Is(err, store.ErrClosed) && a.isClosed() {
		return ErrClosed
	}
	return err
}

// Close closes the Allocator's pools (package pool), drops every hold it still has (the
// rows no other holder of this process holds are released), releases the
// rows it handed (Transfer, and a set's Transfer and TransferAll) to processes
// that have exited by now, leaving those of processes that still run to
// them, and closes the state store. Later calls return errors wrapping ErrClosed (see "After
// Close" in the package documentation); Close itself is idempotent.
//
// Close is bounded: the pools and the releases share one deadline of
// Config.Timeout, and closing the SQLite store then waits at most for a
// call still in flight on it, which is bounded by the store's busy
// timeout. With a Config.StoreDSN, Close returns by that deadline, and at
// most a second after the releases (a tenth of a second, when they used
// the deadline up), even when the server does not answer: the store's
// connections then go on closing in the background until the server
// answers or pgx gives up on them, and the error says so. Its error is
// for logging: what it could not release is reaped once this process
// exits (a fleet's rows, when their host's berth next reaps).
func (a *Allocator) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	var pools []func(context.Context) error
	for _, name := range a.attachOrder {
		pools = append(pools, a.attached[name])
	}
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	// Pools first, while their idle members can still be released.
	var errs []error
	for _, closePool := range pools {
		if err := closePool(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.mu.Lock()
	a.closed = true
	held := a.held
	a.held = nil
	a.mu.Unlock()

	s := a.db()
	for _, h := range held {
		if h.r.Backend != BackendStateStore || s == nil {
			continue
		}
		if err := a.dropHolds(ctx, s, h.r); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", h.r, err))
		}
	}
	// Rows handed to children that have exited since (see handed.go).
	if err := a.reapHanded(ctx, s, func(handed) bool { return true }, true); err != nil {
		errs = append(errs, err)
	}
	close(a.stop)
	a.bg.Wait() // the watch, and stores replaced after a fallback or a loss: each Close is bounded
	if s != nil {
		errs = append(errs, a.closeStore(ctx, s))
	}
	errs = append(errs, a.mru.Close()) // its lock file, kept open between calls
	if err := errors.Join(errs...); err != nil {
		return opError("close", err)
	}
	return nil
}

// closeStore closes the store s. A fleet's store is waited for until ctx
// (Close's deadline) ends, at most maxCloseWait and at least closeMargin:
// a server that does not answer would hold its Close up, and the store
// goes on closing in the background (pgstore.Store.Close ends within its
// own Timeout). A SQLite store's Close is bounded by its busy timeout and
// is waited for.
func (a *Allocator) closeStore(ctx context.Context, s store.Store) error {
	if !a.ext {
		return s.Close()
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	// A server that answers closes the connections at once; one that
	// does not would make any wait in vain.
	wait := closeMargin
	if dl, ok := ctx.Deadline(); ok {
		wait = max(wait, min(time.Until(dl), maxCloseWait))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("close %s: %w: its connections did not close in time (the server does not answer); they go on closing in the background", a.dbPath, ErrStoreUnavailable)
	}
}

// closeMargin is how long Close waits for a fleet's store to close once
// its deadline has passed, and maxCloseWait the longest it waits for it.
const (
	closeMargin  = 100 * time.Millisecond
	maxCloseWait = time.Second
)

// maxBusyWait bounds how long a call waits for a store that another
// program keeps locked.
const maxBusyWait = 5 * time.Second
