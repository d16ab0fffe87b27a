//go:build unix

package portalloc_test

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/testrig"
)

// Transfer hands a reservation to a child the program started, which then
// owns it: it ends with that process, not with this one. The child
// inherits the descriptors of the port's lock (Files), so it holds the
// lock itself for as long as it runs.
func ExampleAllocator_Transfer() {
	a, done := testrig.ExampleAllocator(29500)
	defer done()
	ctx := context.Background()

	r, err := a.Allocate(ctx, portalloc.Request{Label: "daemon"})
	if err != nil {
		fmt.Println(err)
		return
	}
	files, err := a.Files(r)
	if err != nil {
		fmt.Println(err)
		return
	}
	child := exec.Command("sleep", "30") // stands in for the daemon
	child.ExtraFiles = files
	child.Env = append(child.Environ(), fmt.Sprintf("PORT=%d", r.Port))
	err = child.Start()
	for _, f := range files {
		_ = f.Close() // the child has its own copies
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()

	if err := a.Transfer(ctx, r, child.Process.Pid); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(a.Held()))
	// Output:
	// 0
}
