package statestore_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/statestore"
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
	granted := time.Now() // monotonic; the worker reads the lease clock after this
	port := leaseBy(t, path, "stepped", ttl)
	s := openAt(t, path)

	step(300 * time.Second)
	if n, err := s.Reap(ctx); err != nil || n != 0 {
		t.Errorf("Reap with the clock 300 s ahead = %d, %v; want 0: the lease has not ended", n, err)
	}
	if _, err := s.Reserve(ctx, statestore.Request{Key: tcp(loopback, port)}); !errors.Is(err, statestore.ErrHeld) {
		t.Errorf("Reserve(%d) with the clock 300 s ahead = %v; want ErrHeld", port, err)
	}

	step(-300 * time.Second) // back to true time
	step(-300 * time.Second)
	var ended time.Duration
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n, err := s.Reap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			ended = time.Since(granted)
			break
		}
	}
	if err := setClock(trueNow()); err != nil {
		t.Errorf("set the wall clock back: %v", err)
	}
	switch {
	case ended == 0:
		t.Fatalf("the lease of %v was not reaped within 15 s with the clock 300 s behind", ttl)
	case ended < ttl:
		t.Errorf("the lease of %v ended after %v; want no sooner", ttl, ended)
	case ended > ttl+time.Second:
		t.Errorf("the lease of %v ended after %v with the clock 300 s behind; want within a second of its TTL", ttl, ended)
	}
}
