//go:build unix

package mru_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/mru"
)

// TestHostileFiles: what stands at the MRU file's path is never opened
// unless it is a regular file of the user's own: a FIFO, a device, a
// directory and links get a clear error within the call's context, and an
// oversized file is set aside (nothing lost) with a log line.
func TestHostileFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tests := []struct {
		name  string
		make  func(t *testing.T, path string)
		want  string // "" for a set-aside file
		other bool   // needs root
	}{
		{"FIFO", func(t *testing.T, path string) {
			t.Helper()
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file", false},
		{"link to /dev/zero", func(t *testing.T, path string) {
			t.Helper()
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link", false},
		{"device node", func(t *testing.T, path string) {
			t.Helper()
			// The null device's numbers (1, 3), made here as a node of the
			// test's own.
			if err := syscall.Mknod(path, syscall.S_IFCHR|0o600, 1<<8|3); err != nil {
				t.Skipf("cannot make a device node: %v", err)
			}
		}, "not a regular file", true},
		{"directory", func(t *testing.T, path string) {
			t.Helper()
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file", false},
		{"link to a file elsewhere", func(t *testing.T, path string) {
			t.Helper()
			target := filepath.Join(t.TempDir(), "target")
			if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link", false},
		{"lock file link", func(t *testing.T, path string) {
			t.Helper()
			if err := os.Symlink(filepath.Join(t.TempDir(), "planted"), path+".lock"); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link", false},
		{"100 MB file", func(t *testing.T, path string) {
			t.Helper()
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(100 << 20); err != nil {
				t.Fatal(err)
			}
		}, "", false},
		{"file of another user", func(t *testing.T, path string) {
			t.Helper()
			if err := os.WriteFile(path, []byte(`{"format":"berth-mru","version":2}`+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, 54321, 54321); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 54321", true},
		{"file others may write", func(t *testing.T, path string) {
			t.Helper()
			if err := os.WriteFile(path, []byte(`{"format":"berth-mru","version":2}`+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}, "may be written", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.other && os.Geteuid() != 0 {
				t.Skip("needs root to give a file to another user")
			}
			var logged logSink
			dir := t.TempDir()
			path := filepath.Join(dir, "mru.json")
			tt.make(t, path)
			f := mru.New(path, mru.Options{Logger: logged.logger()})
			start := time.Now()
			_, err := f.Allocate(ctx, mru.Request{Protocol: "tcp", Addr: lo, Next: seq(30000), Probe: free})
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Allocate took %v", took)
			}
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Allocate = %v; want the oversized file set aside and a port", err)
				}
				if aside, _ := filepath.Glob(path + ".bad-*"); len(aside) != 1 || !logged.has("set it aside") {
					t.Errorf("set aside %v, logged %q; want the file set aside and logged", aside, logged.lines)
				}
				return
			}
			if !errors.Is(err, mru.ErrUnsafe) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Allocate = %v; want ErrUnsafe saying %q", err, tt.want)
			}
			if tt.name == "link to a file elsewhere" {
				if b, _ := os.ReadFile(path); string(b) != "keep me" {
					t.Errorf("the link's target now holds %q; want it untouched", b)
				}
			}
		})
	}
}
