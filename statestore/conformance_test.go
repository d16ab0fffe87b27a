package statestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
	"github.com/berth-go/berth/store/storetest"
)

// TestConformance runs the suite every berth store passes.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		t.Helper()
		s, err := statestore.Open(context.Background(), filepath.Join(t.TempDir(), "berth.db"), statestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
