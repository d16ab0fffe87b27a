package portalloc_test

import (
	"context"
	"fmt"

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
