package portalloc

import "time"

// SetStoreRetryInterval makes Allocators that fell back try the state store
// again after d instead of storeRetryInterval, until restore is called.
func SetStoreRetryInterval(d time.Duration) (restore func()) {
	old := storeRetryEvery.Swap(int64(d))
	return func() { storeRetryEvery.Store(old) }
}

// SetCheckInterval makes Allocators check their store for a loss every d
// instead of defaultCheckInterval, until restore is called.
func SetCheckInterval(d time.Duration) (restore func()) {
	old := checkEvery.Swap(int64(d))
	return func() { checkEvery.Store(old) }
}

// HandedPrune is handedPrune, for the external tests.
const HandedPrune = handedPrune
