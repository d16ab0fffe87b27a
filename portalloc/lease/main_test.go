package lease_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
)

// The leases' example binds ports in portalloc's test range, under its
// lock: it runs when portalloc's own tests do not. The leases' tests, which
// need other processes, stay with portalloc's, which run them as workers.
func TestMain(m *testing.M) {
	if _, err := testports.Lock(testports.Portalloc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}
