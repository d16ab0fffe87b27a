package portalloc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/mru"
	"github.com/berth-go/berth/store"
)

// TestStoreErrFallsBackOnlyForFailures: what storeErr makes of each kind
// of store error in the fallback mode. A failure of the store falls back
// (nil); a passing shortage, a busy store and a call out of time fail, and
// never fall back.
func TestStoreErrFallsBackOnlyForFailures(t *testing.T) {
	emfile := &os.PathError{Op: "open", Path: "berth.db.lock", Err: syscall.EMFILE}
	for _, c := range []struct {
		name string
		err  error
		want []error // what the result wraps; nil: fall back
		not  []error
	}{
		{"a failure of the store", fmt.Errorf("scan: %w: disk I/O error", store.ErrStorage), nil, nil},
		{"a damaged file", fmt.Errorf("open: %w", store.ErrDamaged), nil, nil},
		{"a newer schema", fmt.Errorf("open: %w", store.ErrSchemaTooNew), nil, nil},
		{"the store's shortage", fmt.Errorf("open: %w", transient.Wrap(emfile)), []error{ErrStoreUnavailable, ErrTransient, syscall.EMFILE}, nil},
		{"a shortage under a failure", fmt.Errorf("scan: %w: %w", store.ErrStorage, emfile), []error{ErrStoreUnavailable, ErrTransient}, nil},
		{"the probe's shortage", fmt.Errorf("probe: socket: %w", syscall.EMFILE), []error{ErrTransient, syscall.EMFILE}, []error{ErrStoreUnavailable}},
		{"out of memory", syscall.ENOMEM, []error{ErrTransient}, nil},
		{"a busy store", fmt.Errorf("scan: %w", store.ErrBusy), []error{ErrStoreUnavailable, store.ErrBusy}, []error{ErrTransient}},
		{"out of time", fmt.Errorf("scan: %w", context.DeadlineExceeded), []error{ErrStoreUnavailable, context.DeadlineExceeded}, nil},
		{"unsafe", fmt.Errorf("open: %w", ErrUnsafe), []error{ErrStoreUnavailable, ErrUnsafe}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &Allocator{
				cfg:  Config{Mode: ModeStateStoreWithFallback},
				log:  logr.Discard(),
				warn: logr.Discard(),
				mru:  mru.New(filepath.Join(t.TempDir(), mruFile), mru.Options{}),
				held: map[heldKey]*holding{},
			}
			got := a.storeErr(context.Background(), c.err, Request{Protocol: TCP})
			switch {
			case c.want == nil && got != nil:
				t.Errorf("storeErr(%v) = %v; want nil: fall back", c.err, got)
			case c.want == nil && a.Backend() != BackendMRU:
				t.Errorf("storeErr(%v) did not fall back", c.err)
			case c.want != nil && got == nil:
				t.Errorf("storeErr(%v) = nil (fell back); want an error", c.err)
			case c.want != nil && a.Backend() != BackendStateStore:
				t.Errorf("storeErr(%v) fell back", c.err)
			}
			for _, w := range c.want {
				if !errors.Is(got, w) {
					t.Errorf("storeErr(%v) = %v; want it to wrap %v", c.err, got, w)
				}
			}
			for _, n := range c.not {
				if errors.Is(got, n) {
					t.Errorf("storeErr(%v) = %v; want it not to wrap %v", c.err, got, n)
				}
			}
		})
	}
}
