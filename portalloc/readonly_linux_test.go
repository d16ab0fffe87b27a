package portalloc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// TestReadOnlyConnectionIsOpenedAgain: SQLite opens the store, or its
// shared memory (the -shm file), read-only when it cannot open it for
// writing at that moment (here the file is immutable while the Allocator
// opens it; in use, a process out of descriptors for an instant), and the
// connection stays read-only. The shared memory's state is one per process
// and file, which every connection the process opens to that file takes
// on while another is open. Once the file can be written, the Allocator's
// next write opens the store again, instead of failing with "attempt to
// write a readonly database" for as long as it lives.
func TestReadOnlyConnectionIsOpenedAgain(t *testing.T) {
	needRoot(t, "a store file that cannot be opened for writing (chattr +i)")
	for _, suffix := range []string{"", "-shm"} {
		t.Run("file"+suffix, func(t *testing.T) { testReadOnlyOpenedAgain(t, suffix) })
	}
}

func testReadOnlyOpenedAgain(t *testing.T, suffix string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.db")
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + suffix); err != nil {
		t.Fatalf("after a store closed: %v; want %s kept", err, path+suffix)
	}
	if out, err := exec.Command("chattr", "+i", path+suffix).CombinedOutput(); err != nil {
		t.Skipf("skipping: chattr +i %s: %v (%s)", path+suffix, err, out)
	}
	mutable := func() {
		if out, err := exec.Command("chattr", "-i", path+suffix).CombinedOutput(); err != nil {
			t.Errorf("chattr -i %s: %v (%s)", path+suffix, err, out)
		}
	}
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: allocRange, IgnoreEnv: true})
	mutable()
	if err != nil {
		t.Fatalf("New on an immutable %s = %v; want it opened for reading", path+suffix, err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	r, err := a.Allocate(ctx, portalloc.Request{Label: "after"})
	if err != nil {
		t.Fatalf("Allocate once the file can be written = %v; want the store opened again and a port", err)
	}
	rows := storeRows(t, dir, store.Filter{Label: "after"})
	if len(rows) != 1 || rows[0].Port != r.Port {
		t.Errorf("rows labelled after = %+v; want the one of port %d", rows, r.Port)
	}
}
