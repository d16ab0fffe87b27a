package pool_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/pool"
	"github.com/berth-go/berth/store"
)

// waitSettled waits until p has its idle members and no update under way.
func waitSettled(p *pool.Pool) pool.Status {
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
	a, done := exampleAllocator(27100)
	defer done()
	ctx := context.Background()

	p, err := pool.New(ctx, a, "workers", pool.Spec{Size: 3})
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
// 27150 first, then the range from its low end. Members are replaced at
// most MaxUnavailable at a time while Take goes on working.
func ExamplePool_Update() {
	a, done := exampleAllocator(27100)
	defer done()
	ctx := context.Background()

	p, err := pool.New(ctx, a, "web", pool.Spec{Size: 2, MaxUnavailable: "1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	before := p.Status().Revision

	err = p.Update(pool.Spec{Size: 2, MaxUnavailable: "1", Prefer: []uint16{27150}, Order: portalloc.OrderLowest})
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
	fmt.Println("preferred port taken:", slices.Contains(ports, 27150))
	// Output:
	// new revision: true updated: 2 of 2
	// preferred port taken: true
}

// A warm pool keeps ports reserved ahead of time; Take hands one out from
// memory, and Update moves the pool to another range member by member.
func Example() {
	a, done := exampleAllocator(27200)
	defer done()
	ctx := context.Background()

	p, err := pool.New(ctx, a, "workers", pool.Spec{Size: 2, Range: store.Range{First: 27200, Last: 27249}})
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
	fmt.Println("taken from the first half:", r.Port < 27250)
	if err := p.Return(r); err != nil {
		fmt.Println(err)
		return
	}

	if err := p.Update(pool.Spec{Size: 2, Range: store.Range{First: 27250, Last: 27299}}); err != nil {
		fmt.Println(err)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); p.Status().Updating || p.Status().Idle < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Println("update not done:", p.Status(), p.Err())
			return
		}
	}
	r, err = p.Take(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = p.Return(r) }()
	fmt.Println("taken from the second half:", r.Port >= 27250)
	// Output:
	// taken from the first half: true
	// taken from the second half: true
}
