package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func TestRun(t *testing.T) {
	testports.Hold(t, testports.Quickstart)
	dir := t.TempDir()
	t.Setenv("BERTH_STATE_DIR", dir)
	t.Setenv("BERTH_MODE", "statestore")
	t.Setenv("BERTH_PORT_RANGE", testports.Quickstart.String()) // not the default: other packages' tests bind there
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "LABEL") || lines[4] != "released 3 ports" {
		t.Fatalf("output:\n%s", out.String())
	}
	for i, label := range []string{"quickstart.web", "quickstart.api", "quickstart.db"} {
		f := strings.Fields(lines[i+1])
		if len(f) != 3 || f[0] != label {
			t.Errorf("row %q; want %s ADDRESS PORT", lines[i+1], label)
			continue
		}
		port, err := strconv.Atoi(f[2])
		if err != nil || !testports.Quickstart.Contains(uint16(port)) {
			t.Errorf("row %q: port not in %v", lines[i+1], testports.Quickstart)
		}
	}
	// Released: the store holds nothing.
	s, err := statestore.Open(context.Background(), filepath.Join(dir, "berth.db"), statestore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rs, err := s.List(context.Background(), store.Filter{}); err != nil || len(rs) != 0 {
		t.Errorf("rows left after the run: %v, %v", rs, err)
	}
}
