package statestore_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/store"
)

// TestLeaseSurvivesClockSteps: a lease ends after its TTL by a clock no
// wall-clock step moves: a step of +300 s does not end it early, and one of
// -300 s does not make it late. The wall clock is set back from the
// monotonic clock after the steps, and in a cleanup should the test fail.
func TestLeaseSurvivesClockSteps(t *testing.T) {
	testports.Hold(t, testports.Statestore)
	trueNow, setClock := takeClock(t)
	step := func(d time.Duration) {
		t.Helper()
		if err := setClock(trueNow() + int64(d)); err != nil {
			if errors.Is(err, unix.EPERM) {
				t.Skipf("stepping the wall clock: %v", err)
			}
			t.Fatalf("step the wall clock by %v: %v", d, err)
		}
	}

	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	const ttl = 3 * time.Second
	before := time.Now() // monotonic; the worker reads the lease clock after this
	port := leaseBy(t, path, "stepped", ttl)
	after := time.Now()
	s := openAt(t, path)
	// The lease ends ttl after its grant, as the store tells it, whatever
	// the wall clock reads.
	end := func() time.Time {
		t.Helper()
		expires, earliest := leaseEnd(t, s, "stepped")
		checkLeaseEnd(t, expires, earliest, before, after, ttl)
		return earliest
	}

	step(300 * time.Second)
	earliest := end()
	n, err := s.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := s.Reserve(ctx, store.Request{Key: tcp(loopback, port)})
	if !time.Now().Before(earliest) {
		t.Skipf("the lease of %v ended before the test could look at it with the clock ahead (a stalled machine)", ttl)
	}
	if n != 0 {
		t.Fatalf("Reap with the clock 300 s ahead = %d; want 0: the lease has not ended", n)
	}
	if !errors.Is(rerr, store.ErrHeld) {
		t.Fatalf("Reserve(%d) with the clock 300 s ahead = %v; want ErrHeld", port, rerr)
	}

	step(-300 * time.Second)
	reapLease(t, s, end())
	if err := setClock(trueNow()); err != nil {
		t.Errorf("set the wall clock back: %v", err)
	}
}
