package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// misuse is one call that a caller gets wrong, and the sentinel its error
// must wrap (nil: the call must succeed).
type misuse struct {
	name string
	call func() error
	want error
}

// misuseExtra are the cases of OS-specific files (listenfd.Handoff is unix only).
var misuseExtra []func(t *testing.T) []misuse

// TestMisuse: every misuse of the API returns an error wrapping the
// documented sentinel, and none panics. After Close every method but the
// documented readers returns an error wrapping ErrClosed.
func TestMisuse(t *testing.T) {
	ctx := context.Background()
	spec := func(name string) portset.SetSpec {
		return portset.SetSpec{Name: name, Groups: []portset.GroupSpec{{Name: "g", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}}}}
	}
	// A live Allocator with two sets and a pool.
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore})
	one, err := portset.Allocate(ctx, a, spec("one"))
	if err != nil {
		t.Fatal(err)
	}
	two, err := portset.Allocate(ctx, a, spec("two"))
	if err != nil {
		t.Fatal(err)
	}
	twoMember := two.Members()[0]
	hot, err := pool.New(ctx, a, "hot", pool.Spec{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hot.Close() })
	closedPool, err := pool.New(ctx, a, "closed", pool.Spec{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := closedPool.Close(); err != nil {
		t.Fatal(err)
	}

	// A closed Allocator, with what it handed out before Close.
	c, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), Range: allocRange, IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := c.Allocate(ctx, portalloc.Request{Label: "before-close"})
	if err != nil {
		t.Fatal(err)
	}
	cset, err := portset.Allocate(ctx, c, spec("closing"))
	if err != nil {
		t.Fatal(err)
	}
	cpool, err := pool.New(ctx, c, "closing", pool.Spec{Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	taken, err := cpool.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	port := freeRun(t, 1)
	hostile := portalloc.Request{Label: "x\x1b]0;pwned\x07"}

	cases := []misuse{
		// Sets.
		{"Set.Transfer of a nil member", func() error { return one.Transfer(ctx, nil, 1) }, store.ErrInvalid},
		{"Set.Transfer of another set's member", func() error { return one.Transfer(ctx, twoMember, 1) }, store.ErrInvalid},
		{"Set.Member of an unknown group", func() error { _, err := one.Member("nope", 0); return err }, store.ErrInvalid},
		{"Set.Member of an index out of range", func() error { _, err := one.Member("g", 2); return err }, store.ErrInvalid},
		{"Set.Member of a negative index", func() error { _, err := one.Member("g", -1); return err }, store.ErrInvalid},
		{"Set.Member of a known member", func() error { _, err := one.Member("g", 1); return err }, nil},

		// Pools.
		{"NewPool with a name in use", func() error { _, err := pool.New(ctx, a, "hot", pool.Spec{Size: 1}); return err }, store.ErrInvalid},
		{"NewPool with an empty name", func() error { _, err := pool.New(ctx, a, "", pool.Spec{Size: 1}); return err }, store.ErrInvalid},
		{"NewPool with an ESC in its name", func() error { _, err := pool.New(ctx, a, "p\x1b[2J", pool.Spec{Size: 1}); return err }, store.ErrInvalid},
		{"Pool.Update after Pool.Close", func() error { return closedPool.Update(pool.Spec{Size: 2}) }, store.ErrClosed},
		{"Pool.Take after Pool.Close", func() error { _, err := closedPool.Take(ctx); return err }, store.ErrClosed},
		{"Pool.Close twice", closedPool.Close, nil},
		{"NewPool with the name of a closed pool", func() error {
			p, err := pool.New(ctx, a, "closed", pool.Spec{Size: 1})
			if err == nil {
				err = p.Close()
			}
			return err
		}, nil},
		{"Pool.Update of an open pool", func() error { return hot.Update(pool.Spec{Size: 1, MaxUnavailable: "1"}) }, nil},

		// Labels.
		{"Allocate with a title-change label", func() error { _, err := a.Allocate(ctx, hostile); return err }, store.ErrInvalid},
		{"Reserve with a NUL in the label", func() error {
			_, err := a.Reserve(ctx, portalloc.Request{Label: "a\x00b"}, port)
			return err
		}, store.ErrInvalid},
		{"Listen with invalid UTF-8 in the label", func() error {
			_, l, err := a.Listen(ctx, portalloc.Request{Label: "bad\xff"})
			if l != nil {
				_ = l.Close()
			}
			return err
		}, store.ErrInvalid},
		{"Allocate with a 1 MiB label", func() error {
			_, err := a.Allocate(ctx, portalloc.Request{Label: string(make([]byte, 1<<20))})
			return err
		}, store.ErrInvalid},
		{"Allocate for a holder with a 1 MiB name", func() error {
			_, err := a.Allocate(ctx, portalloc.Request{Holder: string(make([]byte, 1<<20)), TTL: time.Minute})
			return err
		}, store.ErrInvalid},
		{"Renew of a holder with nothing", func() error { _, err := a.Renew(ctx, "ci/never", time.Minute); return err }, store.ErrNotFound},
		{"ReleaseHolder of a holder with nothing", func() error { _, err := a.ReleaseHolder(ctx, "ci/never", store.Filter{}); return err }, store.ErrNotFound},
		{"Files of a reservation never made", func() error {
			_, err := a.Files(store.Reservation{Key: store.Key{Protocol: store.TCP, Addr: lo4, Port: port}})
			return err
		}, store.ErrNotFound},

		// After Allocator.Close.
		{"Close twice", c.Close, nil},
		{"Allocate after Close", func() error { _, err := c.Allocate(ctx, portalloc.Request{}); return err }, store.ErrClosed},
		{"AllocateBlock after Close", func() error { _, err := c.AllocateBlock(ctx, portalloc.Request{}, 2); return err }, store.ErrClosed},
		{"Reserve after Close", func() error { _, err := c.Reserve(ctx, portalloc.Request{}, port); return err }, store.ErrClosed},
		{"Listen after Close", func() error { _, _, err := c.Listen(ctx, portalloc.Request{}); return err }, store.ErrClosed},
		{"ListenPacket after Close", func() error { _, _, err := c.ListenPacket(ctx, portalloc.Request{}); return err }, store.ErrClosed},
		{"AllocateSet after Close", func() error { _, err := portset.Allocate(ctx, c, spec("late")); return err }, store.ErrClosed},
		{"NewPool after Close", func() error { _, err := pool.New(ctx, c, "late", pool.Spec{Size: 1}); return err }, store.ErrClosed},
		{"Release after Close", func() error { return c.Release(ctx, cr) }, store.ErrClosed},
		{"Transfer after Close", func() error { return c.Transfer(ctx, cr, 1) }, store.ErrClosed},
		{"Files after Close", func() error { _, err := c.Files(cr); return err }, store.ErrNotFound},
		{"Renew after Close", func() error { _, err := c.Renew(ctx, "ci/x", time.Minute); return err }, store.ErrClosed},
		{"ReleaseHolder after Close", func() error { _, err := c.ReleaseHolder(ctx, "ci/x", store.Filter{}); return err }, store.ErrClosed},
		{"Reap after Close", func() error { _, err := c.Reap(ctx); return err }, store.ErrClosed},
		{"Usage after Close", func() error { _, _, err := c.Usage(ctx); return err }, store.ErrClosed},
		{"Set.Transfer after Close", func() error { return cset.Transfer(ctx, cset.Members()[0], 1) }, store.ErrClosed},
		{"Set.Release after Close", func() error { return cset.Release(ctx) }, nil},
		{"Pool.Take after Close", func() error { _, err := cpool.Take(ctx); return err }, store.ErrClosed},
		{"Pool.Update after Close", func() error { return cpool.Update(pool.Spec{Size: 1}) }, store.ErrClosed},
		{"Pool.Return after Close", func() error { return cpool.Return(taken) }, store.ErrClosed},
		{"Pool.Close after Close", cpool.Close, nil},
		{"Stats, Held, Config and Done after Close", func() error {
			if st := c.Stats(); st.Allocations.Dynamic == 0 || st.Held != 0 {
				return fmt.Errorf("Stats() = %+v; want the allocations made before Close, none held", st)
			}
			if h := c.Held(); len(h) != 0 {
				return fmt.Errorf("Held() = %v; want none", h)
			}
			if c.Config().StateDir == "" || c.Config().Range != allocRange {
				return errors.New("Config changed with Close")
			}
			select {
			case <-c.Done():
			default:
				return errors.New("Done() is not closed")
			}
			return nil
		}, nil},
	}
	for _, extra := range misuseExtra {
		cases = append(cases, extra(t)...)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s panicked: %v", tc.name, p)
					}
				}()
				err = tc.call()
			}()
			switch {
			case tc.want == nil && err != nil:
				t.Errorf("%s = %v; want nil", tc.name, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("%s = %v; want an error wrapping %q", tc.name, err, tc.want)
			}
		})
	}

	// What the refused transfers would have moved is still this process's.
	for _, m := range []*portset.Member{one.Members()[0], twoMember} {
		r := m.Ports["http"]
		if got, err := a.Reserve(ctx, portalloc.Request{Addr: r.Addr}, r.Port); err != nil || got.Port != r.Port {
			t.Errorf("Reserve(%d) after the refused transfers = %v, %v; want this process's reservation back", r.Port, got, err)
		} else {
			_ = a.Release(ctx, got)
		}
	}
	// Close released what the closed Allocator held: another one can have it.
	b := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: c.Config().StateDir})
	if r, err := b.Reserve(ctx, portalloc.Request{Addr: lo4}, cr.Port); err != nil {
		t.Errorf("Reserve(%d) after Close = %v; want the port free", cr.Port, err)
	} else {
		_ = b.Release(ctx, r)
	}
	if rows := storeRows(t, c.Config().StateDir, store.Filter{}); len(rows) != 0 {
		t.Errorf("rows left by the closed Allocator, its set and its pool = %v; want none", rows)
	}
}
