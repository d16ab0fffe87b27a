package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/dsn"
	"github.com/berth-go/berth/internal/portrange"
	"github.com/berth-go/berth/pgstore"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func (a *app) doctorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "State directory, store, mode in effect, ranges, what berth leaves out of them and why, and leaked or outside ports",
		Long: `State directory, store, mode in effect, ranges, what berth leaves out of them
and why; then the leaks people make: a port a live process listens on whose
reservation died with its owner (a make recipe's shell that started a server
in the background, say), with who listens and the fix; and the ports of the
range that processes outside berth hold.`,
		Example: "  berth doctor",
		Args:    noArgs("doctor", ""),
	}
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		// Values come from paths, the environment and error messages, which can hold
		// anything: they are printed escaped.
		line := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, printable(fmt.Sprintf(format, a...))) }

		al, err := fleet.New(ctx, a.cfg)
		if a.cfg.StoreDSN == "" { // once New has made it, if it could
			if fi, err := os.Stat(a.cfg.StateDir); err == nil {
				line("state directory", "%s (mode %04o; %s)", a.cfg.StateDir, fi.Mode().Perm(), a.stateDirWhy)
			} else {
				line("state directory", "%s (%v; %s)", a.cfg.StateDir, err, a.stateDirWhy)
			}
		}
		if err != nil {
			line("mode", "%s: cannot serve: %v", modeOf(a.cfg), inUserWords(err))
			switch {
			case errors.Is(err, store.ErrTransient):
				line("to fix", "the system ran short of what the message names; berth fails rather than fall back for that. Free some (raise ulimit -n, free disk space), then try again")
			case a.cfg.StoreDSN != "" && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrStorage)):
				line("to fix", "the PostgreSQL server of --store did not answer within --timeout (now %v) or refused the connection: check that it runs, that this host reaches it, and the connection string's user, password and database", a.cfg.Timeout)
			case errors.Is(err, store.ErrBusy) || errors.Is(err, context.DeadlineExceeded):
				line("to fix", "another process keeps the state store locked; berth waits for it (up to --timeout, now %v) rather than fall back. Stop or wait for that process", a.cfg.Timeout)
			case errors.Is(err, store.ErrUnavailable) && a.cfg.StoreDSN == "":
				line("to fix", "set --state-dir or BERTH_STATE_DIR to a directory this user can create and write")
			}
			_ = tw.Flush()
			return err
		}
		defer func() { _ = al.Close() }()
		cfg := al.Config()
		st := al.Stats()
		switch {
		case cfg.Mode == portalloc.ModeMRU:
			line("mode", "mru: the MRU file %s, as configured: every port is locked for its holder, and recorded in no store", filepath.Join(cfg.StateDir, "mru.json"))
		case st.Fallback != "":
			line("mode", "%s: serving from the MRU file because the state store failed: %s", cfg.Mode, st.Fallback)
			line("fallback", "ports from the MRU file are locked for their holders, so no berth process is given them, but no store records them: berth ls shows them as locks")
			line("to fix", "%s; berth goes back to the store by itself once it works. --strict or BERTH_MODE=statestore makes a fallback an error", fallbackAdvice(st.Fallback, a.dbPath()))
		default:
			line("mode", "%s: serving from the state store", cfg.Mode)
		}
		switch {
		case st.Fallback != "" || cfg.Mode == portalloc.ModeMRU:
		case cfg.StoreDSN != "":
			// Open has migrated the database up to this berth's version, and refuses a
			// newer one.
			line("database", "%s (schema version %d, the database's and this berth's), shared by a fleet; this host is %q",
				dsn.Redact(cfg.StoreDSN), pgstore.SchemaVersion, hostName(cfg.Host))
		default:
			v, err := fileSchemaVersion(ctx, a.dbPath())
			if err != nil {
				v = fmt.Sprintf("unknown (%v)", err)
			}
			line("database", "%s (the file's schema version %s; this berth's %d)", a.dbPath(), v, statestore.SchemaVersion)
		}
		ports, _, err := al.Usage(ctx)
		if err != nil {
			return err
		}
		line("range", "%s: %d %s, %d can be handed out", cfg.Range, cfg.Range.Size(), plural(cfg.Range.Size(), "port"), ports)
		printExclusions(line, cfg)
		eph, ephErr := portrange.Ephemeral()
		switch r := portrange.Range(cfg.Range); {
		case ephErr != nil:
			line("OS ephemeral", "%s (assumed: %v)", eph, ephErr)
		case r.Overlaps(eph) && cfg.AllowEphemeralOverlap:
			line("OS ephemeral", "%s: overlaps the range, kept (allowed by configuration)", eph)
		case r.Overlaps(eph):
			line("OS ephemeral", "%s: overlaps the range, left out of allocation", eph)
		default:
			line("OS ephemeral", "%s: no overlap", eph)
		}
		var rows []store.Reservation
		if st.Fallback == "" && cfg.Mode != portalloc.ModeMRU {
			if rows, err = a.listRows(ctx, store.Filter{}); err != nil {
				return err
			}
		}
		a.doctorLeaks(ctx, line, cfg.Range, rows)
		return tw.Flush()
	})
	return cmd
}

// doctorLeaks reports the reservations, the leaks (a live listener on the port of a dead
// reservation), and the ports bound outside berth.
func (a *app) doctorLeaks(ctx context.Context, line func(k, format string, a ...any), rng store.Range, rows []store.Reservation) {
	held := map[uint16]bool{} // ports a live reservation or a lock keeps
	var dead []store.Reservation
	live := 0
	for _, r := range rows {
		if r.Live(ctx) {
			held[r.Port] = true
			live++
		} else {
			dead = append(dead, r)
		}
	}
	locks := lockRows(ctx, rows, store.Filter{})
	for _, l := range locks {
		held[l.Port] = true
	}
	hint := ""
	if len(dead) > 0 {
		hint = " (berth reap removes the dead)"
	}
	line("reservations", "%d live, %d dead%s; %d %s locked without a row of this store (tests' porttest ports, other stores' and users' berths: berth ls lists them)",
		live, len(dead), hint, len(locks), plural(len(locks), "port"))

	// Who listens where, where the system tells.
	socks, sockErr := who.Bound(ctx)
	listeners := map[uint16][]who.Socket{}
	for _, sk := range socks {
		listeners[sk.Local.Port()] = append(listeners[sk.Local.Port()], sk)
	}
	leaks := 0
	for _, r := range dead {
		for _, sk := range listeners[r.Port] {
			if len(sk.Processes) == 0 || !who.Overlaps(sk.Local.Addr(), r.Addr) {
				continue
			}
			p := sk.Processes[0]
			leaks++
			line("leak", "port %d: pid %d (now %s) listens on %s, but the reservation of it died with its owner, pid %d (recorded as %s): any berth may hand the port out again. Next time, start the server with 'berth run --port NAME -- SERVER' (it owns the port while it runs), or give it the port right after starting it: 'berth transfer %d --to $!'; a port that must outlive both takes --holder NAME --ttl D",
				r.Port, p.PID, shown(p.Name, maxNameWidth), sk.Local, r.Owner.PID, shown(r.Owner.Name, maxNameWidth), r.Port)
			held[r.Port] = true
			break
		}
	}
	if leaks == 0 && len(dead) > 0 && sockErr == nil {
		line("leak", "none: no port of a dead reservation is listened on")
	}
	var outside []string
	if sockErr == nil {
		seen := map[uint16]bool{}
		for _, sk := range socks {
			p := sk.Local.Port()
			if !rng.Contains(p) || held[p] || seen[p] || sk.Remote.IsValid() {
				continue
			}
			seen[p] = true
			who := "?"
			if len(sk.Processes) > 0 {
				who = fmt.Sprintf("pid %d (%s)", sk.Processes[0].PID, shown(sk.Processes[0].Name, maxNameWidth))
			}
			outside = append(outside, fmt.Sprintf("%d by %s", p, who))
		}
	} else {
		for _, p := range boundOutside(rng, held) {
			outside = append(outside, strconv.Itoa(int(p)))
		}
	}
	if len(outside) == 0 {
		line("outside berth", "no port of the range is bound by a process outside berth")
	} else {
		verb := map[bool]string{true: "port of the range is", false: "ports of the range are"}[len(outside) == 1]
		line("outside berth", "%d %s bound without a reservation: %s (berth who PORT tells more)", len(outside), verb, upTo10(outside, ", "))
	}
}

// upTo10 joins the first ten of items with sep, and counts the rest.
func upTo10(items []string, sep string) string {
	s := strings.Join(items[:min(len(items), 10)], sep)
	if len(items) > 10 {
		s += fmt.Sprintf(" and %d more", len(items)-10)
	}
	return s
}

// printExclusions reports what berth leaves out of the range, but the OS ephemeral range,
// and why: each source with its ports in the range as runs, after any system list that
// cannot be read.
func printExclusions(line func(k, format string, a ...any), cfg portalloc.Config) {
	type exclusion struct {
		ports       []portrange.Range
		source, why string
	}
	var ex []exclusion
	if len(cfg.Exclude) > 0 {
		ports := make([]portrange.Range, len(cfg.Exclude))
		for i, r := range cfg.Exclude {
			ports[i] = portrange.Range(r)
		}
		ex = append(ex, exclusion{ports, "Config.Exclude (BERTH_PORT_EXCLUDE)", "configured"})
	}
	if byOS, err := portrange.ReservedByOS(); err != nil {
		line("excluded", "%v", err)
	} else if len(byOS) > 0 {
		ex = append(ex, exclusion{byOS, "the OS's excluded port ranges", "the OS refuses to bind them (Hyper-V, WinNAT)"})
	}
	local, err := portrange.LocalReserved()
	if err != nil {
		line("excluded", "%v", err)
	}
	if len(local) > 0 {
		ex = append(ex, exclusion{local, "net.ipv4.ip_local_reserved_ports", "the administrator keeps them for other software; reserve and --prefer refuse them unless --allow-reserved"})
	}
	if !cfg.AllowBrowserRestricted {
		ex = append(ex, exclusion{portrange.BrowserRestrictedRanges(), "web browsers' restricted ports", "Chromium and Firefox refuse to connect to them; skipped in --prefer lists too; --allow-browser-restricted keeps them"})
	}
	all := portrange.NewSet(portrange.Range(cfg.Range))
	for _, e := range ex {
		// The ports of the range excluded, as runs.
		rest := all.Without(e.ports...)
		var runs []string
		for p, from := int(cfg.Range.First), -1; p <= int(cfg.Range.Last)+1; p++ {
			if out := p <= int(cfg.Range.Last) && !rest.Contains(uint16(p)); out && from < 0 {
				from = p
			} else if !out && from >= 0 {
				runs, from = append(runs, portrange.Range{First: uint16(from), Last: uint16(p - 1)}.String()), -1
			}
		}
		where := "none in the range"
		if n := all.Len() - rest.Len(); n > 0 {
			where = fmt.Sprintf("%d %s of the range: %s", n, plural(n, "port"), upTo10(runs, ","))
		}
		line("excluded", "%s: %s (%s)", e.source, where, e.why)
	}
}

// fallbackAdvice says what to do about the cause of a fallback.
func fallbackAdvice(cause, db string) string {
	switch {
	case strings.Contains(cause, store.ErrSchemaTooNew.Error()):
		return "a newer berth has upgraded " + db + ": upgrade this berth, or give it another state directory (--state-dir, BERTH_STATE_DIR)"
	case strings.Contains(cause, store.ErrDamaged.Error()):
		return "move " + db + " aside (berth never overwrites it) to start a new store, or use another state directory (--state-dir, BERTH_STATE_DIR)"
	default:
		return "check that " + filepath.Dir(db) + " is writable and its file system not full"
	}
}

func modeOf(cfg portalloc.Config) portalloc.Mode {
	if cfg.StoreDSN != "" && cfg.Mode != portalloc.ModeMRU {
		return portalloc.ModeStateStore // a fleet's store never falls back
	}
	return cmp.Or(cfg.Mode, portalloc.ModeStateStoreWithFallback)
}

// boundOutside returns the ports of r, not reserved, that something has bound for TCP or
// UDP on any address (a dual-stack wildcard bind fails).
func boundOutside(r store.Range, reserved map[uint16]bool) []uint16 {
	var out []uint16
	for i := int(r.First); i <= int(r.Last); i++ {
		p := uint16(i)
		tcp, _ := portlock.Probe("tcp", netip.IPv4Unspecified(), p)
		udp, _ := portlock.Probe("udp", netip.IPv4Unspecified(), p)
		if !reserved[p] && (!tcp || !udp) {
			out = append(out, p)
		}
	}
	return out
}

// fileSchemaVersion reads the schema version recorded in the SQLite file at path, without
// changing it.
func fileSchemaVersion(ctx context.Context, path string) (string, error) {
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: "mode=ro"}).String())
	if err != nil {
		return "", err
	}
	defer func() { _ = db.Close() }()
	var v int64
	if err := db.QueryRowContext(ctx, "SELECT version FROM schema_migrations LIMIT 1").Scan(&v); err != nil {
		return "", err
	}
	return strconv.FormatInt(v, 10), nil
}

// hostName is host, else the hostname, as pgstore defaults it.
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
