// Package expvarmetrics publishes an Allocator's metrics through expvar.
//
// It is a package of its own because importing expvar has a side effect:
// its init registers GET /debug/vars on http.DefaultServeMux, which then
// shows the process's command line and memory statistics to anyone who can
// reach a server of the default mux. Package portalloc imports neither
// expvar nor net/http, so only a program that imports this package on
// purpose gets that handler. What it publishes is portalloc's own:
// Allocator.Stats and Allocator.Usage.
package expvarmetrics

import (
	"context"
	"expvar"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// Timeout bounds the store query behind a read of a published variable.
const Timeout = 2 * time.Second

// metrics is what a read of the variable shows.
type metrics struct {
	Stats portalloc.Stats `json:"stats"`
	// Ports is how many ports Allocate may hand out, Reserved how many of
	// them have a live reservation in the store, Available the rest.
	Ports, Reserved, Available int
	// UsageError says why Reserved is missing, if it is.
	UsageError string `json:"usage_error,omitempty"`
}

// Publish exposes a's Stats and the use of its range (Usage) as the
// expvar variable name, which expvar.Handler (and so /debug/vars on
// http.DefaultServeMux) serves as JSON:
//
//	{"stats": {...}, "Ports": 12767, "Reserved": 3, "Available": 12764}
//
// Nothing is computed until the variable is read; each read queries the
// store, bounded by Timeout. After a is closed the variable still reads:
// Stats as they were, and usage_error saying the Allocator is closed.
//
// expvar allows each name once per process and has no way to withdraw one,
// so Publish refuses a nil Allocator, an empty name, or a name that is
// already published with a *store.FieldError for "a" or "name".
func Publish(a *portalloc.Allocator, name string) error {
	var refused *store.FieldError
	switch {
	case a == nil:
		refused = &store.FieldError{Field: "a", Value: "nil", Want: "an Allocator"}
	case name == "":
		refused = &store.FieldError{Field: "name", Value: name, Want: `an expvar variable name such as "berth"; it is empty`}
	case expvar.Get(name) != nil:
		refused = &store.FieldError{Field: "name", Value: name, Want: "an expvar variable name of its own for each Allocator; it is published already"}
	}
	if refused != nil {
		return &portalloc.OpError{Op: "publish", Err: refused}
	}
	expvar.Publish(name, expvar.Func(func() any {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		m := metrics{Stats: a.Stats()}
		ports, reserved, err := a.Usage(ctx)
		if err != nil {
			m.UsageError = err.Error()
			ports = m.Stats.Ports
		}
		m.Ports, m.Reserved, m.Available = ports, reserved, ports-reserved
		return m
	}))
	return nil
}
