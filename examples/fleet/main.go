// Command fleet shows berth's fleet mode: the hosts of a fleet share their
// reservations through a PostgreSQL store. A process of host-a is granted a
// port; a controller reserves another fleet-wide, for a pod not yet
// scheduled, so that no process of any host is given it while its lease
// lasts; and a second process of host-a (this program run again as a
// child) is refused both, then granted a third.
//
//	BERTH_STORE='host=/var/run/postgresql dbname=berth' go run ./examples/fleet
//
// BERTH_STORE names the database (see portalloc.Config.StoreDSN), which
// fleet.New and fleet.Open (package portalloc/fleet) open: portalloc alone
// links no PostgreSQL client. The other BERTH_* variables apply as they do
// to a zero portalloc.Config; the fleet-wide port comes from the Allocator's
// range. In a real fleet each host runs berth on its own machine, with
// BERTH_HOST unset (the hostname) or set to that machine's name.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// envAsk makes this program the second process of host-a: it asks for
// the ports the variable names (comma-separated), and says what it got.
const envAsk = "BERTH_FLEET_EXAMPLE_ASK"

// holder names the fleet-wide reservation's owner.
const holder = "pod/default/web-0"

func main() {
	if os.Getenv(envAsk) != "" {
		if err := ask(context.Background(), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet: second process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	if os.Getenv("BERTH_STORE") == "" {
		return errors.New("set BERTH_STORE to a PostgreSQL connection string: the hosts of a fleet share their reservations there")
	}
	cfg := portalloc.Config{Host: "host-a"}
	// Close releases whatever the Allocator still holds, even on an early
	// return.
	a, err := fleet.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	st, err := fleet.Open(ctx, portalloc.Config{Host: "controller"})
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }() //nolint:contextcheck // Close ends the session on a context of its own, within the store's timeout

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WHO\tASKS FOR\tGETS")
	web, err := a.Allocate(ctx, portalloc.Request{Label: "fleet.web"})
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "host-a\tany port\t%d\n", web.Port)

	pod, err := st.ReserveFleet(ctx, pgstore.FleetRequest{Protocol: store.TCP, Band: a.Config().Range, Holder: holder, Label: "fleet.pod", TTL: time.Minute})
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "%s\tany port, fleet-wide\t%d (leased for 1m)\n", holder, pod.Port)
	if err := tw.Flush(); err != nil {
		return err
	}

	// The second process of host-a asks for both.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), envAsk+"="+strconv.Itoa(int(web.Port))+","+strconv.Itoa(int(pod.Port)))
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("second process of host-a: %w", err)
	}

	if err := a.Release(ctx, web); err != nil {
		// What is left is released by Close, or reaped once this process
		// exits.
		fmt.Fprintln(os.Stderr, "fleet: release:", err)
	}
	if err := st.ReleaseFleet(ctx, pod.Key, holder); err != nil {
		// Left alone, it is reaped when its lease runs out.
		fmt.Fprintln(os.Stderr, "fleet: release:", err)
	}
	fmt.Fprintln(out, "released 2 ports (the second process's went when it exited)")
	return nil
}

// ask is the second process of host-a: it asks for the ports envAsk names,
// which others hold, and then for any port.
func ask(ctx context.Context, out io.Writer) error {
	a, err := fleet.New(ctx, portalloc.Config{Host: "host-a"})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }() // releases what it got

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var taken []string
	for _, s := range strings.Split(os.Getenv(envAsk), ",") {
		port, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return fmt.Errorf("%s: %w", envAsk, err)
		}
		taken = append(taken, s)
		_, err = a.Reserve(ctx, portalloc.Request{Label: "fleet.again"}, uint16(port))
		var ce *store.ConflictError
		switch {
		case errors.As(err, &ce) && ce.Holder.Owner.Holder != "":
			fmt.Fprintf(tw, "host-a\tport %d\trefused: %s holds it fleet-wide\n", port, ce.Holder.Owner.Holder)
		case errors.As(err, &ce):
			fmt.Fprintf(tw, "host-a\tport %d\trefused: pid %d of host-a holds it\n", port, ce.Holder.Owner.PID)
		case err == nil:
			return fmt.Errorf("host-a was granted port %d, which another holds", port)
		default:
			return err
		}
	}
	api, err := a.Allocate(ctx, portalloc.Request{Label: "fleet.api"})
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "host-a\tany port\t%d (not %s)\n", api.Port, strings.Join(taken, " or "))
	return tw.Flush()
}
