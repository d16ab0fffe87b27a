package greeter_test

import (
	"os"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
)

// In berth's own suite the other packages' tests bind ports through stores
// of their own, not the per-user store porttest shares, so this package's
// ports come from a range no other package uses. A downstream module, whose
// test binaries all go through porttest, needs none of this.
func init() {
	if err := os.Setenv(portalloc.EnvPortRange, testports.Gotest.String()); err != nil {
		panic(err)
	}
}
