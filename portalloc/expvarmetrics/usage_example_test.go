package expvarmetrics_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"go.uber.org/goleak"
)

// ReadUsage counts the reservations of the range in the store, whoever
// made them: here a second Allocator on the same state directory, as
// another process would be.
func ExampleReadUsage() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	// A part of portalloc's test range, under its lock (see TestMain).
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: 29800, Last: 29899}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	b, err := portalloc.New(ctx, a.Config())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	for _, x := range []*portalloc.Allocator{a, a, b} {
		if _, err := x.Allocate(ctx, portalloc.Request{}); err != nil {
			fmt.Println(err)
			return
		}
	}
	u, err := expvarmetrics.ReadUsage(ctx, a)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ports:", u.Ports, "reserved:", u.Reserved, "available:", u.Available)
	// Output:
	// ports: 100 reserved: 3 available: 97
}

// The example of ReadUsage binds ports in portalloc's test range, under
// its lock: it runs when portalloc's own tests do not.
func TestMain(m *testing.M) {
	if _, err := testports.Lock(testports.Portalloc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}
