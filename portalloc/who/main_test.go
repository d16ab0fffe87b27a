package who_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/testproc"
)

func TestMain(m *testing.M) {
	testproc.MaybeRun()
	goleak.VerifyTestMain(m)
}
