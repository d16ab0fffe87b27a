package statestore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

// A Close that meets the background sweep in flight ends it quietly: the
// sweep's "store closed" is no failure to warn about (every short-lived
// `berth get` printed one now and then).
func TestCloseDuringSweepLogsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	for i := range 40 {
		var (
			mu   sync.Mutex
			logs []string
		)
		log := funcr.New(func(prefix, args string) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, prefix+" "+args)
		}, funcr.Options{})
		s, err := statestore.Open(context.Background(), path, statestore.Options{SweepInterval: time.Millisecond, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for _, l := range logs {
			if strings.Contains(l, "failed") {
				t.Errorf("Close during a sweep logged %s", l)
			}
		}
		mu.Unlock()
	}
}

// A store whose file was lost sweeps nothing, and says so only at V(1):
// its owner learns of the loss at its next call and opens the store again,
// while an idle one would otherwise log the same error every interval.
func TestSweepOfLostStoreLogsNoError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	var (
		mu      sync.Mutex
		removed bool
		lines   []string // logged after the removal
		sweeps  = make(chan struct{}, 100)
	)
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		if !removed {
			return
		}
		lines = append(lines, args)
		if strings.Contains(args, "reaping sweep") {
			select {
			case sweeps <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{Verbosity: 1})
	// A dead owner's row, which each sweep finds to reap: a sweep that
	// reaps nothing writes nothing, and so does not find the loss.
	ctx := context.Background()
	s0 := openAt(t, path)
	if _, err := s0.Reserve(ctx, store.Request{Key: tcp(lo4, 40041), Owner: deadOwner(t, 0)}); err != nil {
		t.Fatal(err)
	}
	// The first sweep runs a second after Open: the file is replaced
	// well before it.
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mu.Lock()
	removed = true
	mu.Unlock()
	// Replaced, as a restore of a backup or a cache does.
	if err := os.WriteFile(path+".restored", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".restored", path); err != nil {
		t.Fatal(err)
	}
	for range 2 { // two sweeps of the lost store
		select {
		case <-sweeps:
		case <-time.After(10 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("no two sweeps of the lost store in 10s; logged: %q", lines)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		if !strings.Contains(l, `"level"=1`) {
			t.Errorf("a sweep of a lost store logged %s; want only lines at V(1)", l)
		}
	}
}
