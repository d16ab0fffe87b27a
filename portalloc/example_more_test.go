package portalloc_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
)

// exampleAllocator opens an Allocator on a state directory of its own, in a
// part of the package's test range.
func exampleAllocator(first uint16) (*portalloc.Allocator, func()) {
	dir, _ := os.MkdirTemp("", "berth-example")
	a, err := portalloc.New(context.Background(), portalloc.Config{
		StateDir: dir, Mode: portalloc.ModeStateStore,
		Range: portalloc.Range{First: first, Last: first + 99},
	})
	if err != nil {
		fmt.Println(err)
		os.RemoveAll(dir)
		return nil, func() {}
	}
	return a, func() { _ = a.Close(); os.RemoveAll(dir) }
}

// Listen returns the port already bound: nothing can take it between the
// reservation and the bind.
func ExampleAllocator_Listen() {
	a, done := exampleAllocator(29200)
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
	a, done := exampleAllocator(29300)
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

// Transfer hands a reservation to another process, which then owns it: it
// ends with that process, not with this one.
func ExampleAllocator_Transfer() {
	a, done := exampleAllocator(29400)
	defer done()
	ctx := context.Background()

	r, err := a.Allocate(ctx, portalloc.Request{Label: "daemon"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Here the parent process stands in for a daemon the program started.
	if err := a.Transfer(ctx, r, os.Getppid()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(a.Held()))
	// Output:
	// 0
}

// Stats counts this Allocator's calls; Usage reads how full the range is
// for every process.
func ExampleAllocator_Stats() {
	a, done := exampleAllocator(29600)
	defer done()
	ctx := context.Background()

	for range 3 {
		if _, err := a.Allocate(ctx, portalloc.Request{}); err != nil {
			fmt.Println(err)
			return
		}
	}
	st := a.Stats()
	fmt.Println(st.Backend, st.Held, st.Allocations.Dynamic)
	u, err := expvarmetrics.ReadUsage(ctx, a)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(u.Ports, u.Reserved, u.Available)
	// Output:
	// statestore 3 3
	// 100 3 97
}

// A block of consecutive ports for software configured by a base port.
func ExampleAllocator_AllocateBlock() {
	a, done := exampleAllocator(29700)
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

// Logging: berth's decisions on standard error in slog's text format, from
// info on. A program that logs with slog already can pass its own handler
// with logr.FromSlogHandler instead.
func ExampleTextLogger() {
	cfg := portalloc.Config{Logger: portalloc.TextLogger(os.Stderr, slog.LevelInfo)}
	_ = cfg // portalloc.New(ctx, cfg)
}
