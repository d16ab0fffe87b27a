package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/pgschema"
	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// storeDSN returns a connection string to a schema of this test's own on
// the server BERTH_TEST_POSTGRES names, or skips the test.
func storeDSN(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv("BERTH_TEST_POSTGRES")
	if base == "" || strings.Contains(base, "://") {
		tb.Skip("set BERTH_TEST_POSTGRES to a key=value PostgreSQL DSN to run the fleet example (bash .ci/postgres start prints one)")
	}
	dsn, drop, err := pgschema.Create(context.Background(), base, "berth_fleet_example")
	if err != nil {
		tb.Fatalf("BERTH_TEST_POSTGRES: %v", err)
	}
	tb.Cleanup(func() { _ = drop() })
	return dsn
}

// TestMain runs the binary as host-a's second process when run asks.
func TestMain(m *testing.M) {
	if os.Getenv(envAsk) != "" {
		main()
	}
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	dsn := storeDSN(t)
	testports.Hold(t, testports.Fleet)
	t.Setenv(portalloc.EnvStore, dsn)
	t.Setenv(portalloc.EnvHost, "")
	t.Setenv(portalloc.EnvPortRange, testports.Fleet.String()) // not the default: other packages' tests bind there
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[5], "released 2 ports") {
		t.Fatalf("output:\n%s", out.String())
	}
	// "host-a any port N ...": the port host-a was granted.
	port := func(line string) int {
		t.Helper()
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "host-a" || f[1] != "any" {
			t.Fatalf("row %q; want host-a any port N", line)
		}
		p, err := strconv.Atoi(f[3])
		if err != nil || !testports.Fleet.Contains(uint16(p)) {
			t.Errorf("row %q: no port of %v", line, testports.Fleet)
		}
		return p
	}
	web := port(lines[1])
	for i, want := range []string{
		fmt.Sprintf("host-b port %d %d (each host has its own ports)", web, web),
		fmt.Sprintf("host-a port %d refused: host-a holds it already", web),
	} {
		if got := strings.Join(strings.Fields(lines[i+2]), " "); got != want {
			t.Errorf("row %d = %q; want %q", i+2, got, want)
		}
	}
	if api := port(lines[4]); api == web {
		t.Errorf("second process of host-a got %d, host-a's first's port, too", web)
	}

	// Released: the store holds nothing on either host.
	for _, host := range []string{"host-a", "host-b"} {
		s, err := fleet.OpenStore(context.Background(), portalloc.Config{StoreDSN: dsn, Host: host})
		if err != nil {
			t.Fatal(err)
		}
		if rs, err := s.List(context.Background(), store.Filter{}); err != nil || len(rs) != 0 {
			t.Errorf("rows of %s left after the run: %v, %v", host, rs, err)
		}
		_ = s.Close()
	}
}
