package portalloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// storeRetryInterval is how long an Allocator in
// ModeStateStoreWithFallback that fell back to the MRU file waits before it
// tries the state store again: the first Allocate or Reserve after it opens
// the store afresh and, when that works, serves from the store from then on.
const storeRetryInterval = 5 * time.Second

// storeRetryEvery, in nanoseconds, overrides storeRetryInterval when it is
// not zero: tests shorten it.
var storeRetryEvery atomic.Int64

// storeRetry is how long a fallback lasts before the store is tried again.
func storeRetry() time.Duration {
	if d := storeRetryEvery.Load(); d > 0 {
		return time.Duration(d)
	}
	return storeRetryInterval
}

// fallback is the state of an Allocator's fallback to the MRU file.
type fallback struct {
	active atomic.Bool // new allocations go to the MRU file
	blind  atomic.Bool // the latest MRU allocation could not read the store

	retry sync.Mutex // held by the one call that tries the store again

	mu    sync.Mutex // guards cause and next
	cause error      // why the Allocator fell back, latest first
	next  time.Time  // no attempt to use the store again before this
}

// isTransient reports whether a store error means "wait", not "broken": the
// store was busy (another process held its lock past the time the call
// could wait), the system ran short of descriptors, memory or disk space
// or interrupted a call (ErrTransient, or the errno of one), or the call
// ran out of time. None is a reason to fall back: the MRU file would serve
// while the store still works, meet the same shortage, and reserve
// nothing.
func isTransient(err error) bool {
	return errors.Is(err, store.ErrBusy) || errors.Is(err, context.DeadlineExceeded) || transient.Is(err)
}

// fallBack switches new allocations to the MRU file, loudly, until
// storeRetry has passed.
func (a *Allocator) fallBack(cause error) {
	a.fb.mu.Lock()
	a.fb.cause = cause
	a.fb.next = time.Now().Add(storeRetry())
	a.fb.mu.Unlock()
	if a.fb.active.Swap(true) {
		return // already serving from the MRU file
	}
	a.ctr.fallbacks.Add(1)
	a.warn.Error(cause, "state store unavailable; allocating from the MRU file instead, which reserves nothing (it skips the ports the store holds, and hands out none while it cannot read them); retrying the store periodically",
		"mru", a.mru.Path(), "database", a.dbPath, "retryEvery", storeRetry().String())
}

// Backend returns the backend that serves new allocations now.
func (a *Allocator) Backend() string {
	if a.fb.active.Load() {
		return BackendMRU
	}
	return BackendStateStore
}

// FallbackCause returns why the Allocator serves from the MRU file, or nil
// when it serves from the state store (or was configured with ModeMRU).
// After a fallback it is the latest reason the store could not be used.
func (a *Allocator) FallbackCause() error {
	if a.cfg.Mode == ModeMRU || !a.fb.active.Load() {
		return nil
	}
	a.fb.mu.Lock()
	defer a.fb.mu.Unlock()
	return a.fb.cause
}

// backing is the Allocator's store, boxed for an atomic pointer.
type backing struct{ s store.Store }

// Database names the store the Allocator reserves in, for people to read:
// the SQLite file's path, or the PostgreSQL connection string of
// Config.StoreDSN with its password hidden.
func (a *Allocator) Database() string { return a.dbPath }

// db returns the store, or nil.
func (a *Allocator) db() store.Store {
	if b := a.store.Load(); b != nil {
		return b.s
	}
	return nil
}

// openStore opens the state store with the Allocator's options, giving up
// when ctx is done. Open honours ctx between its steps, but a step inside
// SQLite can outlast it: reading a WAL database whose index another process
// was stopped in the middle of writing retries for up to ten seconds. So
// Open runs aside; when ctx ends first, openStore returns and the store, if
// Open still makes one, is closed when it does.
func (a *Allocator) openStore(ctx context.Context) (store.Store, error) {
	type opened struct {
		s   store.Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := a.open(ctx)
		done <- opened{s, err}
	}()
	select {
	case o := <-done:
		return o.s, o.err
	case <-ctx.Done():
		select {
		case o := <-done: // finished just in time
			return o.s, o.err
		default:
		}
		// A store's own error says which step timed out: it is worth a
		// moment's wait, as the store's steps end with ctx too.
		t := time.NewTimer(openGrace)
		defer t.Stop()
		select {
		case o := <-done:
			return o.s, o.err
		case <-t.C:
		}
		go func() {
			if o := <-done; o.s != nil {
				_ = o.s.Close()
			}
		}()
		return nil, fmt.Errorf("open %s: %w", a.dbPath, ctx.Err())
	}
}

// openGrace is how long openStore waits for the store's own error once
// its context has ended.
const openGrace = 100 * time.Millisecond

// open opens the store the Allocator's Config names, or hands over, once,
// the store given to NewWithStore.
func (a *Allocator) open(ctx context.Context) (store.Store, error) {
	if a.given != nil {
		if a.givenUsed.Swap(true) {
			return nil, fmt.Errorf("open %s: a store given to NewWithStore cannot be opened again; make a new Allocator with the store opened afresh", a.dbPath)
		}
		return a.given, nil
	}
	return openBacking(ctx, a.cfg, a.opener, false)
}

// retryStore tries the state store again when the Allocator has fallen back
// and storeRetry has passed since the last try. It opens the store
// afresh (a file that was replaced or repaired is looked at anew) and, if
// that works, makes it serve again. One call tries; the others go on with
// the MRU file meanwhile. The attempt gets at most half of what is left of
// ctx, so the MRU file still has time to serve when it fails.
func (a *Allocator) retryStore(ctx context.Context) {
	if a.cfg.Mode == ModeMRU || !a.fb.active.Load() {
		return
	}
	a.fb.mu.Lock()
	due := !time.Now().Before(a.fb.next)
	a.fb.mu.Unlock()
	if !due || !a.fb.retry.TryLock() {
		return
	}
	defer a.fb.retry.Unlock()
	a.fb.mu.Lock()
	a.fb.next = time.Now().Add(storeRetry())
	a.fb.mu.Unlock()

	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	s, err := a.openStore(ctx)
	if err != nil {
		if !isTransient(err) { // a busy store says nothing new of the cause
			a.fb.mu.Lock()
			a.fb.cause = err
			a.fb.mu.Unlock()
		}
		a.log.V(1).Info("state store still unavailable; the MRU file goes on serving", "error", err.Error(), "retryIn", storeRetry().String())
		return
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		_ = s.Close()
		return
	}
	old := a.store.Swap(&backing{s})
	a.mu.Unlock()
	if old != nil {
		// A call that took the old store before the fallback may still run
		// on it; Close waits for it, boundedly, off this caller's path.
		a.bg.Add(1)
		go func() {
			defer a.bg.Done()
			_ = old.s.Close()
		}()
	}
	a.fb.active.Store(false)
	a.warn.Info("state store usable again; allocating from it", "database", a.dbPath)
}

// readHeld reads which ports the state store holds, for the MRU backend to
// skip. readable is false when the MRU file is to serve blind: only in
// ModeMRU, where the caller chose the MRU file, and then logged once per
// spell and counted in Stats.Blind. In the fallback mode a store that
// cannot be read is an error wrapping ErrStoreUnavailable, and so, in every
// mode, is a read that failed for a passing shortage (ErrTransient).
func (a *Allocator) readHeld(ctx context.Context) (held statestore.HeldSet, readable bool, err error) {
	held, err = a.readHeldWithin(ctx)
	if err == nil {
		if a.fb.blind.Swap(false) {
			a.warn.Info("the state store can be read again; the MRU file skips the ports it holds", "database", a.dbPath)
		}
		return held, true, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return statestore.HeldSet{}, false, ctxErr
	}
	if isTransient(err) && !errors.Is(err, context.DeadlineExceeded) {
		return statestore.HeldSet{}, false, transientErr(err)
	}
	if a.cfg.Mode != ModeMRU {
		why := ""
		if cause := a.FallbackCause(); cause != nil {
			why = ": " + cause.Error()
		}
		return statestore.HeldSet{}, false, fmt.Errorf("%w%s; and the MRU file cannot read the store to skip the ports it holds (%w), so it hands out none: run 'berth doctor' for the cause and what to do, or set %s=%s to hand out ports from the MRU file blind on purpose",
			ErrStoreUnavailable, why, err, EnvMode, ModeMRU)
	}
	if !a.fb.blind.Swap(true) {
		a.warn.Error(err, "cannot read the state store; the MRU file serves blind and may hand out a port another process has reserved",
			"database", a.dbPath)
	}
	return statestore.HeldSet{}, false, nil
}

// maxReadHeld bounds how long the MRU backend waits to read the store.
const maxReadHeld = 2 * time.Second

// readHeldWithin is statestore.ReadHeld, given up after maxReadHeld or
// half of what is left of ctx, whichever is less, so that the MRU file has
// time to serve. Like Open (see openStore), a read can stall inside SQLite
// beyond its context, so it runs aside.
func (a *Allocator) readHeldWithin(ctx context.Context) (statestore.HeldSet, error) {
	limit := maxReadHeld
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl)/2)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel() // after the select: a read that is done is not to be lost
	type read struct {
		held statestore.HeldSet
		err  error
	}
	done := make(chan read, 1)
	go func() {
		held, err := statestore.ReadHeld(ctx, a.dbPath)
		done <- read{held, err}
	}()
	select {
	case r := <-done:
		return r.held, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // finished just in time
			return r.held, r.err
		default:
		}
		return statestore.HeldSet{}, fmt.Errorf("read %s: %w", a.dbPath, ctx.Err())
	}
}

// warnLogger is the Logger fallback warnings go to: cfg.Logger, or, when it
// is the zero Logger (which discards), standard error. A fallback weakens
// berth's guarantee, so it must not pass unseen.
func warnLogger(cfg Config) logr.Logger {
	if cfg.Logger.GetSink() != nil {
		return cfg.Logger
	}
	return logr.New(&lineSink{w: os.Stderr, prefix: "berth: "})
}

// lineSink writes Info and Error messages of level 0 as single lines.
type lineSink struct {
	mu     sync.Mutex // guards writes to w
	w      io.Writer
	prefix string
}

func (s *lineSink) Init(logr.RuntimeInfo)                  {}
func (s *lineSink) Enabled(level int) bool                 { return level == 0 }
func (s *lineSink) WithValues(...any) logr.LogSink         { return s }
func (s *lineSink) WithName(string) logr.LogSink           { return s }
func (s *lineSink) Info(_ int, msg string, kv ...any)      { s.line(msg, nil, kv) }
func (s *lineSink) Error(err error, msg string, kv ...any) { s.line("warning: "+msg, err, kv) }

func (s *lineSink) line(msg string, err error, kv []any) {
	var b strings.Builder
	b.WriteString(s.prefix)
	b.WriteString(msg)
	if err != nil {
		b.WriteString(": ")
		b.WriteString(err.Error())
	}
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	b.WriteByte('\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.w, b.String())
}
