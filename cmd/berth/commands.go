package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/statestore"
)

func init() {
	register(&command{
		name: "ls", summary: "list reservations: who holds which port, and whether the holder still runs",
		// The table shows at most maxLabelWidth characters of a label and
		// maxNameWidth of a process name (see shown); --json shows them
		// whole, escaped for the terminal (see jsonSafe).
		example: "  berth ls --label api.http\n  berth ls --json | jq '.[] | select(.alive == false)'",
		flags:   lsFlags, run: runLs,
	})
	register(&command{
		name: "get", summary: "allocate free ports and print them, one per line; they belong to the calling shell",
		example: "  PORT=$(berth get --label web)\n  berth get --count 3 --udp",
		flags:   getFlags, run: runGet,
	})
	register(&command{
		name: "reserve", args: " PORT", summary: "reserve a given port for the calling shell; exit 3 if it is held",
		example: "  berth reserve 8080 --label api || echo \"8080 is taken\"",
		flags:   getFlags, run: runReserve,
	})
	register(&command{
		name: "release", args: " [PORT]", summary: "release ports of the calling shell (or --owner-pid): by port, by --label, or all",
		example: "  berth release 8080\n  berth release --label web\n  berth release --owner-pid 4242",
		flags:   releaseFlags, run: runRelease,
	})
	register(&command{
		name: "reap", summary: "delete reservations whose process has exited, and print them",
		example: "  berth reap",
		run:     runReap,
	})
	register(&command{
		name: "doctor", summary: "state directory, schema, mode in effect, ranges, and ports bound outside berth",
		example: "  berth doctor",
		run:     runDoctor,
	})
}

// Flags shared by several commands, read back through lookups.
var (
	flagJSON     bool
	flagUDP      bool
	flagAddr     string
	flagLabel    string
	flagCount    int
	flagOwnerPID int
	flagPort     string
)

func ownerFlag(fs *flag.FlagSet) {
	fs.IntVar(&flagOwnerPID, "owner-pid", 0, "the process the ports belong to (default: berth's parent process, the calling shell)")
}

func lsFlags(fs *flag.FlagSet) {
	fs.BoolVar(&flagJSON, "json", false, "print JSON")
	fs.StringVar(&flagPort, "port", "", "only this port")
	fs.StringVar(&flagLabel, "label", "", "only this label")
	fs.IntVar(&flagOwnerPID, "owner-pid", 0, "only reservations of this process")
}

func getFlags(fs *flag.FlagSet) {
	fs.BoolVar(&flagUDP, "udp", false, "UDP instead of TCP")
	fs.StringVar(&flagAddr, "addr", "127.0.0.1", "address the port is for; 0.0.0.0 and :: are the wildcards")
	fs.StringVar(&flagLabel, "label", "", "a name for the port, shown by ls")
	fs.IntVar(&flagCount, "count", 1, "how many ports (get only)")
	fs.BoolVar(&flagJSON, "json", false, "print JSON")
	ownerFlag(fs)
}

func releaseFlags(fs *flag.FlagSet) {
	fs.StringVar(&flagLabel, "label", "", "release the owner's ports with this label")
	ownerFlag(fs)
}

// parsePort parses a port argument or flag value.
func parsePort(what, s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, usagef("%s %q: want a number from 1 to 65535", what, s)
	}
	return uint16(n), nil
}

func dbPath(e *env) string { return filepath.Join(e.cfg.StateDir, portalloc.DatabaseFile) }

// openStore opens the state store for reading or changing rows. It returns
// nil and no error when there is no store yet. Its waits for a store that
// another process keeps locked end with --timeout.
func openStore(ctx context.Context, e *env) (*statestore.Store, error) {
	if _, err := os.Stat(dbPath(e)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return statestore.Open(ctx, dbPath(e), statestore.Options{SweepInterval: -1, BusyTimeout: e.cfg.Timeout, Logger: e.cfg.Logger})
}

// fallbackHint follows the warning the Allocator logged when it fell back:
// what to run, and how to make it an error.
func fallbackHint(e *env, a *portalloc.Allocator) {
	if a.FallbackCause() == nil && a.Stats().Fallbacks == 0 {
		return
	}
	fmt.Fprintf(e.stderr, "berth %s: warning: ports handed out from the MRU file are only remembered there, not reserved: another program may be given them too. Run 'berth doctor' for the cause and what to do; --strict (or BERTH_MODE=statestore) makes this an error.\n", e.name)
}

// owner returns the identity of --owner-pid, or of berth's parent process.
func owner(ctx context.Context) (statestore.Owner, error) {
	pid := flagOwnerPID
	if pid == 0 {
		pid = os.Getppid()
	}
	o, err := statestore.LookupOwner(ctx, pid)
	if err != nil {
		return statestore.Owner{}, usagef("--owner-pid %d: not a running process", pid)
	}
	return o, nil
}

func request() (portalloc.Request, error) {
	addr, err := netip.ParseAddr(flagAddr)
	if err != nil {
		return portalloc.Request{}, usagef("--addr %q: want an IP address such as 127.0.0.1, ::1, 0.0.0.0 or ::", flagAddr)
	}
	req := portalloc.Request{Protocol: portalloc.TCP, Address: addr, Label: flagLabel}
	if flagUDP {
		req.Protocol = portalloc.UDP
	}
	return req, nil
}

// portJSON is one port as get and reserve print it with --json.
type portJSON struct {
	Protocol string `json:"protocol"`
	Address  string `json:"address"`
	Port     uint16 `json:"port"`
	Label    string `json:"label,omitempty"`
	Backend  string `json:"backend"`
	OwnerPID int    `json:"owner_pid"`
}

func printPorts(e *env, rs []portalloc.Reservation, own statestore.Owner) error {
	if flagJSON {
		out := make([]portJSON, len(rs))
		for i, r := range rs {
			out[i] = portJSON{string(r.Protocol), r.Address.String(), r.Port, r.Label, r.Backend, own.PID}
		}
		return writeJSON(e, out)
	}
	for _, r := range rs {
		fmt.Fprintln(e.stdout, r.Port)
	}
	return nil
}

// handOver gives every reservation to own. In the MRU backend there is
// nothing to hand over: the ports are only remembered as recently used.
func handOver(ctx context.Context, a *portalloc.Allocator, rs []portalloc.Reservation, own statestore.Owner) error {
	for _, r := range rs {
		if err := a.Transfer(ctx, r, own.PID); err != nil {
			return err
		}
	}
	return nil
}

// grantSetup reads the request flags and the owner, and opens an Allocator.
func grantSetup(ctx context.Context, e *env) (portalloc.Request, statestore.Owner, *portalloc.Allocator, error) {
	req, err := request()
	if err != nil {
		return portalloc.Request{}, statestore.Owner{}, nil, err
	}
	own, err := owner(ctx)
	if err != nil {
		return portalloc.Request{}, statestore.Owner{}, nil, err
	}
	a, err := portalloc.New(ctx, e.cfg)
	if err != nil {
		return portalloc.Request{}, statestore.Owner{}, nil, err
	}
	return req, own, a, nil
}

func runGet(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return usagef("get takes no arguments, got %q (did you mean 'berth reserve %s'?)", args, args[0])
	}
	if flagCount < 1 {
		return usagef("--count %d: want 1 or more", flagCount)
	}
	req, own, a, err := grantSetup(ctx, e)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }() // releases whatever was not handed over
	defer fallbackHint(e, a)
	var rs []portalloc.Reservation
	for range flagCount {
		r, err := a.Allocate(ctx, req)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	if err := handOver(ctx, a, rs, own); err != nil {
		return err
	}
	return printPorts(e, rs, own)
}

func runReserve(ctx context.Context, e *env, args []string) error {
	if len(args) != 1 {
		return usagef("reserve takes one PORT, got %d arguments", len(args))
	}
	port, err := parsePort("port", args[0])
	if err != nil {
		return err
	}
	req, own, a, err := grantSetup(ctx, e)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	defer fallbackHint(e, a)
	r, err := a.Reserve(ctx, req, port)
	var ce *portalloc.ConflictError
	if errors.As(err, &ce) && ce.HolderPID == own.PID && ce.HolderAddress == req.Address {
		// The owner holds exactly this already: reserving again is a no-op.
		return printPorts(e, []portalloc.Reservation{{Protocol: req.Protocol, Address: req.Address, Port: port, Label: ce.HolderLabel, Backend: portalloc.BackendStateStore}}, own)
	}
	if err != nil {
		return err
	}
	if err := handOver(ctx, a, []portalloc.Reservation{r}, own); err != nil {
		return err
	}
	return printPorts(e, []portalloc.Reservation{r}, own)
}

func runRelease(ctx context.Context, e *env, args []string) error {
	if len(args) > 1 {
		return usagef("release takes at most one PORT, got %d arguments", len(args))
	}
	if len(args) == 0 && flagLabel == "" && flagOwnerPID == 0 {
		return usagef("release needs a PORT, --label or --owner-pid")
	}
	var port uint16
	if len(args) == 1 {
		var err error
		if port, err = parsePort("port", args[0]); err != nil {
			return err
		}
	}
	own, err := owner(ctx)
	if err != nil {
		return err
	}
	s, err := openStore(ctx, e)
	if err != nil {
		return err
	}
	if s == nil {
		fmt.Fprintln(e.stderr, "berth release: nothing to release: there is no state store yet")
		return nil
	}
	defer func() { _ = s.Close() }()
	rows, err := s.List(ctx, statestore.Filter{Port: port, Label: flagLabel, OwnerPID: own.PID})
	if err != nil {
		return err
	}
	n := 0
	for _, r := range rows {
		if !r.Owner.Same(own) {
			continue // the pid's earlier process: reap, not release
		}
		if err := s.Release(ctx, r.Key, own); err != nil && !errors.Is(err, statestore.ErrNotFound) {
			return err
		}
		fmt.Fprintf(e.stdout, "released %s\n", r.Key)
		n++
	}
	if n == 0 {
		fmt.Fprintf(e.stderr, "berth release: nothing to release for pid %d\n", own.PID)
	}
	return nil
}

func runReap(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return usagef("reap takes no arguments")
	}
	s, err := openStore(ctx, e)
	if err != nil {
		return err
	}
	if s == nil {
		fmt.Fprintln(e.stdout, "reaped 0 reservations")
		return nil
	}
	defer func() { _ = s.Close() }()
	before, err := s.List(ctx, statestore.Filter{})
	if err != nil {
		return err
	}
	n, err := s.Reap(ctx)
	if err != nil {
		return err
	}
	after, err := s.List(ctx, statestore.Filter{})
	if err != nil {
		return err
	}
	still := map[statestore.Key]bool{}
	for _, r := range after {
		still[r.Key] = true
	}
	for _, r := range before {
		if !still[r.Key] {
			fmt.Fprintf(e.stdout, "reaped %s of pid %d (%s)%s\n", r.Key, r.Owner.PID, shown(r.Owner.Name, maxNameWidth), labelSuffix(r.Label))
		}
	}
	fmt.Fprintf(e.stdout, "reaped %d reservations\n", n)
	return nil
}

func labelSuffix(l string) string {
	if l == "" {
		return ""
	}
	return " label " + shown(l, maxLabelWidth)
}

// writeJSON writes v as indented JSON, with every character a terminal
// would act on escaped (see jsonSafe).
func writeJSON(e *env, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(append(jsonSafe(b), '\n'))
	return err
}

// rowJSON is one reservation as ls prints it with --json.
type rowJSON struct {
	Protocol  string `json:"protocol"`
	Address   string `json:"address"`
	Port      uint16 `json:"port"`
	Label     string `json:"label"`
	Kind      string `json:"kind"`
	OwnerPID  int    `json:"owner_pid"`
	OwnerName string `json:"owner_name"`
	// OwnerStart is when the owner started by the wall clock as it reads
	// now, for people; absent when it cannot be told (another boot).
	OwnerStart *time.Time `json:"owner_start,omitempty"`
	// OwnerStartKernel is the start as the kernel records it, the value
	// berth compares (on Linux clock ticks since boot).
	OwnerStartKernel int64     `json:"owner_start_kernel"`
	Created          time.Time `json:"created"`
	Alive            bool      `json:"alive"`
}

func runLs(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return usagef("ls takes no arguments (filter with --port, --label, --owner-pid)")
	}
	var f statestore.Filter
	if flagPort != "" {
		p, err := parsePort("--port", flagPort)
		if err != nil {
			return err
		}
		f.Port = p
	}
	f.Label, f.OwnerPID = flagLabel, flagOwnerPID
	var rows []statestore.Reservation
	s, err := openStore(ctx, e)
	if err != nil {
		return err
	}
	if s != nil {
		defer func() { _ = s.Close() }()
		if rows, err = s.List(ctx, f); err != nil {
			return err
		}
	}
	if flagJSON {
		out := make([]rowJSON, 0, len(rows))
		for _, r := range rows {
			var started *time.Time
			if at, ok := r.Owner.StartedAt(); ok {
				at = at.UTC()
				started = &at
			}
			out = append(out, rowJSON{string(r.Protocol), r.Addr.String(), r.Port, r.Label, string(r.Kind),
				r.Owner.PID, r.Owner.Name, started, r.Owner.Start, r.Created.UTC(), r.Owner.Alive(ctx)})
		}
		return writeJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tADDRESS\tPORT\tLABEL\tKIND\tPID\tPROCESS\tAGE\tALIVE")
	now := time.Now()
	for _, r := range rows {
		alive := "yes"
		if !r.Owner.Alive(ctx) {
			alive = colour(e.stdout, "31", "dead")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Protocol, r.Addr, r.Port, dash(shown(r.Label, maxLabelWidth)), r.Kind,
			r.Owner.PID, dash(shown(r.Owner.Name, maxNameWidth)), age(now.Sub(r.Created)), alive)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age prints a duration the way ps does: the largest whole unit. A row
// created "in the future" (the wall clock was stepped back since) shows 0s:
// created_at is a wall-clock time, which steps move.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func runDoctor(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return usagef("doctor takes no arguments")
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	// Values come from paths, the environment and error messages, which
	// can hold anything: they are printed escaped.
	line := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, printable(fmt.Sprintf(format, a...))) }

	if fi, err := os.Stat(e.cfg.StateDir); err == nil {
		line("state directory", "%s (mode %04o)", e.cfg.StateDir, fi.Mode().Perm())
	} else {
		line("state directory", "%s (%v)", e.cfg.StateDir, err)
	}
	a, err := portalloc.New(ctx, e.cfg)
	if err != nil {
		line("mode", "%s: cannot serve: %v", modeOf(e.cfg), err)
		if errors.Is(err, statestore.ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
			line("to fix", "another process keeps the state store locked; berth waits for it (up to --timeout, now %v) rather than fall back. Stop or wait for that process", e.cfg.Timeout)
		}
		_ = tw.Flush()
		return err
	}
	defer func() { _ = a.Close() }()
	cfg := a.Config()
	switch cause := a.FallbackCause(); {
	case cfg.Mode == portalloc.ModeMRU:
		line("mode", "mru: the MRU file %s, as configured", filepath.Join(cfg.StateDir, portalloc.MRUFile))
	case cause != nil:
		line("mode", "%s: serving from the MRU file because the state store failed: %v", cfg.Mode, cause)
		if held, err := statestore.ReadHeld(ctx, dbPath(e)); err != nil {
			line("fallback", "ports from the MRU file are only remembered, not reserved, and the database cannot be read either (%v): the MRU file serves blind and may hand out ports other processes have reserved", err)
		} else {
			line("fallback", "ports from the MRU file are only remembered, not reserved; the database can still be read, so the %d reservations in it are skipped", held.Len())
		}
		line("to fix", "%s; berth goes back to the store by itself once it works. --strict or BERTH_MODE=statestore makes a fallback an error", fallbackAdvice(cause, dbPath(e)))
	default:
		line("mode", "%s: serving from the state store", cfg.Mode)
	}
	if a.Backend() == portalloc.BackendStateStore {
		line("database", "%s (schema version %d)", dbPath(e), statestore.SchemaVersion)
	}
	u, err := a.Usage(ctx)
	if err != nil {
		return err
	}
	line("range", "%s: %d ports, %d can be handed out", cfg.Range, cfg.Range.Size(), u.Ports)
	if len(cfg.Exclude) > 0 {
		line("excluded", "%v", cfg.Exclude)
	}
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
	if a.Backend() == portalloc.BackendStateStore {
		s, err := openStore(ctx, e)
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

func modeOf(cfg portalloc.Config) portalloc.Mode {
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
