// Command fleet shows berth's fleet mode: two hosts share one port range
// through a PostgreSQL store. Each host may be granted the same port, since
// a port is bound on one machine's interfaces; one host never gets a port
// twice, whichever of its processes asks. (Two Allocators of one process
// are one owner: a Reserve of a port the process holds returns it again.
// So the second process of host-a here is a real one: this program, run
// again as a child.)
//
//	BERTH_STORE='host=/var/run/postgresql dbname=berth' go run ./examples/fleet
//
// BERTH_STORE names the database (see portalloc.Config.StoreDSN), which
// fleet.New (package portalloc/fleet) opens: portalloc alone links no
// PostgreSQL client. The other BERTH_* variables apply as in
// portalloc.ConfigFromEnv. The two hosts,
// host-a and host-b (Config.Host), are Allocators of this one program: in
// a real fleet each runs on its own machine, with BERTH_HOST unset (the
// hostname) or set to that machine's name. Nothing here binds the ports it
// gets, so the two hosts can share this machine's loopback.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"text/tabwriter"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
)

// envAsk makes this program the second process of host-a: it asks for
// the port the variable names, and says what it got.
const envAsk = "BERTH_FLEET_EXAMPLE_ASK"

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
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil {
		return err
	}
	if cfg.StoreDSN == "" {
		return errors.New("set BERTH_STORE to a PostgreSQL connection string: the hosts of a fleet share their reservations there")
	}
	open := func(host string) (*portalloc.Allocator, error) {
		c := cfg
		c.Host = host
		return fleet.New(ctx, c)
	}
	// One process on host-a (this one; a second one comes below) and one
	// on host-b. Close releases whatever each still holds, even on an
	// early return.
	a, err := open("host-a")
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	b, err := open("host-b")
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tASKS FOR\tGETS")
	req := portalloc.Request{Label: "fleet.web"}
	web, err := a.Allocate(ctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "host-a\tany port\t%d\n", web.Port)

	// The same port on the other host: granted.
	webB, err := b.Reserve(ctx, req, web.Port)
	if err != nil {
		return fmt.Errorf("host-b reserve %d: %w", web.Port, err)
	}
	fmt.Fprintf(tw, "host-b\tport %d\t%d (each host has its own ports)\n", web.Port, webB.Port)
	if err := tw.Flush(); err != nil {
		return err
	}

	// The same port again on host-a, by another process: refused.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), envAsk+"="+strconv.Itoa(int(web.Port)))
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("second process of host-a: %w", err)
	}

	if err := a.Release(ctx, web); err != nil {
		// What is left is released by Close, or reaped once this process
		// exits.
		fmt.Fprintln(os.Stderr, "fleet: release:", err)
	}
	if err := b.Release(ctx, webB); err != nil {
		fmt.Fprintln(os.Stderr, "fleet: release:", err)
	}
	fmt.Fprintln(out, "released 2 ports (the second process's went when it exited)")
	return nil
}

// ask is the second process of host-a: it asks for the port envAsk names,
// which the first holds, and then for any port.
func ask(ctx context.Context, out io.Writer) error {
	port, err := strconv.ParseUint(os.Getenv(envAsk), 10, 16)
	if err != nil {
		return fmt.Errorf("%s: %w", envAsk, err)
	}
	cfg, err := portalloc.ConfigFromEnv()
	if err != nil {
		return err
	}
	cfg.Host = "host-a"
	a, err := fleet.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }() // releases what it got

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	_, err = a.Reserve(ctx, portalloc.Request{Label: "fleet.web"}, uint16(port))
	switch {
	case errors.Is(err, portalloc.ErrPortHeld):
		fmt.Fprintf(tw, "host-a\tport %d\trefused: host-a holds it already\n", port)
	case err == nil:
		return fmt.Errorf("host-a was granted port %d twice", port)
	default:
		return err
	}
	api, err := a.Allocate(ctx, portalloc.Request{Label: "fleet.api"})
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "host-a\tany port\t%d (not %d)\n", api.Port, port)
	return tw.Flush()
}
