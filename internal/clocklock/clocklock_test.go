package clocklock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLockExcludes: a second Lock waits for the first to be let go.
func TestLockExcludes(t *testing.T) {
	unlock, err := Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
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
	unlock, err = Lock(context.Background())
	if err != nil {
		t.Fatalf("Lock after unlock: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
}
