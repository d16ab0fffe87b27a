package portalloc_test

import (
	"context"
	"fmt"
	"os"

	"github.com/berth-go/berth/portalloc"
)

// Two checkouts of one project use the label "web" side by side: each
// Allocator has a scope of its own (in a program, usually
// scope.Git, the root of the git worktree it runs in), so each
// gets a port of its own, and the same one again after a restart.
func ExampleConfig_scope() {
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	web := func(scope string) (portalloc.Reservation, error) {
		a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: portalloc.Range{First: 29000, Last: 29999}, Scope: scope})
		if err != nil {
			return portalloc.Reservation{}, err
		}
		defer a.Close() // releases the port: a restart
		return a.Allocate(ctx, portalloc.Request{Label: "web", Sticky: true})
	}
	main1, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	wt1, err := web("/src/shop-feature")
	if err != nil {
		fmt.Println(err)
		return
	}
	main2, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(main1.Label)
	fmt.Println("same port after a restart:", main1.Port == main2.Port)
	fmt.Println("other worktree, other port:", main1.Port != wt1.Port)
	// Output:
	// web@/src/shop
	// same port after a restart: true
	// other worktree, other port: true
}
