package clocklock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLockExcludes: a second Lock waits for the first to be let go.
func TestLockExcludes(t *testing.T) {
	unlock := lockOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if u, err := Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		if u != nil {
			_ = u()
		}
		t.Fatalf("Lock while held: error %v; want it to wait until the context ends", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if err := lockOrSkip(t)(); err != nil {
		t.Fatal(err)
	}
}

// lockOrSkip takes the lock, or skips the test when a program stepping the
// clock (a torture run, another package's clock test) keeps it longer than
// a test should wait.
func lockOrSkip(tb testing.TB) func() error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	unlock, err := Lock(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		tb.Skip("the clock-step lock stayed held for 2 minutes by another program stepping the clock; run this test when none does")
	}
	if err != nil {
		tb.Fatal(err)
	}
	return unlock
}
