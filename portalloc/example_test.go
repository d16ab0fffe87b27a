// The examples run with the package's tests, and their ports stay inside
// the package's test range (27000-32767, see internal/testports).

package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"

	"github.com/berth-go/berth/portalloc"
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

	// Without a Range it would be DefaultRange, 20000-32767.
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: portalloc.Range{First: 29000, Last: 29999}})
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

	fmt.Println("backend:", r.Backend)
	fmt.Println("in the range:", a.Config().Range.Contains(r.Port))
	// Output:
	// backend: statestore
	// in the range: true
}

// Reserve takes a specific port; a conflict says who holds it, even when
// that is the caller's own wildcard reservation.
func ExampleAllocator_Reserve() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	any4 := netip.MustParseAddr("0.0.0.0")
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: any4, Label: "proxy"}, 28080); err != nil {
		fmt.Println(err)
		return
	}
	_, err = a.Reserve(ctx, portalloc.Request{}, 28080)
	var ce *portalloc.ConflictError
	fmt.Println(errors.Is(err, portalloc.ErrPortHeld), errors.As(err, &ce) && ce.Self)
	fmt.Println(err)
	// Output:
	// true true
	// portalloc: reserve: tcp 127.0.0.1:28080 conflicts with this process's own reservation of tcp 0.0.0.0:28080 (label "proxy"); release that first or choose another port
}

func ExampleParseRange() {
	r, err := portalloc.ParseRange("20000-32767")
	fmt.Println(r.First, r.Last, r.Size(), err)

	_, err = portalloc.ParseRange("30000-20000")
	fmt.Println(err)
	// Output:
	// 20000 32767 12768 <nil>
	// portalloc: port range "30000-20000": want FIRST-LAST with FIRST <= LAST; the first port is above the last
}

func ExampleConfigFromEnv() {
	os.Setenv("BERTH_PORT_RANGE", "21000-21999")
	os.Setenv("BERTH_MODE", "statestore")
	defer os.Unsetenv("BERTH_PORT_RANGE")
	defer os.Unsetenv("BERTH_MODE")

	cfg, err := portalloc.ConfigFromEnv()
	fmt.Println(cfg.Mode, cfg.Range, err)

	os.Setenv("BERTH_MODE", "fast")
	_, err = portalloc.ConfigFromEnv()
	fmt.Println(err)
	// Output:
	// statestore 21000-21999 <nil>
	// BERTH_MODE "fast": want "statestore", "statestore-with-fallback" or "mru"
}
