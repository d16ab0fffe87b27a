// Command metrics shows berth's allocator metrics as Prometheus scrapes
// them, without Prometheus in the library: package expvarmetrics publishes
// the Allocator's Stats and Usage through expvar (JSON on /debug/vars), and
// a small adapter here writes the same numbers in Prometheus' text format
// on /metrics.
//
// Publishing through expvar is opt-in: portalloc itself does not import
// expvar, whose init registers /debug/vars on http.DefaultServeMux. This
// program imports portalloc/expvarmetrics on purpose, and serves its own
// mux rather than the default one.
//
//	go run ./examples/metrics            # runs a short scripted session and prints /metrics
//	go run ./examples/metrics -serve :9100
//
// The metric names follow Kubernetes' port allocator: allocated and
// available ports (gauges), allocations and allocation errors by scope
// (dynamic for Allocate, static for Reserve).
package main

import (
	"context"
	"expvar"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/store"
)

func main() {
	serve := flag.String("serve", "", "listen on this address and serve /metrics and /debug/vars until interrupted")
	flag.Parse()
	if err := run(context.Background(), *serve, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

// session makes some allocations and failures to have something to show.
func session(ctx context.Context, a *portalloc.Allocator) error {
	// Four allocations (scope dynamic)...
	var last store.Reservation
	for range 4 {
		r, err := a.Allocate(ctx, portalloc.Request{Label: "metrics.demo"})
		if err != nil {
			return err
		}
		last = r
	}
	// ...one reservation (scope static) of a port this process holds: it
	// gets the same reservation back...
	if _, err := a.Reserve(ctx, portalloc.Request{Addr: last.Addr}, last.Port); err != nil {
		return err
	}
	// ...and two failed reservations: a port another program has bound
	// (which is also a probe failure), and port 0.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	busy := netip.MustParseAddrPort(l.Addr().String()).Port()
	if _, err := a.Reserve(ctx, portalloc.Request{}, busy); err == nil {
		return fmt.Errorf("port %d was granted while bound", busy)
	}
	if _, err := a.Reserve(ctx, portalloc.Request{}, 0); err == nil {
		return fmt.Errorf("port 0 was granted")
	}
	return nil
}

func run(ctx context.Context, serve string, out io.Writer) error {
	a, err := portalloc.New(ctx, portalloc.Config{})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	if err := expvarmetrics.Publish(a, "berth"); err != nil { //nolint:contextcheck // expvar reads come later, each bounded by Publish itself
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/debug/vars", expvar.Handler())
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		ports, reserved, err := a.Usage(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		WritePrometheus(w, a.Stats(), ports, reserved)
	})

	if err := session(ctx, a); err != nil {
		return err
	}

	if serve == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer func() { _ = srv.Close() }()
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + l.Addr().String() + "/metrics")
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		_, err = io.Copy(out, resp.Body)
		return err
	}
	fmt.Fprintf(out, "serving /metrics and /debug/vars on %s\n", serve)
	srv := &http.Server{Addr: serve, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return srv.ListenAndServe()
}
