package main

import (
	"context"
	"errors"

	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/store"
)

// boundRows tells, for ls --bound, whether each reservation's port is
// bound right now by a socket of its protocol on an address that overlaps
// its own (who.Overlaps), whoever holds it. known is false where the
// system cannot tell (every system but Linux); ls then shows "?", and
// never probes by binding, which could make a program's own bind fail.
func boundRows(ctx context.Context, rows []store.Reservation) (bound []bool, known bool, err error) {
	socks, err := who.Bound(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	bound = make([]bool, len(rows))
	for i, r := range rows {
		for _, s := range socks {
			if s.Protocol == r.Protocol && s.Local.Port() == r.Port && !s.Remote.IsValid() && who.Overlaps(s.Local.Addr(), r.Addr) {
				bound[i] = true
				break
			}
		}
	}
	return bound, true, nil
}

// boundWord is the BOUND column of ls --bound.
func boundWord(bound []bool, known bool, i int) string {
	switch {
	case !known:
		return "?"
	case bound[i]:
		return "yes"
	}
	return "no"
}
