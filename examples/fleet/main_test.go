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
	t.Setenv("BERTH_STORE", dsn)
	t.Setenv("BERTH_HOST", "")
	t.Setenv("BERTH_PORT_RANGE", testports.Fleet.String()) // not the default: other packages' tests bind there
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[6], "released 2 ports") {
		t.Fatalf("output:\n%s", out.String())
	}
	// "WHO any port N ...": the port WHO was granted.
	port := func(line, who string) int {
		t.Helper()
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != who || f[1] != "any" {
			t.Fatalf("row %q; want %s any port N", line, who)
		}
		i := 3
		if f[2] == "port," {
			i = 4 // "any port, fleet-wide N"
		}
		p, err := strconv.Atoi(f[i])
		if err != nil || !testports.Fleet.Contains(uint16(p)) {
			t.Errorf("row %q: no port of %v", line, testports.Fleet)
		}
		return p
	}
	web, pod := port(lines[1], "host-a"), port(lines[2], holder)
	if web == pod {
		t.Fatalf("host-a and %s were both granted %d", holder, web)
	}
	for i, want := range []string{
		fmt.Sprintf("host-a port %d refused: pid ", web),
		fmt.Sprintf("host-a port %d refused: %s holds it fleet-wide", pod, holder),
	} {
		if got := strings.Join(strings.Fields(lines[i+3]), " "); !strings.HasPrefix(got, want) {
			t.Errorf("row %d = %q; want %q...", i+3, got, want)
		}
	}
	if api := port(lines[5], "host-a"); api == web || api == pod {
		t.Errorf("second process of host-a got %d, a port another holds", api)
	}

	// Released: the store holds nothing.
	s, err := fleet.Open(context.Background(), portalloc.Config{StoreDSN: dsn, Host: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if rs, err := s.List(context.Background(), store.Filter{}); err != nil || len(rs) != 0 {
		t.Errorf("rows left after the run: %v, %v", rs, err)
	}
	if ls, err := s.Leases(context.Background()); err != nil || len(ls) != 0 {
		t.Errorf("leases left after the run: %v, %v", ls, err)
	}
}
