package portalloc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/mru"
	shortage "github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// testHandle opens a handle of its own on a SQLite store in a directory of
// the test's, as New does, and lets go of it when the test ends.
func testHandle(t *testing.T) *handle {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, databaseFile)
	open := func(ctx context.Context) (store.Store, error) {
		return statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	}
	m := mru.New(filepath.Join(dir, mruFile), mru.Options{})
	h, err := share(context.Background(), "test "+t.Name()+" "+path, path, open, true, m, t, logr.Discard(), logr.Discard(), func(error) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.unref(context.Background(), t); err != nil {
			t.Errorf("unref: %v", err)
		}
	})
	return h
}

// TestFallsBackOnlyForFailures: which errors of the store make a grant of
// the fallback mode serve from the MRU file, taking the store out of
// service for the whole process. A failure of the store does; a passing
// shortage, a busy store, a call out of time, an unsafe directory and an
// answer about the request (held, exhausted, refused) do not. Nothing
// falls back in ModeStateStore.
func TestFallsBackOnlyForFailures(t *testing.T) {
	emfile := &os.PathError{Op: "open", Path: "berth.db.lock", Err: syscall.EMFILE}
	for _, c := range []struct {
		name string
		err  error
		back bool
	}{
		{"a failure of the store", fmt.Errorf("scan: %w: disk I/O error", store.ErrStorage), true},
		{"a damaged file", fmt.Errorf("open: %w", store.ErrDamaged), true},
		{"a newer schema", fmt.Errorf("open: %w", store.ErrSchemaTooNew), true},
		{"a store that cannot be used", fmt.Errorf("%w: it was lost and cannot be opened again", store.ErrUnavailable), true},
		{"the store's shortage", fmt.Errorf("open: %w", shortage.Wrap(emfile)), false},
		{"a shortage under a failure", fmt.Errorf("scan: %w: %w", store.ErrStorage, emfile), false},
		{"out of memory", syscall.ENOMEM, false},
		{"a busy store", fmt.Errorf("scan: %w", store.ErrBusy), false},
		{"out of time", fmt.Errorf("scan: %w", context.DeadlineExceeded), false},
		{"unsafe", fmt.Errorf("open: %w: %w", store.ErrStorage, store.ErrUnsafe), false},
		{"held", &store.ConflictError{Key: store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: 29001}, Bound: true}, false},
		{"exhausted", store.ErrExhausted, false},
		{"refused", &store.FieldError{Field: "label", Value: "\x1b", Want: "printable"}, false},
	} {
		for _, mode := range []Mode{ModeStateStoreWithFallback, ModeStateStore} {
			t.Run(c.name+"/"+string(mode), func(t *testing.T) {
				h := testHandle(t)
				a := &Allocator{cfg: Config{Mode: mode}, h: h}
				if err := h.lockTurn(context.Background()); err != nil {
					t.Fatal(err)
				}
				back := h.fallsBack(a, c.err)
				usable := h.s != nil
				h.unlockTurn()
				want := c.back && mode == ModeStateStoreWithFallback
				if back != want {
					t.Errorf("fallsBack(%v) in %s = %v; want %v", c.err, mode, back, want)
				}
				if usable == want {
					t.Errorf("after fallsBack(%v) in %s the store is usable: %v; want %v", c.err, mode, usable, !want)
				}
				if n := a.ctr.fallbacks.Load(); n != map[bool]int64{true: 1, false: 0}[want] {
					t.Errorf("fallbacks counted = %d; want %v", n, want)
				}
				if want && (h.downNow() == nil || !errors.Is(h.downNow(), c.err)) {
					t.Errorf("the handle is down for %v; want %v", h.downNow(), c.err)
				}
			})
		}
	}
}

// TestCallErr: what a grant's error becomes in portalloc's words: a
// shortage, a busy store and a call out of time are ErrUnavailable saying
// so (never damage); a failure of the store is ErrUnavailable; a conflict,
// refused input and a closed Allocator stay as they are; an exhausted
// range names the range; an address of no interface is a *FieldError for
// Request.Addr that keeps the system's error.
func TestCallErr(t *testing.T) {
	a := &Allocator{cfg: Config{Range: store.Range{First: 29000, Last: 29099}}}
	req := Request{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1")}
	conflict := &store.ConflictError{Key: store.Key{Protocol: store.TCP, Addr: req.Addr, Port: 29001}, Bound: true}
	emfile := &os.PathError{Op: "socket", Err: syscall.EMFILE}
	for _, c := range []struct {
		name string
		err  error
		n    int
		want []error
		not  []error
		says string
	}{
		{"a shortage", fmt.Errorf("probe: %w", emfile), 0, []error{store.ErrUnavailable, store.ErrTransient, syscall.EMFILE}, []error{store.ErrStorage}, "too many open files"},
		{"the store's shortage", fmt.Errorf("scan: %w", shortage.Wrap(emfile)), 0, []error{store.ErrUnavailable, store.ErrTransient}, nil, "not damaged"},
		{"a busy store", fmt.Errorf("scan: %w", store.ErrBusy), 0, []error{store.ErrUnavailable, store.ErrBusy}, []error{store.ErrTransient}, "locked by another process"},
		{"out of time", fmt.Errorf("scan: %w", context.DeadlineExceeded), 0, []error{store.ErrUnavailable, context.DeadlineExceeded}, nil, ""},
		{"a damaged file", fmt.Errorf("open: %w", store.ErrDamaged), 0, []error{store.ErrUnavailable, store.ErrDamaged}, nil, ""},
		{"a lost file", fmt.Errorf("reserve: %w", store.ErrLost), 0, []error{store.ErrUnavailable, store.ErrLost}, nil, ""},
		{"unsafe", fmt.Errorf("open: %w", store.ErrUnsafe), 0, []error{store.ErrUnavailable, store.ErrUnsafe}, nil, ""},
		{"held", conflict, 0, []error{store.ErrHeld}, []error{store.ErrUnavailable}, "bound by a process outside berth"},
		{"refused", &store.FieldError{Field: "label", Value: "x", Want: "y"}, 0, []error{store.ErrInvalid}, []error{store.ErrUnavailable}, ""},
		{"closed", store.ErrClosed, 0, []error{store.ErrClosed}, []error{store.ErrUnavailable}, ""},
		{"exhausted", store.ErrExhausted, 0, []error{store.ErrExhausted}, []error{store.ErrUnavailable}, "no free tcp port on 127.0.0.1 in 29000-29099"},
		{"a block exhausted", store.ErrExhausted, 3, []error{store.ErrExhausted}, nil, "no free block of 3 tcp ports"},
		{"no such address", fmt.Errorf("probe: %w", syscall.EADDRNOTAVAIL), 0, []error{store.ErrInvalid, syscall.EADDRNOTAVAIL}, []error{store.ErrUnavailable}, `Request.Addr "127.0.0.1": want an address of this host`},
	} {
		got := a.callErr(context.Background(), c.err, req, c.n)
		for _, w := range c.want {
			if !errors.Is(got, w) {
				t.Errorf("%s: callErr(%v) = %v; want it to wrap %v", c.name, c.err, got, w)
			}
		}
		for _, n := range c.not {
			if errors.Is(got, n) {
				t.Errorf("%s: callErr(%v) = %v; want it not to wrap %v", c.name, c.err, got, n)
			}
		}
		if !strings.Contains(fmt.Sprint(got), c.says) {
			t.Errorf("%s: callErr(%v) = %v; want it to say %q", c.name, c.err, got, c.says)
		}
	}
	// A caller that gave up gets its context's error, whatever the store said.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := a.callErr(ctx, fmt.Errorf("scan: %w", store.ErrBusy), req, 0); !errors.Is(got, context.Canceled) || errors.Is(got, store.ErrUnavailable) {
		t.Errorf("callErr of a cancelled call = %v; want context.Canceled alone", got)
	}
}

// TestOpErrorPrefixOnce: opError wraps once, and leaves nil alone.
func TestOpErrorPrefixOnce(t *testing.T) {
	if opError("x", nil) != nil {
		t.Error("opError(nil) is not nil")
	}
	inner := opError("reserve", store.ErrClosed)
	outer := opError("set", fmt.Errorf("member: %w", inner))
	if got := outer.Error(); strings.Count(got, "portalloc: ") != 1 || got != "member: portalloc: reserve: closed" {
		t.Errorf("opError of an error holding an *OpError = %q; want it as it is", got)
	}
	if got := opError("", store.ErrClosed).Error(); got != "portalloc: closed" {
		t.Errorf("opError of a constructor = %q; want %q", got, "portalloc: closed")
	}
}
