package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/lease"
)

// A port for a named holder, such as a CI job, outlives the process that
// asked for it: it lasts until the holder releases it or its lease ends.
// Renew extends the lease of every port the holder has.
func ExampleAllocate() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: 29000, Last: 29999}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	r, err := lease.Allocate(ctx, a, portalloc.Request{Label: "db"}, lease.Lease{Holder: "ci/job-4711", TTL: 8 * time.Hour})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holder:", r.Holder, "lease ends in about 8h:", time.Until(r.Expires) > 7*time.Hour)

	// No process can have the port while the lease lasts, this one included.
	_, err = a.Reserve(ctx, portalloc.Request{}, r.Port)
	fmt.Println("held:", errors.Is(err, portalloc.ErrPortHeld))

	n, err := lease.Renew(ctx, a, "ci/job-4711", 12*time.Hour)
	fmt.Println("renewed:", n, err)
	n, err = lease.Release(ctx, a, "ci/job-4711", lease.Filter{})
	fmt.Println("released:", n, err)
	_, err = lease.Renew(ctx, a, "ci/job-4711", time.Hour)
	fmt.Println("renew after release:", errors.Is(err, lease.ErrHolderNotFound))
	// Output:
	// holder: ci/job-4711 lease ends in about 8h: true
	// held: true
	// renewed: 1 <nil>
	// released: 1 <nil>
	// renew after release: true
}
