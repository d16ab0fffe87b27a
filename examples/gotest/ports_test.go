package greeter_test

import (
	"os"

	"github.com/berth-go/berth/internal/testports"
)

// In berth's own suite other packages' tests bind ports of their own
// choosing without a lock, so this package's ports come from a range no
// other package uses. A downstream module, whose test binaries all go
// through porttest, needs none of this.
func init() {
	if err := os.Setenv("BERTH_PORT_RANGE", testports.Gotest.String()); err != nil {
		panic(err)
	}
}
