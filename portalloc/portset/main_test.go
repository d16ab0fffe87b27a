package portset_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc/internal/testrig"
)

// The sets' examples bind ports in the package's test range, under its
// The sets' tests that
// need other processes stay with portalloc's, which run them as workers.

func TestMain(m *testing.M) {
	testrig.Use(testports.Portset)
	if _, err := testports.Lock(testports.Portset); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// The package's tests use the rig portalloc's tests use.
var (
	newAllocator     = testrig.NewAllocator
	freeRun          = testrig.FreeRun
	exampleAllocator = testrig.ExampleAllocator
)
