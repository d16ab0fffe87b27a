package exclude_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/exclude"
)

// setLocalReserved sets net.ipv4.ip_local_reserved_ports to value for the
// test and puts the old value back when it ends, failed or not. It skips
// the test where it cannot write the sysctl (not root, a read-only /proc).
func setLocalReserved(tb testing.TB, value string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: it sets net.ipv4.ip_local_reserved_ports")
	}
	old, err := os.ReadFile(portrange.LocalReservedFile)
	if err != nil {
		tb.Skipf("cannot read %s: %v", portrange.LocalReservedFile, err)
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

// TestListLocalReserved: List names the ranges of
// net.ipv4.ip_local_reserved_ports as it finds them now. The test adds its
// range to those already there, far above berth's default range.
func TestListLocalReserved(t *testing.T) {
	old, err := os.ReadFile(portrange.LocalReservedFile)
	if err != nil {
		t.Skipf("cannot read %s: %v", portrange.LocalReservedFile, err)
	}
	reserved := portalloc.Range{First: 64990, Last: 64993}
	value := reserved.String()
	if o := strings.TrimSpace(string(old)); o != "" {
		value = o + "," + value
	}
	setLocalReserved(t, value)
	ex, err := exclude.List(portalloc.Config{})
	found := false
	for _, e := range ex {
		found = found || e.Source == "net.ipv4.ip_local_reserved_ports" && strings.Contains(fmt.Sprint(e.Ports), fmt.Sprint(reserved))
	}
	if !found || err != nil {
		t.Errorf("List() = %+v, %v; want net.ipv4.ip_local_reserved_ports with %v", ex, err, reserved)
	}
}
