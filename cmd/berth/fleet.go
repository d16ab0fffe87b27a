package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

// fleetFlags are the flags of the berth fleet commands.
type fleetFlags struct {
	holder, band, label, addr, set, to string
	ttl                                time.Duration
	udp, all, json                     bool
	needTo                             bool // narrow's --to is required
}

// holderHelp explains --holder wherever it appears.
const holderHelp = `the reservation's owner, a name of the controller's choosing such as "pod/default/web-0" (required)`

// addKey adds the flags that name a reservation's key with its PORT.
func (f *fleetFlags) addKey(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.holder, "holder", "", holderHelp)
	cmd.Flags().BoolVar(&f.udp, "udp", false, "UDP instead of TCP")
	cmd.Flags().StringVar(&f.addr, "addr", "0.0.0.0", "address the port is for; 0.0.0.0 (the default) and :: take it on every address")
}

func (a *app) fleetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Reserve ports free on every host of a fleet, for owners that are not processes (--store)",
		Long: `Reserve ports that are free on every host of the fleet that shares --store,
for owners whose host is not known yet (a pod not yet scheduled) or that are
not processes at all (a pod, a job). Each reservation is held by a named
--holder under a lease on the PostgreSQL server's clock: no process of any
host is given the port while it lasts. The holder's controller renews the
lease, narrows the reservation to a host once it is known, and releases it;
a lease that runs out is reaped by any host.`,
		Args: noArgs("fleet", "try 'berth fleet reserve --holder NAME --band FIRST-LAST'"),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.fleetReserveCmd(), a.fleetRenewCmd(), a.fleetReleaseCmd(), a.fleetNarrowCmd(), a.fleetLsCmd())
	return cmd
}

// fleetStore opens the fleet's store of --store.
func (a *app) fleetStore(ctx context.Context) (*pgstore.Store, error) {
	if a.cfg.StoreDSN == "" {
		return nil, usagef("%s needs --store (a fleet's PostgreSQL store)", a.name)
	}
	cfg := a.cfg
	cfg.IgnoreEnv = true // a.cfg has what the variables say already
	return fleet.Open(ctx, cfg)
}

// withFleet runs fn on the fleet's store of --store.
func (a *app) withFleet(ctx context.Context, fn func(*pgstore.Store) error) error {
	st, err := a.fleetStore(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }() //nolint:contextcheck // Close ends the session on a context of its own, within the store's timeout
	return fn(st)
}

// needHolder refuses a missing --holder.
func needHolder(holder string) error {
	if holder == "" {
		return usagef("--holder is missing: want %s", holderHelp)
	}
	return nil
}

func (a *app) fleetReserveCmd() *cobra.Command {
	var f fleetFlags
	cmd := &cobra.Command{
		Use:   "reserve --holder NAME --band FIRST-LAST",
		Short: "Reserve a port of --band free on every host, for --holder under a lease; print it",
		Long: `Reserve for --holder a port of --band that is free on every host of the
fleet, under a lease of --ttl by the server's clock, and print it. The search
starts at a random port of the band, so controllers that reserve at once
rarely want the same one. Exit 3 when no port of the band is free on every
host.

With --set SPEC (a set spec as berth run --set takes it, JSON), every port of
the set is reserved for --holder, all of them or none, and each is printed
with its label: "<set>/<group>/<member>/<port> PORT". A port the spec fixes is
reserved as it is; the others come from --band.`,
		Example: `  berth fleet reserve --store "$BERTH_STORE" --holder pod/default/web-0 --band 40000-40999 --ttl 1m
  berth fleet reserve --holder job/shop --band 40000-40999 --set shop.json --json`,
		Args: noArgs("fleet reserve", "the port comes from --band"),
	}
	f.addKey(cmd)
	cmd.Flags().StringVar(&f.band, "band", "", "the ports to draw from, FIRST-LAST such as 40000-40999: a band of the fleet's own, apart from the hosts' --range (required)")
	cmd.Flags().DurationVar(&f.ttl, "ttl", 0, "how long the lease lasts unless renewed (default "+pgstore.DefaultFleetTTL.String()+", at most 168h)")
	cmd.Flags().StringVar(&f.label, "label", "", "a name for the port, shown by berth fleet ls")
	cmd.Flags().StringVar(&f.set, "set", "", "a set spec (JSON file): reserve every port of it for --holder, all or none")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		if err := needHolder(f.holder); err != nil {
			return err
		}
		if f.band == "" {
			return usagef("--band is missing: want the ports to draw from, FIRST-LAST such as 40000-40999")
		}
		band, err := store.ParseRange(f.band)
		if err != nil {
			return usagef("--band %q: want FIRST-LAST such as 40000-40999, 1 <= FIRST <= LAST <= 65535", f.band)
		}
		var spec portset.SetSpec
		req := pgstore.FleetRequest{Protocol: protocol(f.udp), Band: band, Holder: f.holder, Label: f.label, TTL: f.ttl}
		switch {
		case f.set != "" && cmd.Flags().Changed("label"):
			return usagef("--label with --set: the set's ports are labelled by the spec")
		case f.set != "" && (cmd.Flags().Changed("udp") || cmd.Flags().Changed("addr")):
			return usagef("--udp or --addr with --set: the spec gives each port its protocol and address")
		case f.set != "":
			spec, err = readSetSpec(f.set)
		default:
			req.Addr, err = parseAddr(f.addr)
		}
		if err != nil {
			return err
		}
		return a.withFleet(ctx, func(st *pgstore.Store) error {
			var rs []pgstore.FleetReservation
			if f.set == "" {
				r, err := st.ReserveFleet(ctx, req)
				if err != nil {
					return err
				}
				rs = append(rs, r)
			} else {
				reqs, err := fleet.SetRequests(spec, band, f.holder, f.ttl)
				if err != nil {
					return err
				}
				if rs, err = st.ReserveFleetSet(ctx, reqs); err != nil {
					return err
				}
			}
			if f.json {
				return a.writeJSON(leasesJSON(rs))
			}
			for _, r := range rs {
				if f.set == "" {
					fmt.Fprintln(a.stdout, r.Port)
				} else {
					fmt.Fprintf(a.stdout, "%s %d\n", printable(r.Label), r.Port)
				}
			}
			return nil
		})
	})
	return cmd
}

// leaseCmd makes cmd one that acts on the reservations of --holder, as renew, release and
// narrow do: it runs fn on the fleet's store with those that PORT (args, with --udp and
// --addr) or --all names.
func (a *app) leaseCmd(cmd *cobra.Command, f *fleetFlags, fn func(context.Context, *pgstore.Store, []pgstore.FleetReservation) error) *cobra.Command {
	f.addKey(cmd)
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		if err := needHolder(f.holder); err != nil {
			return err
		}
		switch {
		case len(args) == 0 && !f.all:
			return usagef("give a PORT, or --all for every port of --holder")
		case len(args) == 1 && f.all:
			return usagef("--all with a PORT: give one of them")
		case f.needTo && f.to == "":
			return usagef("--to is missing: want the host the reservation is for from now on")
		}
		return a.withFleet(ctx, func(st *pgstore.Store) error {
			if len(args) == 0 {
				rs, err := leasesOf(ctx, st, f.holder)
				if err != nil {
					return err
				}
				return fn(ctx, st, rs)
			}
			port, err := parsePort("port", args[0])
			if err != nil {
				return err
			}
			addr, err := parseAddr(f.addr)
			if err != nil {
				return err
			}
			return fn(ctx, st, []pgstore.FleetReservation{{Key: store.Key{Protocol: protocol(f.udp), Addr: addr, Port: port}, Holder: f.holder}})
		})
	})
	return cmd
}

// leasesOf returns the fleet's reservations held under a lease by holder, or by every
// holder for "".
func leasesOf(ctx context.Context, st *pgstore.Store, holder string) ([]pgstore.FleetReservation, error) {
	all, err := st.Leases(ctx)
	rs := all[:0]
	for _, r := range all {
		if holder == "" || r.Holder == holder {
			rs = append(rs, r)
		}
	}
	return rs, err
}

func (a *app) fleetRenewCmd() *cobra.Command {
	var f fleetFlags
	cmd := &cobra.Command{
		Use:   "renew PORT|--all --holder NAME",
		Short: "Extend the lease of --holder's fleet-wide port (or --all of them) to --ttl from now",
		Long: `Extend the lease of --holder on PORT (--udp and --addr as it was reserved
with), or with --all on every port --holder holds, to --ttl from now by the
server's clock. Renew every third of the TTL or so. A port that --holder no
longer holds (released, or its lease ran out and it was reaped) is an error:
it may be someone else's now; reserve again.`,
		Example: `  berth fleet renew 40017 --holder pod/default/web-0 --ttl 1m
  berth fleet renew --all --holder job/shop`,
		Args: maxArgs(1, "PORT"),
	}
	cmd.Flags().DurationVar(&f.ttl, "ttl", 0, "the lease from now (default "+pgstore.DefaultFleetTTL.String()+", at most 168h)")
	cmd.Flags().BoolVar(&f.all, "all", false, "renew every port of --holder")
	return a.leaseCmd(cmd, &f, func(ctx context.Context, st *pgstore.Store, rs []pgstore.FleetReservation) error {
		if len(rs) == 0 {
			return fmt.Errorf("%w: %s holds no fleet-wide port; 'berth fleet ls' lists the leases", store.ErrNotFound, strconv.Quote(f.holder))
		}
		for _, r := range rs {
			if err := st.RenewFleet(ctx, r.Key, r.Holder, f.ttl); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "renewed %s of %s\n", r.Key, printable(strconv.Quote(f.holder)))
		}
		return nil
	})
}

func (a *app) fleetReleaseCmd() *cobra.Command {
	var f fleetFlags
	cmd := &cobra.Command{
		Use:   "release PORT|--all --holder NAME",
		Short: "Release --holder's fleet-wide port (or --all of them)",
		Long: `Release --holder's reservation of PORT (--udp and --addr as it was reserved
with), fleet-wide or narrowed to a host, or with --all every one --holder
holds: what a pod's finalizer runs. Another holder's reservation is never
touched; a PORT --holder does not hold is an error.`,
		Example: `  berth fleet release 40017 --holder pod/default/web-0
  berth fleet release --all --holder job/shop`,
		Args: maxArgs(1, "PORT"),
	}
	cmd.Flags().BoolVar(&f.all, "all", false, "release every port of --holder")
	return a.leaseCmd(cmd, &f, func(ctx context.Context, st *pgstore.Store, rs []pgstore.FleetReservation) error {
		for _, r := range rs {
			err := st.ReleaseFleet(ctx, r.Key, r.Holder)
			if errors.Is(err, store.ErrNotFound) && f.all {
				continue // lapsed and reaped since the listing
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "released %s of %s\n", r.Key, printable(strconv.Quote(f.holder)))
		}
		if len(rs) == 0 {
			fmt.Fprintf(a.stderr, "%s: nothing to release: %s holds no fleet-wide port\n", a.name, printable(strconv.Quote(f.holder)))
		}
		return nil
	})
}

func (a *app) fleetNarrowCmd() *cobra.Command {
	f := fleetFlags{needTo: true}
	cmd := &cobra.Command{
		Use:   "narrow PORT --holder NAME --to HOST",
		Short: "Make --holder's fleet-wide port one of host --to, free again on the others",
		Long: `Make --holder's fleet-wide reservation of PORT (--udp and --addr as it was
reserved with) one of the host --to, once the holder's host is known (its
pod was bound to a node): the port is free again on every other host, and
stays --holder's, under its lease, on --to. --to is a host name as --host
takes it; a host no berth has run on yet is registered by the name, so
check it: a misspelt one holds the port on a host that does not exist.`,
		Example: `  berth fleet narrow 40017 --holder pod/default/web-0 --to node-3`,
		Args:    exactArgs(1, "a PORT"),
	}
	cmd.Flags().StringVar(&f.to, "to", "", "the host the reservation is for from now on (required)")
	return a.leaseCmd(cmd, &f, func(ctx context.Context, st *pgstore.Store, rs []pgstore.FleetReservation) error {
		if err := st.NarrowFleet(ctx, rs[0].Key, rs[0].Holder, f.to); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "narrowed %s of %s to host %s\n", rs[0].Key, printable(strconv.Quote(f.holder)), printable(f.to))
		return nil
	})
}

// leaseJSON is a fleet-wide reservation as berth fleet prints it.
type leaseJSON struct {
	Holder   string    `json:"holder"`
	Protocol string    `json:"protocol"`
	Address  string    `json:"address"`
	Port     uint16    `json:"port"`
	Label    string    `json:"label"`
	Host     string    `json:"host"` // "" while fleet-wide
	Expires  time.Time `json:"expires"`
	Created  time.Time `json:"created"`
}

func leasesJSON(rs []pgstore.FleetReservation) []leaseJSON {
	out := make([]leaseJSON, len(rs))
	for i, r := range rs {
		out[i] = leaseJSON{r.Holder, string(r.Protocol), r.Addr.String(), r.Port, r.Label, r.Host, r.Expires.UTC(), r.Created.UTC()}
	}
	return out
}

func (a *app) fleetLsCmd() *cobra.Command {
	var f fleetFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the fleet's reservations held under a lease",
		Long: `List every reservation of the fleet held under a lease, fleet-wide (HOST "*")
or narrowed to a host, ordered by holder, protocol and port. EXPIRES is the
end of the lease by the PostgreSQL server's clock, in UTC; a lease that ran
out is listed until a host reaps it.`,
		Example: `  berth fleet ls --holder pod/default/web-0
  berth fleet ls --json | jq '.[] | select(.host == "")'`,
		Args: noArgs("fleet ls", "filter with --holder"),
	}
	cmd.Flags().StringVar(&f.holder, "holder", "", "only the reservations of this holder")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		return a.withFleet(ctx, func(st *pgstore.Store) error {
			rs, err := leasesOf(ctx, st, f.holder)
			if err != nil {
				return err
			}
			if f.json {
				return a.writeJSON(leasesJSON(rs))
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "HOLDER\tPROTO\tADDRESS\tPORT\tLABEL\tHOST\tEXPIRES")
			for _, r := range rs {
				host := "*"
				if r.Host != "" {
					host = shown(r.Host, maxNameWidth)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", shown(r.Holder, maxLabelWidth), r.Protocol, r.Addr, r.Port,
					dash(shown(r.Label, maxLabelWidth)), host, r.Expires.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		})
	})
	return cmd
}
