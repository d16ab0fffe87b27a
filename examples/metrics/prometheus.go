package main

import (
	"fmt"
	"io"

	"github.com/berth-go/berth/portalloc"
)

// WritePrometheus writes an Allocator's Stats, and the use of its range
// (Allocator.Usage: ports it may hand out, reserved how many of them a
// live reservation holds), in Prometheus' text exposition format.
func WritePrometheus(w io.Writer, st portalloc.Stats, ports, reserved int) {
	metric := func(name, kind, help string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	metric("berth_allocated_ports", "gauge", "Ports of the range with at least one reservation, by any process.")
	fmt.Fprintf(w, "berth_allocated_ports %d\n", reserved)
	metric("berth_available_ports", "gauge", "Ports of the range that Allocate can still hand out.")
	fmt.Fprintf(w, "berth_available_ports %d\n", ports-reserved)
	metric("berth_held_reservations", "gauge", "Reservations this process's Allocator holds.")
	fmt.Fprintf(w, "berth_held_reservations %d\n", st.Held)
	metric("berth_allocation_total", "counter", "Successful allocations, by scope (dynamic: Allocate, static: Reserve).")
	fmt.Fprintf(w, "berth_allocation_total{scope=\"dynamic\"} %d\n", st.Allocations.Dynamic)
	fmt.Fprintf(w, "berth_allocation_total{scope=\"static\"} %d\n", st.Allocations.Static)
	metric("berth_allocation_errors_total", "counter", "Failed allocations, by scope.")
	fmt.Fprintf(w, "berth_allocation_errors_total{scope=\"dynamic\"} %d\n", st.Errors.Dynamic)
	fmt.Fprintf(w, "berth_allocation_errors_total{scope=\"static\"} %d\n", st.Errors.Static)
	metric("berth_probe_failures_total", "counter", "Candidate ports that were free in the store but bound outside berth.")
	fmt.Fprintf(w, "berth_probe_failures_total %d\n", st.ProbeFailures)
	metric("berth_reaped_rows_total", "counter", "Reservations of exited processes deleted.")
	fmt.Fprintf(w, "berth_reaped_rows_total %d\n", st.Reaped)
	metric("berth_fallbacks_total", "counter", "Switches from the state store to the MRU file.")
	fmt.Fprintf(w, "berth_fallbacks_total %d\n", st.Fallbacks)
}
