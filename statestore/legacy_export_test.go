package statestore

import (
	"context"

	"github.com/berth-go/berth/store"
)

// ConvertLegacyOwners runs, for the external tests, the conversion of rows
// that earlier berth releases wrote.
func ConvertLegacyOwners(ctx context.Context, s store.Store) (converted, deleted int, err error) {
	return s.(*sqlStore).convertLegacyOwners(ctx)
}

// AfterPrepare makes every open that had to make or migrate its file run
// fn right after, until the test ends.
func AfterPrepare(t interface{ Cleanup(func()) }, fn func()) {
	testHookPrepared = fn
	t.Cleanup(func() { testHookPrepared = nil })
}

// MaxOpenAttempts is how many times Open tries a store removed or replaced
// while it opens.
const MaxOpenAttempts = maxOpenAttempts
