package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/pgstore"
)

func (a *app) hostCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Manage the hosts of a fleet that shares a --store",
		Args:  noArgs("host", "try 'berth host retire NAME'"),
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	retire := &cobra.Command{
		Use:   "retire NAME",
		Short: "Delete every reservation of a host that is gone for good",
		Long: `Delete every reservation, and every remembered port, of the host NAME in the
fleet's --store, for a host that has been decommissioned: its ports count
as held until then (or until its lease has lapsed for the store's grace
period). Run it from another host of the fleet.

A host whose lease is live (a berth process ran on it within the last lease
period, 30s) is refused, naming the host and when its lease ends: its
processes may still use the ports. --force retires it anyway; processes
that keep berth's library open then put their reservations back at their
next lease renewal (within about 11s), and until then the ports can be
handed out again on it.

Should NAME come back after all, the first berth on it reports how many of
its reservations were deleted, and it goes on with a fresh lease.`,
		Example: `  berth host retire --store "$BERTH_STORE" node-17`,
		Args:    exactArgs(1, "a host NAME"),
	}
	var force bool
	retire.Flags().BoolVar(&force, "force", false, "retire the host even while its lease is live (its berth processes may be running)")
	retire.RunE = a.action(func(ctx context.Context, args []string) error {
		return a.withFleet(ctx, func(st *pgstore.Store) error {
			if args[0] == st.Host() {
				return usagef("%q is this host's own name (--host, else $BERTH_HOST, else the hostname); retire a host from another host of the fleet", args[0])
			}
			n, err := st.Retire(ctx, args[0], pgstore.RetireOptions{Force: force})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "retired host %s: deleted %d reservations\n", printable(args[0]), n)
			return nil
		})
	})
	cmd.AddCommand(retire)
	return cmd
}
