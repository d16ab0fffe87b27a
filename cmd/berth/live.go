package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/berth-go/berth/store"
)

// The ports others hold, read without holding them: the live reservations of a scope, by
// label (portOf) or all of them (livePorts).

// errNoReservation: portOf found no live reservation of the label.
var errNoReservation = errors.New("no live reservation")

// livePort is a live reservation of a scope, by its envVar.
type livePort struct {
	Var     string
	Port    uint16
	Created time.Time
}

// livePorts returns the live reservations labelled in scope ("": none), the newest for
// each variable, sorted by variable.
func livePorts(ctx context.Context, s store.Store, scope string) ([]livePort, error) {
	rows, err := s.List(ctx, store.Filter{})
	if err != nil {
		return nil, fmt.Errorf("list the live ports: %w", err)
	}
	byVar := map[string]livePort{}
	for _, r := range rows {
		label, ok := unscoped(r.Label, scope)
		if !ok || !r.Live(ctx) {
			continue
		}
		lp := livePort{envVar(label), r.Port, r.Created}
		if prev, ok := byVar[lp.Var]; !ok || lp.Created.After(prev.Created) {
			byVar[lp.Var] = lp
		}
	}
	return slices.SortedFunc(maps.Values(byVar), func(a, b livePort) int { return cmp.Compare(a.Var, b.Var) }), nil
}

// portOf returns the port of the newest live reservation of label in scope for protocol,
// else of run/port/label (berth run --port label); when there is none, the error wraps
// errNoReservation.
func portOf(ctx context.Context, s store.Store, scope, label string, protocol store.Protocol) (uint16, error) {
	for _, l := range []string{label, "run/port/" + label} {
		rows, err := s.List(ctx, store.Filter{Protocol: protocol, Label: scopedLabel(scope, l)})
		if err != nil {
			return 0, fmt.Errorf("port of %q: %w", label, err)
		}
		var best *store.Reservation
		for i, r := range rows {
			if r.Live(ctx) && (best == nil || r.Created.After(best.Created)) {
				best = &rows[i]
			}
		}
		if best != nil {
			return best.Port, nil
		}
	}
	in := ""
	if scope != "" {
		in = fmt.Sprintf(" in scope %q", scope)
	}
	return 0, fmt.Errorf("%s port of %q%s: %w", protocol, label, in, errNoReservation)
}

// envVar returns the variable a port labelled label goes by: run/port/web is WEB_PORT, as
// berth run names it; any other label upper-cased, with '_' for each character but a
// letter or digit, "_PORT" after it and '_' before a leading digit (api.http is
// API_HTTP_PORT).
func envVar(label string) string {
	name := label
	if rest, ok := strings.CutPrefix(label, "run/port/"); ok && rest != "" {
		name = rest
	}
	v := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
	if v == "" || v[0] >= '0' && v[0] <= '9' {
		v = "_" + v
	}
	return v + "_PORT"
}

// scopedLabel is label as a row of scope records it, LABEL@SCOPE.
func scopedLabel(scope, label string) string {
	if scope == "" || label == "" {
		return label
	}
	return label + "@" + scope
}

// unscoped returns the label in scope of a row labelled recorded, and whether it is one
// of scope's (for "", one of no scope).
func unscoped(recorded, scope string) (string, bool) {
	if scope == "" {
		return recorded, recorded != "" && !strings.Contains(recorded, "@")
	}
	label, ok := strings.CutSuffix(recorded, "@"+scope)
	return label, ok && label != ""
}
