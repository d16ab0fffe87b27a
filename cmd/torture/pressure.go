package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// pressure runs spells of descriptor shortage in a worker (-fd-pressure):
// every 0.1-0.7 s it lowers the worker's soft RLIMIT_NOFILE to what it has
// open plus 0-2, for 50-600 ms, then sets the limit back. Meanwhile every
// open, socket and pipe beyond the few left fails with EMFILE: the store's
// files, the bind probes, the worker's own binds and children. The hard
// limit stays, so a child started meanwhile (this same binary: Go raises
// its soft limit to the hard one at start) is not short itself.
type pressure struct {
	mu   sync.Mutex    // guards over
	over chan struct{} // closed when the current spell ends; nil between spells
}

// startPressure starts the spells; stop ends them, sets the limit back
// and returns once it is.
func startPressure(ctx context.Context, log *eventLog, rng *rand.Rand) (p *pressure, stop func()) {
	p = &pressure{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			gap := 100*time.Millisecond + time.Duration(rng.IntN(600))*time.Millisecond
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			p.spell(ctx, log, 50*time.Millisecond+time.Duration(rng.IntN(550))*time.Millisecond, uint64(rng.IntN(3)))
		}
	}()
	return p, func() { cancel(); <-done }
}

// spell lowers the soft limit to the descriptors open plus slack for d, or
// until ctx ends, and sets it back.
func (p *pressure) spell(ctx context.Context, log *eventLog, d time.Duration, slack uint64) {
	open, err := countOpen()
	if err != nil {
		return // out of descriptors already, or no /proc: no spell this time
	}
	over := make(chan struct{})
	p.mu.Lock()
	p.over = over
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.over = nil
		p.mu.Unlock()
		close(over)
	}()
	limit := uint64(open) + slack
	restore, err := lowerNoFile(limit)
	if err != nil {
		log.add(Event{Kind: KindError, Err: "fd pressure: " + err.Error()})
		return
	}
	log.add(Event{Kind: KindPressure, Limit: limit, Open: open, DurNS: int64(d)})
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	if err := restore(); err != nil {
		log.add(Event{Kind: KindError, Err: "fd pressure: set the limit back: " + err.Error()})
		return
	}
	log.add(Event{Kind: KindPressureEnd, Limit: limit})
}

func (p *pressure) on() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.over != nil
}

// wait waits, up to max or until ctx ends, for the current spell (if any)
// to end, and reports whether none is on.
func (p *pressure) wait(ctx context.Context, max time.Duration) bool {
	p.mu.Lock()
	over := p.over
	p.mu.Unlock()
	if over == nil {
		return true
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-over:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}
