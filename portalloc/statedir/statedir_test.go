package statedir_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/statedir"
)

// TestDefaultIsNewsDefault: Default, DefaultReason and TakeOver name the
// directory that portalloc.New uses for an empty Config.StateDir, and the
// reason says which variable chose it.
func TestDefaultIsNewsDefault(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("the XDG rule is the default on Linux; this is %s", runtime.GOOS)
	}
	xdg := t.TempDir()
	t.Setenv("XDG_STATE_HOME", xdg)
	want := filepath.Join(xdg, "berth")

	dir, err := statedir.Default()
	if err != nil || dir != want {
		t.Fatalf("Default() = %q, %v; want %q", dir, err, want)
	}
	dir, reason, err := statedir.DefaultReason()
	if err != nil || dir != want || !strings.Contains(reason, "$XDG_STATE_HOME/berth") {
		t.Errorf("DefaultReason() = %q, %q, %v; want %q and a reason naming $XDG_STATE_HOME/berth", dir, reason, err, want)
	}
	dir, err = statedir.TakeOver(context.Background(), logr.Discard())
	if err != nil || dir != want {
		t.Errorf("TakeOver() = %q, %v; want %q", dir, err, want)
	}

	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := a.Config().StateDir; got != want {
		t.Errorf("New's StateDir = %q; want Default's %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(want, statedir.DatabaseFile)); err != nil {
		t.Errorf("New made no %s in Default's directory: %v", statedir.DatabaseFile, err)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
