package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// A controller reserves a port for a pod that is not scheduled yet: free
// on every host of the fleet, held by the pod's name under a lease. It
// renews the lease while the pod waits, narrows the reservation to the
// pod's node once it is bound, and releases it in the pod's finalizer.
// It needs a fleet's store (BERTH_STORE), so it is compiled, not run, by
// go test.
func ExampleOpen() {
	ctx := context.Background()
	s, err := fleet.Open(ctx, portalloc.Config{}) // BERTH_STORE, as the host BERTH_HOST
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close() // the reservation is the pod's: Close leaves it

	r, err := s.ReserveFleet(ctx, pgstore.FleetRequest{
		Protocol: store.TCP, // Addr zero: 0.0.0.0, the port on every address
		Band:     store.Range{First: 40000, Last: 40999},
		Holder:   "pod/default/web-0",
		Label:    "web.http",
		TTL:      time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("web-0 gets port", r.Port, "on whichever node it lands")

	// Every ~20s while the pod waits for a node:
	if err := s.RenewFleet(ctx, r.Key, r.Holder, time.Minute); errors.Is(err, store.ErrNotFound) {
		fmt.Println(err) // the lease ran out and was reaped: reserve again
		return
	}
	// Once the pod is bound to node-3, the port is free on the others:
	if err := s.NarrowFleet(ctx, r.Key, r.Holder, "node-3"); err != nil {
		fmt.Println(err)
		return
	}
	// In the pod's finalizer:
	if err := s.ReleaseFleet(ctx, r.Key, r.Holder); err != nil {
		fmt.Println(err)
	}
}

// A job that is no process of any host reserves the named ports of a set
// fleet-wide, all of them or none, before it knows where it runs.
func ExampleSetRequests() {
	spec := portset.SetSpec{Name: "shop", Groups: []portset.GroupSpec{
		{Name: "api", Members: 2, Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "lb", Ports: []portset.PortSpec{{Name: "admin", Shared: true}, {Name: "stats", Port: 9100}}},
	}}
	reqs, err := fleet.SetRequests(spec, store.Range{First: 40000, Last: 40999}, "job/shop", time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range reqs {
		fmt.Println(r.Label, r.Band)
	}
	// With a fleet's store s: rs, err := s.ReserveFleetSet(ctx, reqs)

	// Output:
	// shop/api/0/http 40000-40999
	// shop/api/1/http 40000-40999
	// shop/lb/admin 40000-40999
	// shop/lb/0/stats 9100
}
