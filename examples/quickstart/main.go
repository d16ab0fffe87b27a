// Command quickstart reserves ports for a small made-up app (web, api, db)
// in the per-user berth store, prints who got what, and releases them.
//
//	go run ./examples/quickstart
//
// The zero portalloc.Config takes its settings from the BERTH_*
// environment variables; with none set it uses the per-user state
// directory and the default range 20000-32767.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	a, err := portalloc.New(ctx, portalloc.Config{})
	if err != nil {
		return err
	}
	// Close releases whatever is still held, even on an early return.
	defer func() { _ = a.Close() }()

	var rs []store.Reservation
	for _, label := range []string{"web", "api", "db"} {
		r, err := a.Allocate(ctx, portalloc.Request{Label: "quickstart." + label})
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LABEL\tADDRESS\tPORT")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", r.Label, r.Addr, r.Port)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	for _, r := range rs {
		if err := a.Release(ctx, r); err != nil {
			// Release never needs to fail the program: what it leaves
			// behind is reaped once this process exits.
			fmt.Fprintln(os.Stderr, "quickstart: release:", err)
		}
	}
	fmt.Fprintf(out, "released %d ports\n", len(rs))
	return nil
}
