package statestore_test

import (
	"context"
	"errors"
	"math/rand/v2"
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

// TestOpenStartsAgainWhenRemovedMeanwhile: a store removed while Open makes
// it (by a cleaner) is made again, not reported as an error of a file
// nobody uses, and never opened as the empty file SQLite makes when it
// opens a path with no file.
func TestOpenStartsAgainWhenRemovedMeanwhile(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		hook func(t interface{ Cleanup(func()) }, fn func())
		lose func(path string) error
	}{
		{"the store removed once made", statestore.AfterPrepare, os.Remove},
		{
			"the directory removed once the store is made",
			statestore.AfterPrepare,
			func(path string) error { return os.RemoveAll(filepath.Dir(path)) },
		},
		{
			"the store removed once made, and an empty file made in its place",
			statestore.AfterPrepare,
			func(path string) error {
				if err := os.Remove(path); err != nil {
					return err
				}
				return os.WriteFile(path, nil, 0o600)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "berth.db")
			lost := false
			tc.hook(t, func() {
				if !lost {
					lost = true
					if err := tc.lose(path); err != nil {
						t.Error(err)
					}
				}
			})
			s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
			if err != nil {
				t.Fatalf("Open with its store removed once while it opened: %v", err)
			}
			defer s.Close()
			if !lost {
				t.Fatal("the store was not removed: the test tested nothing")
			}
			key := store.Key{Protocol: store.TCP, Addr: loopback, Port: 24171}
			if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
				t.Fatalf("Reserve in the store opened: %v", err)
			}
			if err := s.Check(ctx); err != nil {
				t.Errorf("Check of the store opened: %v; want the file at its path", err)
			}
		})
	}
}

// TestOpenWhileDirectoryRemovedAgainAndAgain: openers racing a cleaner that
// removes the store's directory every 5-25 ms fail, when they fail, with the
// store lost (or busy a moment), never as if its files were broken. SQLite
// meets its files vanishing midway in many ways (SQLITE_IOERR_FSTAT and
// CANTOPEN among them, a lock file missing), and a directory made again can
// reuse the inode number of the one removed, so Open must tell them apart.
func TestOpenWhileDirectoryRemovedAgainAndAgain(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(20+rand.IntN(40)) * time.Millisecond):
				_ = os.RemoveAll(filepath.Dir(path))
			}
		}
	}()
	var mu sync.Mutex
	opened, lost, again := 0, 0, 0
	deadline := time.Now().Add(3 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				// Open tries MaxOpenAttempts times, then returns what the
				// last try met: count the tries by its log.
				tries := 1
				log := funcr.New(func(_, args string) {
					if strings.Contains(args, "opening it again") {
						tries++
					}
				}, funcr.Options{Verbosity: 1})
				s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1, BusyTimeout: time.Second, Logger: log})
				if err == nil {
					_ = s.Close()
				}
				mu.Lock()
				again += tries - 1
				switch {
				case err == nil:
					opened++
				case errors.Is(err, store.ErrLost), errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrTransient), tries == statestore.MaxOpenAttempts:
					lost++
				default:
					t.Errorf("opener %d: Open while the directory is removed again and again, after %d tries: %v; want success, an error wrapping store.ErrLost, or %d tries", w, tries, err, statestore.MaxOpenAttempts)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Until(deadline))
	close(done)
	wg.Wait()
	t.Logf("%d opens, %d failed as lost or busy or after %d tries; %d tries again", opened, lost, statestore.MaxOpenAttempts, again)
	if opened+lost == 0 || again == 0 {
		t.Fatal("no Open ran, or none logged that it opened the store again: the test tested nothing (was the message reworded?)")
	}
}

// TestOpenOutOfTimeWhileStoreChanged: an Open whose deadline passes while
// the store it opened was removed under it says that time ran out (an error
// wrapping context.DeadlineExceeded), not only what the last attempt met:
// a store truncated under an opener reads as damaged for a moment, and a
// caller told so would move a sound store aside.
func TestOpenOutOfTimeWhileStoreChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "berth.db")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	lost := false
	statestore.AfterPrepare(t, func() {
		if !lost {
			lost = true
			if err := os.Remove(path); err != nil {
				t.Error(err)
			}
			<-ctx.Done()
		}
	})
	s, err := statestore.Open(ctx, path, statestore.Options{SweepInterval: -1})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded past its deadline; want an error")
	}
	if !lost {
		t.Fatal("the store was not removed: the test tested nothing")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Open out of time while its store was removed: %v; want an error wrapping context.DeadlineExceeded", err)
	}
}
