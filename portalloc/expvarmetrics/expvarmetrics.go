// Package expvarmetrics publishes an Allocator's metrics through expvar.
//
// It is a package of its own because importing expvar has a side effect:
// its init registers GET /debug/vars on http.DefaultServeMux, which then
// shows the process's command line and memory statistics to anyone who can
// reach a server of the default mux. Package portalloc imports neither
// expvar nor net/http, so only a program that imports this package on
// purpose gets that handler.
package expvarmetrics

import (
	"context"
	"expvar"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/seam"
)

// Usage is how much of an Allocator's range is taken.
type Usage struct {
	// Ports is the number of ports Allocate may hand out: the range less
	// exclusions and the OS ephemeral range.
	Ports int
	// Reserved is how many of those ports have at least one reservation in
	// the store, by any process.
	Reserved int
	// Available is Ports less Reserved.
	Available int
}

// ReadUsage reads from a's store how much of its range is reserved. Unlike
// a's Stats it queries the store, within ctx; in the MRU backend it
// reports only Ports. After a's Close it returns an error wrapping
// portalloc.ErrClosed.
func ReadUsage(ctx context.Context, a *portalloc.Allocator) (Usage, error) {
	ports, reserved, err := core.Usage(ctx, a)
	if err != nil {
		return Usage{}, opError("read usage", err)
	}
	return Usage{Ports: ports, Reserved: reserved, Available: ports - reserved}, nil
}

// core is what the metrics reach of an Allocator beyond its exported
// methods: a count of its store's rows.
var core = seam.Get[*portalloc.Allocator, portalloc.Reservation, portalloc.Request, portalloc.Config]()

// Metrics is an Allocator's Stats and the range's Usage together, as
// Publish publishes them.
type Metrics struct {
	Stats portalloc.Stats `json:"stats"`
	Usage Usage           `json:"usage"`
	// UsageError says why Usage is missing, if it is.
	UsageError string `json:"usage_error,omitempty"`
}

// Read returns a's Stats and Usage together; Usage queries the store,
// within ctx. After a is closed, Stats are as they were and UsageError
// says the Allocator is closed.
func Read(ctx context.Context, a *portalloc.Allocator) Metrics {
	m := Metrics{Stats: a.Stats()}
	u, err := ReadUsage(ctx, a)
	if err != nil {
		m.UsageError = err.Error()
	}
	m.Usage = u
	return m
}

// Timeout bounds the store query behind a read of a published variable.
const Timeout = 2 * time.Second

// Publish exposes a's Metrics (see Read) as the expvar variable name, which
// expvar.Handler (and so /debug/vars on http.DefaultServeMux) serves as
// JSON. Nothing is computed until the variable is read; each read queries
// the store for Usage, bounded by Timeout. After a is closed the variable
// still reads: Stats as they were, and UsageError saying the Allocator is
// closed.
//
// expvar allows each name once per process and has no way to withdraw one,
// so Publish refuses a nil Allocator, an empty name, or a name that is
// already published with a *portalloc.FieldError for "a" or "name"
// (wrapping portalloc.ErrInvalidRequest).
func Publish(a *portalloc.Allocator, name string) error {
	var refused *portalloc.FieldError
	switch {
	case a == nil:
		refused = &portalloc.FieldError{Field: "a", Value: "nil", Want: "an Allocator"}
	case name == "":
		refused = &portalloc.FieldError{Field: "name", Value: name, Want: `an expvar variable name such as "berth"; it is empty`}
	case expvar.Get(name) != nil:
		refused = &portalloc.FieldError{Field: "name", Value: name, Want: "an expvar variable name of its own for each Allocator; it is published already"}
	}
	if refused != nil {
		return opError("publish", refused)
	}
	expvar.Publish(name, expvar.Func(func() any {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		return Read(ctx, a)
	}))
	return nil
}

// opError is the error of a public call of the package: err in a
// *portalloc.OpError for op, the one place the package's calls add the
// prefix. nil stays nil.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return &portalloc.OpError{Op: op, Err: err}
}
