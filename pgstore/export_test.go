package pgstore

import (
	"context"
	"strconv"
	"time"
)

// The hot lookups, for the plan tests.
const (
	QHolders = qHolders
	QScan    = qScan
	// QFleetReserve is ReserveFleet's statement.
	QFleetReserve = qFleetReserve
)

// RenewLease renews the host's lease to ttl from now, as the background
// goroutine does.
func (s *Store) RenewLease(ctx context.Context, ttl time.Duration) error {
	return s.claim(ctx, "renew lease of "+strconv.Quote(s.host), ttl)
}

// SetFleetStart makes ReserveFleet start its search of a band of n ports
// at offset f(n) instead of a random one. Call it before any other call.
func (s *Store) SetFleetStart(f func(n int) int) { s.fleetStart = f }
