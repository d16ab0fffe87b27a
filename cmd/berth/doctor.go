package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func (a *app) doctorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "doctor",
		Short:   "State directory, schema, mode in effect, ranges, what berth leaves out of them and why, and ports bound outside berth",
		Example: "  berth doctor",
		Args:    noArgs("doctor", ""),
		// A take-over that failed is reported with the rest.
		Annotations: map[string]string{annotTakeOver: "report"},
	}
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error { return a.runDoctor(ctx) })
	return cmd
}

func (a *app) runDoctor(ctx context.Context) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	// Values come from paths, the environment and error messages, which
	// can hold anything: they are printed escaped.
	line := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, printable(fmt.Sprintf(format, a...))) }

	stateDir := func() {
		if fi, err := os.Stat(a.cfg.StateDir); err == nil {
			line("state directory", "%s (mode %04o; %s)", a.cfg.StateDir, fi.Mode().Perm(), a.stateDirWhy)
		} else {
			line("state directory", "%s (%v; %s)", a.cfg.StateDir, err, a.stateDirWhy)
		}
	}
	if err := a.takeOverErr; err != nil {
		stateDir()
		// Opening the store now would make an empty one beside the one
		// that holds the reservations.
		line("take-over", "the store at the previous default could not be moved here: %v", err)
		line("to fix", "%s; berth refuses to open an empty store here while that one holds reservations", takeOverAdvice(err))
		_ = tw.Flush()
		return err
	}
	al, err := fleet.New(ctx, a.cfg)
	stateDir() // once New has made it, if it could
	if err != nil {
		line("mode", "%s: cannot serve: %v", modeOf(a.cfg), err)
		switch {
		case errors.Is(err, portalloc.ErrTransient):
			line("to fix", "the system ran short of what the message names; berth fails rather than fall back for that. Free some (raise ulimit -n, free disk space), then try again")
		case a.cfg.StoreDSN != "" && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrStorage)):
			line("to fix", "the PostgreSQL server of --store did not answer within --timeout (now %v) or refused the connection: check that it runs, that this host reaches it, and the connection string's user, password and database", a.cfg.Timeout)
		case errors.Is(err, statestore.ErrBusy) || errors.Is(err, context.DeadlineExceeded):
			line("to fix", "another process keeps the state store locked; berth waits for it (up to --timeout, now %v) rather than fall back. Stop or wait for that process", a.cfg.Timeout)
		}
		_ = tw.Flush()
		return err
	}
	defer func() { _ = al.Close() }()
	cfg := al.Config()
	switch cause := al.FallbackCause(); {
	case cfg.Mode == portalloc.ModeMRU:
		line("mode", "mru: the MRU file %s, as configured", filepath.Join(cfg.StateDir, statedir.MRUFile))
	case cause != nil:
		line("mode", "%s: serving from the MRU file because the state store failed: %v", cfg.Mode, cause)
		if held, err := statestore.ReadHeld(ctx, a.dbPath()); err != nil {
			line("fallback", "the database cannot be read either (%v), so the MRU file cannot skip the ports it holds and hands out none: get, reserve and run fail until the store is fixed. --mode mru (BERTH_MODE=mru) hands out ports blind on purpose, and may hand out ports other processes have reserved", err)
		} else {
			line("fallback", "ports from the MRU file are only remembered, not reserved; the database can still be read, so the %d reservations in it are skipped", held.Len())
		}
		line("to fix", "%s; berth goes back to the store by itself once it works. --strict or BERTH_MODE=statestore makes a fallback an error", fallbackAdvice(cause, a.dbPath()))
	default:
		line("mode", "%s: serving from the state store", cfg.Mode)
	}
	switch {
	case al.Backend() != portalloc.BackendStateStore:
	case cfg.StoreDSN != "":
		line("database", "%s (schema version %d), shared by a fleet; this host is %q", al.Database(), pgstore.SchemaVersion, hostName(cfg.Host))
	default:
		line("database", "%s (schema version %d)", al.Database(), statestore.SchemaVersion)
	}
	u, err := expvarmetrics.ReadUsage(ctx, al)
	if err != nil {
		return err
	}
	line("range", "%s: %d ports, %d can be handed out", cfg.Range, cfg.Range.Size(), u.Ports)
	printExclusions(line, cfg)
	eph, ephErr := portalloc.EphemeralRange()
	switch {
	case ephErr != nil:
		line("OS ephemeral", "%s (assumed: %v)", eph, ephErr)
	case cfg.Range.Overlaps(eph) && cfg.AllowEphemeralOverlap:
		line("OS ephemeral", "%s: overlaps the range, kept (allowed by configuration)", eph)
	case cfg.Range.Overlaps(eph):
		line("OS ephemeral", "%s: overlaps the range, left out of allocation", eph)
	default:
		line("OS ephemeral", "%s: no overlap", eph)
	}
	reserved := map[uint16]bool{}
	if al.Backend() == portalloc.BackendStateStore {
		s, err := a.openStore(ctx)
		if err != nil {
			return err
		}
		if s != nil {
			defer func() { _ = s.Close() }()
			rows, err := s.List(ctx, statestore.Filter{})
			if err != nil {
				return err
			}
			live, dead := 0, 0
			for _, r := range rows {
				reserved[r.Port] = true
				if r.Owner.Alive(ctx) {
					live++
				} else {
					dead++
				}
			}
			hint := ""
			if dead > 0 {
				hint = " (berth reap removes the dead)"
			}
			line("reservations", "%d live, %d dead%s; %d of the range's ports available", live, dead, hint, u.Available)
		}
	}
	outside := boundOutside(cfg.Range, reserved)
	switch {
	case len(outside) == 0:
		line("outside berth", "no port of the range is bound by a process outside berth")
	default:
		shown := outside[:min(len(outside), 10)]
		more := ""
		if len(outside) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(outside)-len(shown))
		}
		line("outside berth", "%d ports of the range are bound without a reservation: %v%s", len(outside), shown, more)
	}
	return tw.Flush()
}

// fallbackAdvice says what to do about the cause of a fallback.
func fallbackAdvice(cause error, db string) string {
	switch {
	case errors.Is(cause, statestore.ErrSchemaTooNew):
		return "a newer berth has upgraded " + db + ": upgrade this berth, or give it another state directory (--state-dir, BERTH_STATE_DIR)"
	case errors.Is(cause, statestore.ErrDamaged):
		return "move " + db + " aside (berth never overwrites it) to start a new store, or use another state directory (--state-dir, BERTH_STATE_DIR)"
	default:
		return "check that " + filepath.Dir(db) + " is writable and its file system not full"
	}
}

// takeOverAdvice says what to do about a take-over that failed.
func takeOverAdvice(err error) string {
	if fix := unsafeFix(err); fix != "" {
		return fix
	}
	if errors.Is(err, statestore.ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
		return "another process kept the old store locked; run berth again once it lets go, or stop it"
	}
	return "fix the cause above and run berth again, or set --state-dir or " + portalloc.EnvStateDir + " to the old directory to keep using it"
}

func modeOf(cfg portalloc.Config) portalloc.Mode {
	if cfg.StoreDSN != "" && cfg.Mode != portalloc.ModeMRU {
		return portalloc.ModeStateStore // a fleet's store never falls back
	}
	if cfg.Mode == "" {
		return portalloc.ModeStateStoreWithFallback
	}
	return cfg.Mode
}

// boundOutside returns the ports of r without a reservation that something
// has bound, for TCP or UDP on any address: a dual-stack wildcard bind fails
// on any of them.
func boundOutside(r portalloc.Range, reserved map[uint16]bool) []uint16 {
	var out []uint16
	for p := int(r.First); p <= int(r.Last); p++ {
		if reserved[uint16(p)] {
			continue
		}
		hp := net.JoinHostPort("", strconv.Itoa(p))
		l, err := net.Listen("tcp", hp)
		if err == nil {
			_ = l.Close()
			c, uerr := net.ListenPacket("udp", hp)
			if uerr == nil {
				_ = c.Close()
				continue
			}
		}
		out = append(out, uint16(p))
	}
	return out
}

// hostName is the name a fleet store knows this host by: host, or else the
// hostname, as pgstore defaults it.
func hostName(host string) string {
	if host != "" {
		return host
	}
	name, err := os.Hostname()
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return name
}
