// Package testports gives each package of berth's own test suite a port
// range of its own.
//
// go test ./... runs the test binaries of the packages in parallel on one
// host, and most of them open a private state store in a temporary
// directory. Two private stores can hand out the same port; both bind
// probes pass, and then one of the two binds fails. So a test that
// allocates, reserves, probes or binds a port stays inside its package's
// range, listed in All, and no two ranges overlap (see TestDisjoint).
//
// All of them lie below the Linux ephemeral range (32768-60999), so no
// port the kernel picks lands in one, and no test allocates from the whole
// default range 20000-32767. Tests that bind only ports the OS picks, or
// never bind (most statestore and pgstore ports are rows of a private
// database), need no range. Lock keeps two runs at once on one host apart,
// a package at a time.
package testports

import "fmt"

// Range is the ports First through Last, both included. It has the layout
// of portalloc.Range, so portalloc.Range(r) converts it.
type Range struct {
	First, Last uint16
}

// Contains reports whether p is in r.
func (r Range) Contains(p uint16) bool { return r.First <= p && p <= r.Last }

// Size returns the number of ports in r.
func (r Range) Size() int { return int(r.Last) - int(r.First) + 1 }

// String returns r as BERTH_PORT_RANGE takes it: "FIRST-LAST".
func (r Range) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// The ranges, one for each package whose tests bind ports.
var (
	CmdBerth     = Range{First: 20000, Last: 21999} // testscripts: a block of 71 ports per script
	Porttest     = Range{First: 22000, Last: 22999} // portlock/porttest, through BERTH_PORT_RANGE: its module cannot import this one
	Quickstart   = Range{First: 23000, Last: 23499} // run, through BERTH_PORT_RANGE
	Metrics      = Range{First: 23500, Last: 23999} // run, through BERTH_PORT_RANGE
	Orchestrator = Range{First: 24000, Last: 24499} // the built binary and its services
	Gotest       = Range{First: 24500, Last: 24999} // porttest's per-user store, through BERTH_PORT_RANGE
	Mru          = Range{First: 25000, Last: 25999} // BenchmarkAllocate's bind probes
	Torture      = Range{First: 26000, Last: 26063} // the harness's own SmallRange
	Listenfd     = Range{First: 26100, Last: 26199}
	Fleet        = Range{First: 26200, Last: 26299} // run's bind probes, through BERTH_PORT_RANGE
	Statestore   = Range{First: 26300, Last: 26363} // storetest's worker processes listen on their grants
	Pgstore      = Range{First: 26400, Last: 26463} // storetest's worker processes listen on their grants
	Owner        = Range{First: 26500, Last: 26563} // a killed holder's port, bound again once it is judged exited
	Who          = Range{First: 26600, Last: 26663} // listeners of worker processes that Lookup finds
	Portset      = Range{First: 26700, Last: 26999}
	Pool         = Range{First: 27000, Last: 27299}
	FleetLayer   = Range{First: 27300, Last: 27599}
	Portalloc    = Range{First: 27600, Last: 32767} // Allocators above 29000, ports tests pick below
)

// All lists every range with the import path of its package, relative to
// the module.
var All = []struct {
	Package string
	Range   Range
}{
	{"cmd/berth", CmdBerth},
	{"portlock/porttest", Porttest},
	{"examples/quickstart", Quickstart},
	{"examples/metrics", Metrics},
	{"examples/orchestrator", Orchestrator},
	{"examples/gotest", Gotest},
	{"internal/mru", Mru},
	{"cmd/torture", Torture},
	{"portalloc/listenfd", Listenfd},
	{"examples/fleet", Fleet},
	{"statestore", Statestore},
	{"pgstore", Pgstore},
	{"internal/owner", Owner},
	{"portalloc/who", Who},
	{"portalloc/portset", Portset},
	{"portalloc/pool", Pool},
	{"portalloc/fleet", FleetLayer},
	{"portalloc", Portalloc},
}
