package fleet_test

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
)

// A controller reserves a port for a pod that is not scheduled yet: free
// on every host of the fleet, held by the pod's name under a lease. It
// renews the lease while the pod waits, narrows the reservation to the
// pod's node once it is bound, and releases it in the pod's finalizer.
// It needs a fleet's store (BERTH_STORE), so it is compiled, not run, by
// go test.
func ExampleReserve() {
	ctx := context.Background()
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil || cfg.StoreDSN == "" {
		fmt.Println("set BERTH_STORE to a fleet's PostgreSQL store")
		return
	}
	a, err := fleet.New(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close() // the reservation is the pod's: Close leaves it

	r, err := fleet.Reserve(ctx, a, fleet.FleetRequest{
		Protocol: portalloc.TCP, // Addr zero: 0.0.0.0, the port on every address
		Band:     fleet.Band{First: 40000, Last: 40999},
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
	if err := fleet.Renew(ctx, a, r, time.Minute); err != nil {
		fmt.Println(err) // ErrNotHeld: the lease ran out; reserve again
		return
	}
	// Once the pod is bound to node-3, the port is free on the others:
	if err := fleet.Narrow(ctx, a, r, "node-3"); err != nil {
		fmt.Println(err)
		return
	}
	// In the pod's finalizer:
	if err := fleet.Release(ctx, a, r); err != nil {
		fmt.Println(err)
	}
}
