package marker

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHoldWaitsForAForkedCopy: a mark dropped while a child being started
// holds a copy of its socket keeps its name bound until the child's exec;
// holding the mark again then waits for the name instead of going without
// a mark.
func TestHoldWaitsForAForkedCopy(t *testing.T) {
	ns := Namespace(t.TempDir())
	defer DropAll(ns)
	m := Mark{Protocol: "udp", Addr: netip.MustParseAddr("0.0.0.0"), Port: 24003, PID: os.Getpid(), Start: 5}
	if _, err := Hold(ns, m); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	s, ok := held[m.name(ns)].(sock)
	mu.Unlock()
	if !ok {
		t.Fatal("the mark is not a socket")
	}
	copyFD, err := unix.Dup(int(s)) // what a fork would hold until its exec
	if err != nil {
		t.Fatal(err)
	}
	Drop(ns, m)
	closed := make(chan struct{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = unix.Close(copyFD)
		close(closed)
	}()
	made, err := Hold(ns, m)
	<-closed
	if !made || err != nil {
		t.Fatalf("Hold while a copy of the dropped mark's socket lived = %v, %v; want it made once the copy closed", made, err)
	}
	if got, err := List(ns); err != nil || len(got) != 1 || got[0] != m {
		t.Fatalf("List = %v, %v; want [%v]", got, err, m)
	}
}
