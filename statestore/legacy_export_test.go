package statestore

import "context"

// ConvertLegacyOwners runs, for the external tests, the conversion of rows
// that earlier berth releases wrote.
func ConvertLegacyOwners(ctx context.Context, s *Store) (converted, deleted int, err error) {
	return s.convertLegacyOwners(ctx)
}

// FailImports makes the marks' import of every new store fail with err
// until the test ends.
// A nil err lets them succeed again.
func FailImports(t interface{ Cleanup(func()) }, err error) {
	testHookImport = nil
	if err != nil {
		testHookImport = func() error { return err }
	}
	t.Cleanup(func() { testHookImport = nil })
}

// BeforeImport makes the next imports of marks into a new file run fn
// first, until the test ends.
func BeforeImport(t interface{ Cleanup(func()) }, fn func()) {
	testHookImport = func() error { fn(); return nil }
	t.Cleanup(func() { testHookImport = nil })
}

// ChecksSecondPage reports whether s checks its file's second page after
// each commit (see secondPage).
func ChecksSecondPage(s *Store) bool { return s.page2 > 0 }

// IgnoreHoles makes s no longer look for holes in its file, as on a file
// system that shows none.
func IgnoreHoles(s *Store) { s.holes = false }

// AfterPrepare makes every open that had to make or migrate its file run
// fn right after, until the test ends.
func AfterPrepare(t interface{ Cleanup(func()) }, fn func()) {
	testHookPrepared = fn
	t.Cleanup(func() { testHookPrepared = nil })
}

// AfterWrite runs fn in every Release and Transfer once its write has
// committed (or failed), before it returns, until the test ends.
func AfterWrite(t interface{ Cleanup(func()) }, fn func()) {
	testHookWritten = fn
	t.Cleanup(func() { testHookWritten = nil })
}
