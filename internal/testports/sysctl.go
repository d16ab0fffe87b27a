package testports

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/portrange"
)

// SetLocalReserved sets net.ipv4.ip_local_reserved_ports to value for the
// test and puts the old value back when it ends, failed or not. Tests of
// several packages set it, from test binaries that may run at once: it
// holds a lock of this host for the test's length, so one test's restore
// never undoes another's setting or leaves it behind. It skips the test
// where it cannot write the sysctl (not root, a read-only /proc).
func SetLocalReserved(tb testing.TB, value string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: it sets net.ipv4.ip_local_reserved_ports")
	}
	path := filepath.Join(os.TempDir(), "berth-testports-ip_local_reserved_ports.lock")
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		tb.Fatalf("testports: %v", err)
	}
	if err := lockFile(f, func() { fmt.Fprintf(os.Stderr, "testports: waiting for %s\n", path) }); err != nil {
		_ = f.Close()
		tb.Fatalf("testports: lock %s: %v", path, err)
	}
	tb.Cleanup(func() { _ = f.Close() }) // after the restore below: cleanups run last first
	old, err := os.ReadFile(portrange.LocalReservedFile)
	if err != nil {
		tb.Skipf("cannot read %s: %v", portrange.LocalReservedFile, err)
	}
	if strings.HasPrefix(value, "+") { // to those there already
		value = strings.TrimSpace(string(old)) + "," + value[1:]
		value = strings.TrimPrefix(value, ",")
	}
	if err := os.WriteFile(portrange.LocalReservedFile, []byte(value), 0); err != nil {
		tb.Skipf("cannot set net.ipv4.ip_local_reserved_ports (%v): a container without a writable /proc/sys?", err)
	}
	tb.Cleanup(func() {
		// An empty list is written as a newline; the file reads so.
		restore := strings.TrimSpace(string(old))
		if restore == "" {
			restore = "\n"
		}
		if err := os.WriteFile(portrange.LocalReservedFile, []byte(restore), 0); err != nil {
			tb.Errorf("could not restore net.ipv4.ip_local_reserved_ports to %q: %v", old, err)
		}
	})
}
