package statestore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
