package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"
)

func TestRun(t *testing.T) {
	testports.Hold(t, testports.Metrics)
	t.Setenv("BERTH_STATE_DIR", t.TempDir())
	t.Setenv("BERTH_MODE", "statestore")
	t.Setenv("BERTH_PORT_RANGE", testports.Metrics.String()) // not the default: other packages' tests bind there
	var out bytes.Buffer
	if err := run(context.Background(), "", &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"# TYPE berth_allocated_ports gauge\nberth_allocated_ports 4\n",
		fmt.Sprintf("berth_available_ports %d\n", testports.Metrics.Size()-4),
		"berth_held_reservations 4\n",
		"berth_allocation_total{scope=\"dynamic\"} 4\n",
		"berth_allocation_total{scope=\"static\"} 1\n",
		"berth_allocation_errors_total{scope=\"dynamic\"} 0\n",
		"berth_allocation_errors_total{scope=\"static\"} 2\n",
		"berth_probe_failures_total 1\n",
		"berth_reaped_rows_total 0\n",
		"berth_fallbacks_total 0\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
