package portalloc

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"path/filepath"

	"github.com/berth-go/berth/portalloc/internal/scopes"
	"github.com/berth-go/berth/store"
)

// scopeLabel records req's label in the Allocator's scope, and checks that
// the two fit in a label.
func (a *Allocator) scopeLabel(req Request) (Request, error) {
	if a.cfg.Scope == "" || req.Label == "" {
		return req, nil
	}
	l := scopes.Label(a.cfg.Scope, req.Label)
	if len(l) > store.MaxLabelLen {
		return Request{}, &FieldError{Field: "Request.Label", Value: req.Label,
			Want: fmt.Sprintf("at most %d bytes together with the scope %q and %q (%d bytes now): a shorter label or scope", store.MaxLabelLen, a.cfg.Scope, scopes.Sep, len(l))}
	}
	req.Label = l
	return req, nil
}

// scopeSeed returns the random source of the order in which a labelled
// request of a scope tries the range: seeded by the scope and the label, so
// that a label's first port in a scope is the same on every machine while
// it is free, and two scopes, or two labels, rarely start at the same
// port. A scope that is a path (scope.Git, scope.Dir) counts by its last
// element, the checkout's directory name, which is the same for the same
// project on another machine while the rest of the path is not. nil for a
// request without a scope or a label: the Allocator's own random order.
func (a *Allocator) scopeSeed(req Request) *rand.Rand {
	if a.cfg.Scope == "" || req.Label == "" {
		return nil
	}
	label, ok := scopes.Unscoped(req.Label, a.cfg.Scope)
	if !ok {
		return nil
	}
	name := a.cfg.Scope
	if filepath.IsAbs(name) {
		name = filepath.Base(name)
	}
	h := fnv.New128a()
	_, _ = h.Write([]byte(name))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(label))
	sum := h.Sum(nil)
	var hi, lo uint64
	for i := range 8 {
		hi = hi<<8 | uint64(sum[i])
		lo = lo<<8 | uint64(sum[8+i])
	}
	return rand.New(rand.NewPCG(hi, lo))
}
