package transient_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-go/berth/internal/transient"
)

// TestAs: SQLite reports a failed open without the errno; As gives the
// error the words of the errno found another way.
func TestAs(t *testing.T) {
	cause := errors.New("unable to open database file (14)")
	got := transient.As(syscall.EMFILE, cause)
	if !errors.Is(got, transient.ErrTransient) || !errors.Is(got, cause) || !strings.Contains(got.Error(), "too many open files") {
		t.Errorf("As(EMFILE, %v) = %v; want it to wrap ErrTransient and the cause, saying too many open files", cause, got)
	}
}
