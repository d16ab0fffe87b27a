package main

import (
	"fmt"
	"io"

	"github.com/berth-go/berth/portalloc/expvarmetrics"
)

// WritePrometheus writes m in Prometheus' text exposition format.
func WritePrometheus(w io.Writer, m expvarmetrics.Metrics) {
	metric := func(name, kind, help string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	metric("berth_allocated_ports", "gauge", "Ports of the range with at least one reservation, by any process.")
	fmt.Fprintf(w, "berth_allocated_ports %d\n", m.Usage.Reserved)
	metric("berth_available_ports", "gauge", "Ports of the range that Allocate can still hand out.")
	fmt.Fprintf(w, "berth_available_ports %d\n", m.Usage.Available)
	metric("berth_held_reservations", "gauge", "Reservations this process's Allocator holds.")
	fmt.Fprintf(w, "berth_held_reservations %d\n", m.Stats.Held)
	metric("berth_allocation_total", "counter", "Successful allocations, by scope (dynamic: Allocate, static: Reserve).")
	fmt.Fprintf(w, "berth_allocation_total{scope=\"dynamic\"} %d\n", m.Stats.Allocations.Dynamic)
	fmt.Fprintf(w, "berth_allocation_total{scope=\"static\"} %d\n", m.Stats.Allocations.Static)
	metric("berth_allocation_errors_total", "counter", "Failed allocations, by scope.")
	fmt.Fprintf(w, "berth_allocation_errors_total{scope=\"dynamic\"} %d\n", m.Stats.Errors.Dynamic)
	fmt.Fprintf(w, "berth_allocation_errors_total{scope=\"static\"} %d\n", m.Stats.Errors.Static)
	metric("berth_probe_failures_total", "counter", "Candidate ports that were free in the store but bound outside berth.")
	fmt.Fprintf(w, "berth_probe_failures_total %d\n", m.Stats.ProbeFailures)
	metric("berth_reaped_rows_total", "counter", "Reservations of exited processes deleted.")
	fmt.Fprintf(w, "berth_reaped_rows_total %d\n", m.Stats.Reaped)
	metric("berth_fallbacks_total", "counter", "Switches from the state store to the MRU file.")
	fmt.Fprintf(w, "berth_fallbacks_total %d\n", m.Stats.Fallbacks)
}
