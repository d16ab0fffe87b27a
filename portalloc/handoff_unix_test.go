//go:build unix

package portalloc_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-go/berth/internal/testproc"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/listenfd"
)

type inheritReport struct {
	Listeners []string
	Packets   []string
	Error     string
	FD3Open   bool // descriptor 3 is still open after the call
}

func init() {
	workers["inherit"] = func(context.Context) error {
		in, err := listenfd.Inherit()
		var rep inheritReport
		for name, l := range in.Listeners {
			rep.Listeners = append(rep.Listeners, name)
			_ = l.Close()
		}
		for name, c := range in.PacketConns {
			rep.Packets = append(rep.Packets, name)
			_ = c.Close()
		}
		if err != nil {
			rep.Error = err.Error()
		}
		var st syscall.Stat_t
		rep.FD3Open = syscall.Fstat(3, &st) == nil
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
}

// TestInheritLeavesOtherDescriptors: with LISTEN_FDS set and no
// LISTEN_PID, a descriptor in the range that is not a socket (here a plain
// file at descriptor 3) is named in the error and left open, and the
// sockets after it are taken.
func TestInheritLeavesOtherDescriptors(t *testing.T) {
	plain, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lf, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()

	cmd := testproc.Command(t, "inherit")
	cmd.Env = append(cmd.Env, "LISTEN_FDS=2", "LISTEN_FDNAMES=config:web")
	cmd.ExtraFiles = []*os.File{plain, lf}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("worker: %v", err)
	}
	var rep inheritReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("worker said %q: %v", out, err)
	}
	if len(rep.Listeners) != 1 || rep.Listeners[0] != "web" || len(rep.Packets) != 0 {
		t.Errorf("Inherit took listeners %v, packet conns %v; want the listener web only", rep.Listeners, rep.Packets)
	}
	if !strings.Contains(rep.Error, "descriptor 3") || !strings.Contains(rep.Error, "not a socket") {
		t.Errorf("Inherit error = %q; want it to name descriptor 3 as not a socket", rep.Error)
	}
	if !rep.FD3Open {
		t.Error("Inherit closed descriptor 3, which it did not take")
	}
}

// TestHandoffMisuse: misuse of a Handoff is an ErrInvalidRequest, never a
// panic.
func TestHandoffMisuse(t *testing.T) {
	var h listenfd.Handoff
	defer h.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := h.Add("web", l); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Apply(nil)":            h.Apply(nil),
		"Add of a name again":   h.Add("web", l),
		"Add of a nil listener": h.Add("api", nil),
	} {
		if !errors.Is(err, portalloc.ErrInvalidRequest) {
			t.Errorf("%s = %v; want ErrInvalidRequest", name, err)
		}
	}
}
