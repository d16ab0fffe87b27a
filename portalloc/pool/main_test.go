package pool_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc/internal/testrig"
)

// The pools' tests and examples bind ports in the package's own test
// range, under its lock (see testrig).
func TestMain(m *testing.M) {
	testrig.Use(testports.Pool)
	if _, err := testports.Lock(testports.Pool); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// listen binds port on addr outside berth, as another program would.
func listen(tb testing.TB, addr netip.Addr, port uint16) net.Listener {
	tb.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		tb.Fatalf("port %d is not bindable: %v", port, err)
	}
	return l
}

// The package's tests use the rig portalloc's tests use.
var (
	newAllocator     = testrig.NewAllocator
	freeRun          = testrig.FreeRun
	exampleAllocator = testrig.ExampleAllocator
)
