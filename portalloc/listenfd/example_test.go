//go:build unix

package listenfd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/listenfd"
	"github.com/berth-go/berth/store"
)

// An orchestrator binds a port inside the transaction that reserves it and
// hands the listening socket to the server it starts. The child here is a
// shell that shows what it was given; a Go server takes the socket with
// Inherit, a systemd-aware one with sd_listen_fds.
func ExampleHandoff() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: store.Range{First: 26100, Last: 26199}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	r, l, err := a.Listen(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	var h listenfd.Handoff
	defer h.Close()
	if err := h.Add("web", l); err != nil {
		fmt.Println(err)
		return
	}
	cmd := exec.Command("sh", "-c", `echo "$LISTEN_FDS socket(s): $LISTEN_FDNAMES, LISTEN_PID is the child's: $([ "$LISTEN_PID" = $$ ] && echo yes)"`)
	if err := h.Apply(cmd); err != nil {
		fmt.Println(err)
		return
	}
	cmd.Stdout = os.Stdout
	if err := cmd.Run(); err != nil {
		fmt.Println(err)
		return
	}
	// The child ran as long as it needed the port; give the reservation to
	// a long-running child with a.Transfer(ctx, r, cmd.Process.Pid).
	_ = a.Release(ctx, r)
	// Output:
	// 1 socket(s): web, LISTEN_PID is the child's: yes
}
