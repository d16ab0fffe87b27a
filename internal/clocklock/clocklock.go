// Package clocklock serialises the programs that step the system clock for
// berth's tests and torture runs.
//
// A program that steps CLOCK_REALTIME and later sets it back computes the
// true time from a reading of the wall clock taken before its first step
// plus the monotonic time since. If it takes that reading while another
// program has the clock stepped, it sets a wrong time back, and the host's
// clock stays off for good: two such programs at once (go test ./... runs
// packages in parallel) once left a development machine 300 s fast. Every
// such program holds the lock from before its first reading until it has
// set the true time back.
package clocklock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"
)

// Path is the file whose flock is the lock.
var Path = filepath.Join(os.TempDir(), "berth-clock-step.lock")

// Lock waits until no other program holds the lock, or until ctx is done,
// and takes it. It returns the function that lets go of it.
func Lock(ctx context.Context) (unlock func() error, err error) {
	l := flock.New(Path)
	if _, err := l.TryLockContext(ctx, 20*time.Millisecond); err != nil {
		return nil, fmt.Errorf("clocklock: wait for %s, held by another program that steps the clock: %w", Path, err)
	}
	return l.Unlock, nil
}
