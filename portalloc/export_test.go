package portalloc

import "time"

// SetStoreRetryInterval makes Allocators whose store could not be used try
// it again after d instead of storeRetryInterval, until restore is called.
// Call it before the Allocators it is for are made, and restore it after
// they are closed (t.Cleanup(SetStoreRetryInterval(d)) first thing): the
// handles' background checks read it.
func SetStoreRetryInterval(d time.Duration) (restore func()) {
	old := storeRetryInterval
	storeRetryInterval = d
	return func() { storeRetryInterval = old }
}

// SetCheckInterval makes the handles made from now on check their store for
// a loss every d instead of checkInterval, until restore is called; as
// SetStoreRetryInterval, around the Allocators it is for.
func SetCheckInterval(d time.Duration) (restore func()) {
	old := checkInterval
	checkInterval = d
	return func() { checkInterval = old }
}
