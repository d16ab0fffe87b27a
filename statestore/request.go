package statestore

import "github.com/berth-go/berth/store"

// The requests and counters of a Store, declared in package store (which
// also declares the Store interface this package implements).
type (
	// ProbeFunc tells whether key's port can be bound right now. It runs
	// inside the write transaction that records the reservation, so no
	// other berth process can choose the port between the probe and the
	// insert.
	ProbeFunc = store.ProbeFunc
	// Request asks Reserve for one key.
	Request = store.Request
	// ScanRequest asks Scan for the first free port among candidates.
	ScanRequest = store.ScanRequest
	// Filter selects rows for List. Zero fields match everything.
	Filter = store.Filter
	// Stats are counters of one Store since Open.
	Stats = store.Stats
)

var _ store.Store = (*Store)(nil)
