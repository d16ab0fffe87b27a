package portalloc_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berth-go/berth/portalloc"
)

// Usage counts the reservations of the range in the store, whoever made
// them: here a second Allocator on the same state directory, as another
// process would be.
func ExampleAllocator_Usage() {
	a, done := exampleAllocator(29800)
	defer done()
	ctx := context.Background()

	b, err := portalloc.New(ctx, a.Config())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	for _, x := range []*portalloc.Allocator{a, a, b} {
		if _, err := x.Allocate(ctx, portalloc.Request{}); err != nil {
			fmt.Println(err)
			return
		}
	}
	u, err := a.Usage(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ports:", u.Ports, "reserved:", u.Reserved, "available:", u.Available)
	// Output:
	// ports: 100 reserved: 3 available: 97
}

// waitSettled waits until p has its idle members and no update under way.
func waitSettled(p *portalloc.Pool) portalloc.PoolStatus {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := p.Status()
		if !st.Updating && st.Replacing == 0 && st.Idle >= st.Size || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

// Status tells how many members are idle and in use, and whether a
// rolling update is under way. The pool refills in the background after a
// Take.
func ExamplePool_Status() {
	a, done := exampleAllocator(29900)
	defer done()
	ctx := context.Background()

	p, err := a.NewPool(ctx, "workers", portalloc.PoolSpec{Size: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	r, err := p.Take(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = p.Return(r) }()

	st := waitSettled(p)
	fmt.Println("size:", st.Size, "idle:", st.Idle, "in use:", st.InUse, "updating:", st.Updating)
	// Output:
	// size: 3 idle: 3 in use: 1 updating: false
}

// Update rolls the pool to a new spec; here one whose members take port
// 29950 first, then the range from its low end. Members are replaced at
// most MaxUnavailable at a time while Take goes on working.
func ExamplePool_Update() {
	a, done := exampleAllocator(29900)
	defer done()
	ctx := context.Background()

	p, err := a.NewPool(ctx, "web", portalloc.PoolSpec{Size: 2, MaxUnavailable: "1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	before := p.Status().Revision

	err = p.Update(portalloc.PoolSpec{Size: 2, MaxUnavailable: "1", Prefer: []uint16{29950}, Order: portalloc.OrderLowest})
	if err != nil {
		fmt.Println(err)
		return
	}
	st := waitSettled(p)
	var ports []uint16
	for _, r := range p.Idle() {
		ports = append(ports, r.Port)
	}
	fmt.Println("new revision:", st.Revision != before, "updated:", st.Updated, "of", st.Size)
	fmt.Println("preferred port taken:", slices.Contains(ports, 29950))
	// Output:
	// new revision: true updated: 2 of 2
	// preferred port taken: true
}
