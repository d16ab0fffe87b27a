// The examples run with the package's tests, and their ports stay inside
// the package's test range (27000-32767, see internal/testports).

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/testrig"
	"github.com/berth-go/berth/store"
)

// A program reserves a port, listens on it, and releases it when done,
// also when a signal stops it: Release and Close release under the
// context the signal cancelled.
func Example() {
	// A program would leave StateDir zero: the per-user store.
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// Without a Range it would be DefaultRange, 20000-32767. IgnoreEnv
	// keeps the BERTH_* variables out of the example; a program reads
	// them.
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: store.Range{First: 29000, Last: 29999}, IgnoreEnv: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := a.Close(); err != nil {
			fmt.Println(err)
		}
	}()

	r, err := a.Allocate(ctx, portalloc.Request{Label: "api.http"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := a.Release(ctx, r); err != nil {
			fmt.Println(err)
		}
	}()
	ln, err := net.Listen("tcp", r.AddrPort().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()

	fmt.Println("label:", r.Label, "kind:", r.Kind)
	fmt.Println("in the range:", a.Config().Range.Contains(r.Port))
	// Output:
	// label: api.http kind: dynamic
	// in the range: true
}

// Reserve takes a specific port; a conflict says who holds it, even when
// that is the caller's own wildcard reservation.
func ExampleAllocator_Reserve() {
	a, done := testrig.ExampleAllocator(29100)
	defer done()
	ctx := context.Background()

	any4 := netip.MustParseAddr("0.0.0.0")
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: any4, Label: "proxy"}, 28080); err != nil {
		fmt.Println(err)
		return
	}
	_, err := a.Reserve(ctx, portalloc.Request{}, 28080)
	var ce *store.ConflictError
	fmt.Println(errors.Is(err, store.ErrHeld), errors.As(err, &ce) && ce.Self)
	fmt.Println(err)
	// Output:
	// true true
	// portalloc: reserve: tcp 127.0.0.1:28080 conflicts with this process's own reservation of tcp 0.0.0.0:28080 (label "proxy"); release that first or choose another port
}

// Listen returns the port already bound: nothing can take it between the
// reservation and the bind.
func ExampleAllocator_Listen() {
	a, done := testrig.ExampleAllocator(29200)
	defer done()
	ctx := context.Background()

	r, ln, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = a.Release(ctx, r) }()
	defer ln.Close()

	fmt.Println(ln.Addr().String() == r.AddrPort().String())
	_, err = net.Listen("tcp", r.AddrPort().String())
	fmt.Println(err != nil)
	// Output:
	// true
	// true
}

// ListenPacket is Listen for UDP.
func ExampleAllocator_ListenPacket() {
	a, done := testrig.ExampleAllocator(29300)
	defer done()
	ctx := context.Background()

	r, pc, err := a.ListenPacket(ctx, portalloc.Request{Label: "dns"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = a.Release(ctx, r) }()
	defer pc.Close()
	fmt.Println(r.Protocol, pc.LocalAddr().String() == r.AddrPort().String())
	// Output:
	// udp true
}

// A reservation belongs to the process: a second Reserve of a port the
// process holds returns it with one more hold, and the port stays reserved
// until the last hold is released.
func ExampleAllocator_Release() {
	a, done := testrig.ExampleAllocator(29400)
	defer done()
	ctx := context.Background()

	r, err := a.Allocate(ctx, portalloc.Request{Label: "db"})
	if err != nil {
		fmt.Println(err)
		return
	}
	again, err := a.Reserve(ctx, portalloc.Request{}, r.Port)
	fmt.Println(again == r, err)

	fmt.Println(a.Release(ctx, r), len(a.Held())) // one hold left
	fmt.Println(a.Release(ctx, r), len(a.Held())) // released
	err = a.Release(ctx, r)
	fmt.Println(errors.Is(err, store.ErrNotFound))
	// Output:
	// true <nil>
	// <nil> 1
	// <nil> 0
	// true
}

// Stats counts this Allocator's calls; Usage reads how full the range is
// for every process.
func ExampleAllocator_Stats() {
	a, done := testrig.ExampleAllocator(29600)
	defer done()
	ctx := context.Background()

	for range 3 {
		if _, err := a.Allocate(ctx, portalloc.Request{}); err != nil {
			fmt.Println(err)
			return
		}
	}
	st := a.Stats()
	fmt.Println(st.Held, st.Allocations.Dynamic, st.Ports, st.Fallback == "")
	ports, reserved, err := a.Usage(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ports, reserved)
	// Output:
	// 3 3 100 true
	// 100 3
}

// A block of consecutive ports for software configured by a base port.
func ExampleAllocator_AllocateBlock() {
	a, done := testrig.ExampleAllocator(29700)
	defer done()
	ctx := context.Background()

	rs, err := a.AllocateBlock(ctx, portalloc.Request{Label: "node", Order: portalloc.OrderLowest}, 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rs {
		fmt.Println(r.Port - rs[0].Port)
	}
	// Output:
	// 0
	// 1
	// 2
}

// A named holder's reservation outlives the process that asked: a CI job's
// port stays reserved for the job under a lease, which its controller
// renews and ends with ReleaseHolder.
func ExampleAllocator_Renew() {
	a, done := testrig.ExampleAllocator(29800)
	defer done()
	ctx := context.Background()

	r, err := a.Allocate(ctx, portalloc.Request{Label: "web", Holder: "ci/job-4711", TTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Owner.Holder, len(a.Held())) // the holder's, not the Allocator's

	n, err := a.Renew(ctx, "ci/job-4711", 2*time.Minute)
	fmt.Println(n, err)

	n, err = a.ReleaseHolder(ctx, "ci/job-4711", store.Filter{})
	fmt.Println(n, err)
	_, err = a.Renew(ctx, "ci/job-4711", time.Minute)
	fmt.Println(errors.Is(err, store.ErrNotFound))
	// Output:
	// ci/job-4711 0
	// 1 <nil>
	// 1 <nil>
	// true
}

// Resolve shows the Config New would use: each zero field from its BERTH_*
// variable, then the defaults.
func ExampleConfig_Resolve() {
	os.Setenv("BERTH_PORT_RANGE", "21000-21999")
	os.Setenv("BERTH_MODE", "statestore")
	os.Setenv("BERTH_STATE_DIR", "/var/tmp/berth-example")
	defer os.Unsetenv("BERTH_PORT_RANGE")
	defer os.Unsetenv("BERTH_MODE")
	defer os.Unsetenv("BERTH_STATE_DIR")

	cfg, err := portalloc.Config{}.Resolve()
	fmt.Println(cfg.Mode, cfg.Range, cfg.StateDir, err)

	// A field set in code wins over its variable.
	cfg, err = portalloc.Config{Mode: portalloc.ModeMRU}.Resolve()
	fmt.Println(cfg.Mode, err)

	os.Setenv("BERTH_MODE", "fast")
	_, err = portalloc.Config{}.Resolve()
	fmt.Println(err)
	// Output:
	// statestore 21000-21999 /var/tmp/berth-example <nil>
	// mru <nil>
	// portalloc: BERTH_MODE "fast": want "statestore", "statestore-with-fallback" or "mru"
}

// Two checkouts of one project use the label "web" side by side: each
// Allocator has a scope of its own (in a program, usually "git", the root
// of the git worktree it runs in), so each gets a port of its own, and the
// same one again after a restart.
func ExampleConfig_scope() {
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	web := func(scope string) (store.Reservation, error) {
		a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: store.Range{First: 29000, Last: 29999}, Scope: scope, IgnoreEnv: true})
		if err != nil {
			return store.Reservation{}, err
		}
		defer a.Close() // releases the port: a restart
		return a.Allocate(ctx, portalloc.Request{Label: "web", Sticky: true})
	}
	main1, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	wt1, err := web("/src/shop-feature")
	if err != nil {
		fmt.Println(err)
		return
	}
	main2, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(main1.Label)
	fmt.Println("same port after a restart:", main1.Port == main2.Port)
	fmt.Println("other worktree, other port:", main1.Port != wt1.Port)
	// Output:
	// web@/src/shop
	// same port after a restart: true
	// other worktree, other port: true
}

// ResolveScope names a scope as New resolves Config.Scope.
func ExampleResolveScope() {
	s, err := portalloc.ResolveScope("shop")
	fmt.Println(s, err)
	_, err = portalloc.ResolveScope("env:SHOP")
	fmt.Println(errors.Is(err, store.ErrInvalid))
	// Output:
	// shop <nil>
	// true
}

// Logging: berth's decisions on standard error in slog's text format, from
// info on. A program that logs with slog already can pass its own handler
// with logr.FromSlogHandler instead.
func ExampleTextLogger() {
	cfg := portalloc.Config{Logger: portalloc.TextLogger(os.Stderr, slog.LevelInfo)}
	_ = cfg // portalloc.New(ctx, cfg)
}
