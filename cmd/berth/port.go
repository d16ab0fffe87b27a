package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/store"
)

// portCmd is berth port LABEL: the port of a live reservation, read
// without taking it.
func (a *app) portCmd() *cobra.Command {
	var udp bool
	cmd := &cobra.Command{
		Use:   "port LABEL",
		Short: "Print the port of the live reservation labelled LABEL; exit 3 if there is none",
		Long: `Print the port of the live reservation labelled LABEL in the scope in effect
(--scope, else $BERTH_SCOPE; without either, labels of no scope), whoever holds
it; the port of 'berth run --port NAME' is found as NAME too. It changes
nothing: the port stays its holder's. Where the label has several live
reservations (two addresses), the newest. Exit 3 when none.`,
		Example: `  berth port web
  curl "http://127.0.0.1:$(berth port --scope git web)/"`,
		Args: exactArgs(1, "LABEL"),
	}
	cmd.Flags().BoolVar(&udp, "udp", false, "the label's UDP port instead of its TCP one")
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		if err := store.CheckLabel(args[0]); err != nil || args[0] == "" {
			return usagef("LABEL %q: want the label of a reservation (%s)", args[0], labelWant(err))
		}
		proto := protocol(udp)
		s, err := a.openStore(ctx)
		if err != nil {
			return err
		}
		if s == nil {
			return fmt.Errorf("%s port of %q: %w: there is no state store yet", proto, args[0], errNoReservation)
		}
		defer func() { _ = s.Close() }()
		port, err := portOf(ctx, s, a.cfg.Scope, args[0], proto)
		if errors.Is(err, errNoReservation) {
			return fmt.Errorf("%w; 'berth ls' lists the reservations, 'berth ls --scope S' those of a scope", err)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(a.stdout, port)
		return nil
	})
	return cmd
}

// labelWant says what a label may be, after what CheckLabel found wrong.
func labelWant(err error) string {
	var fe *store.FieldError
	if errors.As(err, &fe) {
		return fe.Want
	}
	return "a non-empty label"
}

// envCmd is berth env: the live reservations of a scope as variables.
func (a *app) envCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Print the live reservations of a scope as variables (WEB_PORT=23456) for eval, .env files and editors",
		Long: `Print the live reservations labelled in the scope in effect (--scope, else
$BERTH_SCOPE; without either, the labels of no scope) as variables, whoever
holds them, named as berth run names them: --port web is WEB_PORT, any other
label upper-cased with '_' for each other character and _PORT after it
(api.http is API_HTTP_PORT). Where two reservations would give one variable,
the newest. It changes nothing.

--format sh (the default) prints export lines for eval; dotenv prints
NAME=PORT lines for docker compose's .env file, VS Code's envFile or direnv;
json prints one object.`,
		Example: `  eval "$(berth env --scope git)"
  berth env --scope git --format dotenv > .env   # for docker compose
  berth env --format json | jq .WEB_PORT`,
		Args: noArgs("env", ""),
	}
	cmd.Flags().StringVar(&format, "format", "sh", "sh (export lines for eval), dotenv (NAME=PORT lines) or json")
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		if !slices.Contains([]string{"sh", "dotenv", "json"}, format) {
			return usagef("--format %q: want sh, dotenv or json", format)
		}
		var ports []livePort
		s, err := a.openStore(ctx)
		if err != nil {
			return err
		}
		if s != nil {
			defer func() { _ = s.Close() }()
			if ports, err = livePorts(ctx, s, a.cfg.Scope); err != nil {
				return err
			}
		}
		if format == "json" {
			m := make(map[string]uint16, len(ports))
			for _, p := range ports {
				m[p.Var] = p.Port
			}
			return a.writeJSON(m)
		}
		var b strings.Builder
		for _, p := range ports {
			fmt.Fprintf(&b, "%s%s=%d\n", map[string]string{"sh": "export "}[format], p.Var, p.Port)
		}
		_, err = io.WriteString(a.stdout, b.String())
		return err
	})
	return cmd
}
