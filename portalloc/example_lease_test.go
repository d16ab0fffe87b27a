package portalloc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/berth-go/berth/portalloc"
)

// A port for a named holder, such as a CI job, outlives the process that
// asked for it: it lasts until the holder releases it or its lease ends.
// Renew extends the lease of every port the holder has.
func ExampleAllocator_AllocateLease() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: portalloc.Range{First: 29000, Last: 29999}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	r, err := a.AllocateLease(ctx, portalloc.Request{Label: "db"}, portalloc.Lease{Holder: "ci/job-4711", TTL: 8 * time.Hour})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holder:", r.Holder, "lease ends in about 8h:", time.Until(r.Expires) > 7*time.Hour)

	// No process can have the port while the lease lasts, this one included.
	_, err = a.Reserve(ctx, portalloc.Request{}, r.Port)
	fmt.Println("held:", errors.Is(err, portalloc.ErrPortHeld))

	n, err := a.Renew(ctx, "ci/job-4711", 12*time.Hour)
	fmt.Println("renewed:", n, err)
	n, err = a.ReleaseHolder(ctx, "ci/job-4711", portalloc.HolderFilter{})
	fmt.Println("released:", n, err)
	_, err = a.Renew(ctx, "ci/job-4711", time.Hour)
	fmt.Println("renew after release:", errors.Is(err, portalloc.ErrHolderNotFound))
	// Output:
	// holder: ci/job-4711 lease ends in about 8h: true
	// held: true
	// renewed: 1 <nil>
	// released: 1 <nil>
	// renew after release: true
}
