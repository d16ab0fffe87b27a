package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portlock/porttest"
	"github.com/berth-go/berth/store"
)

// TestPorttestAndStore: porttest keeps no record, yet the store's
// Allocators and porttest never hand out each other's ports, both ways.
func TestPorttestAndStore(t *testing.T) {
	ctx := context.Background()
	base := freeRun(t, 2)
	t.Setenv(porttest.EnvPortRange, fmt.Sprintf("%d-%d", base, base+1))
	a := newAllocator(t, portalloc.Config{Range: store.Range{First: base, Last: base + 1}, AllowEphemeralOverlap: true})

	// porttest first: the Allocator is refused its port, and told who
	// holds it.
	var p uint16
	t.Run("porttest first", func(t *testing.T) {
		p = uint16(porttest.Port(t))
		_, err := a.Reserve(ctx, portalloc.Request{Addr: lo4}, p)
		var ce *store.ConflictError
		if !errors.As(err, &ce) || !slices.Contains(ce.PIDs, os.Getpid()) {
			t.Fatalf("Reserve(%d) of porttest's port = %v; want a conflict naming pid %d", p, err, os.Getpid())
		}
		if _, err := a.Reserve(ctx, portalloc.Request{Addr: any6}, p); !errors.Is(err, store.ErrHeld) {
			t.Fatalf("Reserve([::]:%d) of porttest's port = %v; want ErrHeld", p, err)
		}
		r, err := a.Allocate(ctx, portalloc.Request{Addr: lo4})
		if err != nil || r.Port == p {
			t.Fatalf("Allocate beside porttest's port %d = %v, %v; want the other port", p, r, err)
		}
		if _, err := a.Allocate(ctx, portalloc.Request{Addr: lo4}); !errors.Is(err, store.ErrExhausted) {
			t.Fatalf("Allocate with both ports taken = %v; want ErrExhausted", err)
		}
		if err := a.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
	// Its test over, porttest's port is free again.
	r, err := a.Reserve(ctx, portalloc.Request{Addr: any4}, p)
	if err != nil {
		t.Fatalf("Reserve(%d) once porttest's test ended = %v; want it granted", p, err)
	}

	// The store's first: porttest passes its reservation over, on every
	// address, every time.
	for i := range 20 {
		for _, on := range []string{"127.0.0.1", "0.0.0.0", "::1"} {
			t.Run(fmt.Sprintf("store first/%d/%s", i, on), func(t *testing.T) {
				if got := porttest.Port(t, porttest.On(on)); got == int(r.Port) {
					t.Fatalf("porttest handed out %d on %s, which the store's Allocator holds on 0.0.0.0", got, on)
				}
			})
		}
	}
}

// TestPorttestFailsWhenStoreHoldsAll: with every port of its range held
// by a store's Allocator, porttest fails the test that asked, saying why,
// rather than hand out a held port. The failing test runs in a child test
// binary.
func TestPorttestFailsWhenStoreHoldsAll(t *testing.T) {
	if os.Getenv(envChildTest) == "porttest" {
		port := porttest.Port(t) // fails the test: every port is held
		fmt.Println("granted", port)
		return
	}
	ctx := context.Background()
	port := freeRun(t, 1)
	a := newAllocator(t, portalloc.Config{Range: store.Range{First: port, Last: port}, AllowEphemeralOverlap: true})
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: lo4}, port); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestPorttestFailsWhenStoreHoldsAll$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildTest+"=porttest", fmt.Sprintf("%s=%d-%d", porttest.EnvPortRange, port, port))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || strings.Contains(string(out), "granted") || !strings.Contains(string(out), "every port is locked or bound") {
		t.Fatalf("porttest with its one port held by the store: %v\n%s\nwant the test failed, saying every port is locked or bound", err, out)
	}
}
