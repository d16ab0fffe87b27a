package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/transient"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

const ownerHelp = `the process the ports belong to: "parent" (the default: the shell or script that ran berth, through any subshell a pipeline forked; make for a recipe line) or a PID`

// ownerFlags are --owner and its older, hidden spelling --owner-pid.
type ownerFlags struct {
	owner string
	pidV1 int
}

func (o *ownerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.owner, "owner", "parent", ownerHelp)
	cmd.Flags().IntVar(&o.pidV1, "owner-pid", 0, "the older spelling of --owner PID")
	_ = cmd.Flags().MarkHidden("owner-pid")
}

// resolve returns the running process --owner (or --owner-pid) names.
func (o *ownerFlags) resolve(ctx context.Context, cmd *cobra.Command) (store.Owner, error) {
	pid, err := strconv.Atoi(o.owner)
	switch {
	case cmd.Flags().Changed("owner-pid") && cmd.Flags().Changed("owner"):
		return store.Owner{}, usagef("--owner-pid with --owner: give --owner PID only")
	case cmd.Flags().Changed("owner-pid"):
		if o.pidV1 <= 0 {
			return store.Owner{}, usagef("--owner-pid %d: want a process id above 0", o.pidV1)
		}
		pid = o.pidV1
	case o.owner == "parent":
		pid = defaultOwner(ctx, cmd) // berth's parent, or the process it stands for: see ancestry.go
	case err != nil || pid <= 0:
		return store.Owner{}, usagef("--owner %q: want \"parent\" or a process id above 0", o.owner)
	}
	return lookupOwner(ctx, "--owner", pid)
}

// grantFlags are the flags of get and reserve.
type grantFlags struct {
	holderFlags
	ownerFlags
	udp, json, sticky bool
	allowRes          bool // --allow-reserved
	addr, label       string
	order             string
	count, block      int
	prefer            []uint
}

func (f *grantFlags) add(cmd *cobra.Command, allocate bool) {
	fs := cmd.Flags()
	fs.BoolVar(&f.udp, "udp", false, "UDP instead of TCP")
	fs.StringVar(&f.addr, "addr", "127.0.0.1", "address the port is for; 0.0.0.0 and :: are the wildcards")
	fs.StringVar(&f.label, "label", "", "a name for the port, shown by ls and used by release and transfer")
	fs.BoolVar(&f.json, "json", false, "print JSON")
	f.ownerFlags.add(cmd)
	f.holderFlags.add(cmd, true)
	fs.BoolVar(&f.allowRes, "allow-reserved", false, "take a port of net.ipv4.ip_local_reserved_ports, which the administrator keeps for other software, when it is named (reserve PORT, --prefer)")
	if allocate {
		fs.IntVar(&f.count, "count", 1, "how many ports, one per line")
		fs.IntVar(&f.block, "block", 0, "a contiguous block of this many ports: BASE to BASE+N-1, all reserved; prints BASE")
		fs.UintSliceVar(&f.prefer, "prefer", nil, "ports to try first, in order, comma-separated (3000,3001); then the range")
		fs.StringVar(&f.order, "order", "", "how to go through the range: random (the default) or lowest (lowest free port first)")
		fs.BoolVar(&f.sticky, "sticky", false, "the port this --label had last time (in this --scope), when it is free; needs --label")
	}
}

// lookupOwner returns the running process pid, named flag in errors.
func lookupOwner(ctx context.Context, flag string, pid int) (store.Owner, error) {
	o, err := store.LookupOwner(ctx, pid)
	if no, ok := transient.Errno(err); ok {
		// Out of descriptors, say: the process may well run, so not a
		// usage error.
		var cause error = no
		var pe *os.PathError
		if errors.As(err, &pe) {
			cause = pe
		}
		return store.Owner{}, fmt.Errorf("%s %d: cannot look the process up: %w", flag, pid, transient.As(no, cause))
	}
	if err != nil {
		return store.Owner{}, usagef("%s %d: not a running process", flag, pid)
	}
	return o, nil
}

func parseAddr(s string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, usagef("--addr %q: want an IP address such as 127.0.0.1, ::1, 0.0.0.0 or ::", s)
	case addr.Zone() != "":
		return netip.Addr{}, usagef("--addr %q: want an address without a %%zone; berth does not support zoned IPv6 addresses", s)
	}
	return addr, nil
}

func (f *grantFlags) request() (portalloc.Request, error) {
	addr, err := parseAddr(f.addr)
	if err != nil {
		return portalloc.Request{}, err
	}
	req := portalloc.Request{Protocol: protocol(f.udp), Addr: addr, Label: f.label, Sticky: f.sticky, AllowOSReserved: f.allowRes}
	if len(f.prefer) > portalloc.MaxPrefer {
		return portalloc.Request{}, usagef("--prefer lists %d ports: want at most %d", len(f.prefer), portalloc.MaxPrefer)
	}
	for _, p := range f.prefer {
		if p == 0 || p > 65535 {
			return portalloc.Request{}, usagef("--prefer %d: want ports from 1 to 65535", p)
		}
		req.Prefer = append(req.Prefer, uint16(p))
	}
	switch o := portalloc.Order(f.order); o {
	case "", portalloc.OrderRandom, portalloc.OrderLowest:
		req.Order = o
	default:
		return portalloc.Request{}, usagef("--order %q: want %q or %q", f.order, portalloc.OrderRandom, portalloc.OrderLowest)
	}
	return req, nil
}

func protocol(udp bool) store.Protocol {
	if udp {
		return store.UDP
	}
	return store.TCP
}

// portJSON is one port as get and reserve print it with --json.
type portJSON struct {
	Protocol string     `json:"protocol"`
	Address  string     `json:"address"`
	Port     uint16     `json:"port"`
	Label    string     `json:"label,omitempty"`
	OwnerPID *int       `json:"owner_pid,omitempty"`
	Holder   string     `json:"holder,omitempty"`
	Expires  *time.Time `json:"expires,omitempty"`
}

// printPorts prints the ports of own, or of their holder when own is zero.
func (a *app) printPorts(asJSON bool, rs []store.Reservation, own store.Owner) error {
	if !asJSON {
		for _, r := range rs {
			fmt.Fprintln(a.stdout, r.Port)
		}
		return nil
	}
	out := make([]portJSON, len(rs))
	for i, r := range rs {
		label, _ := unscoped(r.Label, a.cfg.Scope)
		out[i] = portJSON{Protocol: string(r.Protocol), Address: r.Addr.String(), Port: r.Port, Label: label, OwnerPID: &own.PID}
		if own.PID == 0 {
			at := r.Expires.UTC().Round(time.Second)
			out[i].OwnerPID, out[i].Holder, out[i].Expires = nil, r.Owner.Holder, &at
		}
	}
	return a.writeJSON(out)
}

// fallbackHint follows the Allocator's warning when the MRU file handed
// out ports: what that means and what to do. Call it before al closes.
func (a *app) fallbackHint(al *portalloc.Allocator, rs []store.Reservation) {
	if st := al.Stats(); st.Fallback == "" || len(rs) == 0 {
		return // the store served, or the call failed: its error says why
	}
	fmt.Fprintf(a.stderr, "%s: warning: the ports came from the MRU file: they are locked for their owner, so no berth process is given them, but no store records them (berth ls shows them without a label). Run 'berth doctor' for the cause and what to do; --strict (or BERTH_MODE=statestore) makes this an error.\n", a.name)
}

// grant is get (port 0) and reserve PORT: ports for --owner, all of them
// or none, or with --holder for a named holder under a lease.
func (a *app) grant(ctx context.Context, cmd *cobra.Command, f *grantFlags, port uint16) error {
	holder := f.set(cmd)
	if holder {
		if err := f.check(cmd); err != nil {
			return err
		}
		if cmd.Flags().Changed("block") {
			return usagef("--block with --holder: a holder gets ports one by one; use --count")
		}
	} else if cmd.Flags().Changed("ttl") {
		return usagef("--ttl without --holder: only a holder's ports have a lease; a process's last as long as it runs")
	}
	req, err := f.request()
	if err != nil {
		return err
	}
	var (
		own store.Owner // zero for a holder
		al  *portalloc.Allocator
	)
	if holder {
		req.Holder, req.TTL = f.holder, f.ttl
		al, err = a.strictAllocator(ctx)
	} else if own, err = f.resolve(ctx, cmd); err == nil {
		al, err = fleet.New(ctx, a.cfg)
	}
	if err != nil {
		return err
	}
	defer func() { _ = al.Close() }() // releases a process's ports not handed over; a holder's stay
	var rs []store.Reservation
	defer func() { a.fallbackHint(al, rs) }()
	switch {
	case port != 0:
		r, err := al.Reserve(ctx, req, port)
		var ce *store.ConflictError
		if !holder && errors.As(err, &ce) && ce.Holder.Owner.PID == own.PID && ce.Holder.Addr == req.Addr.Unmap() {
			// The owner holds exactly this already: reserving again is a no-op.
			return a.printPorts(f.json, []store.Reservation{ce.Holder}, own)
		}
		if !holder && errors.As(err, &ce) && ce.Holder.Owner.PID == os.Getppid() {
			return fmt.Errorf("%w; it is held by the shell that ran berth: to give it to pid %d, run 'berth transfer %d --to %d'", err, own.PID, port, own.PID)
		}
		if err != nil {
			return err
		}
		rs = append(rs, r)
	case f.block > 0:
		if rs, err = al.AllocateBlock(ctx, req, f.block); err != nil {
			return err
		}
	default:
		for range f.count {
			r, err := al.Allocate(ctx, req)
			if err != nil {
				for _, r := range rs {
					if holder { // Close gives back a process's ports, not a holder's
						_ = al.Release(context.WithoutCancel(ctx), r)
					}
				}
				return err
			}
			rs = append(rs, r)
		}
	}
	for i := 0; i < len(rs) && !holder; i++ {
		if err := al.Transfer(ctx, rs[i], own.PID); err != nil { // the row, and its lock to own's keeper
			return err
		}
	}
	if f.block > 0 && !f.json {
		rs = rs[:1]
	}
	return a.printPorts(f.json, rs, own)
}

func (a *app) getCmd() *cobra.Command {
	var f grantFlags
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Allocate free ports and print them, one per line",
		Long: `Allocate free ports and print them, one per line. They belong to --owner,
by default the shell that ran berth: reserved while it runs, reaped after it
exits. With --block N, berth reserves N contiguous ports and prints the first.

In a script, P=$(berth get) and P=$(berth get | head -1) give the port to the
script's shell. A port taken in a Makefile recipe belongs to make, which exits
at the end of the build, and berth warns. 'berth run' avoids the question.`,
		Example: `  PORT=$(berth get --label web)
  berth get --count 3 --udp
  berth get --prefer 3000,3001 --label dev-server
  BASE=$(berth get --block 3)   # BASE, BASE+1 and BASE+2
  PORT=$(berth get --scope git --label web --sticky)   # this checkout's web port, as last time`,
		Args: noArgs("get", "did you mean 'berth reserve PORT'?"),
	}
	f.add(cmd, true)
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		switch {
		case f.count < 1:
			return usagef("--count %d: want 1 or more", f.count)
		case cmd.Flags().Changed("block") && (f.block < 1 || f.block > store.MaxBlock):
			return usagef("--block %d: want 1 to %d", f.block, store.MaxBlock)
		case cmd.Flags().Changed("block") && cmd.Flags().Changed("count"):
			return usagef("--block with --count: give one of them")
		case f.sticky && f.label == "":
			return usagef("--sticky needs --label: a sticky port is remembered under its label")
		case f.sticky && (f.count > 1 || f.block > 0):
			return usagef("--sticky with --count or --block: a label remembers one port; give each port a --label of its own")
		}
		return a.grant(ctx, cmd, &f, 0)
	})
	return cmd
}

func (a *app) reserveCmd() *cobra.Command {
	var f grantFlags
	cmd := &cobra.Command{
		Use:   "reserve PORT",
		Short: "Reserve a given port; exit 3 if another process holds it",
		Long: `Reserve a given port for --owner, by default the shell that ran berth. If
another live process holds it, berth says which and exits 3. Reserving a port
the owner holds already is not an error.`,
		Example: `  berth reserve 8080 --label api || echo "8080 is taken"`,
		Args:    exactArgs(1, "PORT"),
	}
	f.add(cmd, false)
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		port, err := parsePort("port", args[0])
		if err != nil {
			return err
		}
		return a.grant(ctx, cmd, &f, port)
	})
	return cmd
}

// selectFlags pick the ports of one owner that release and transfer act on.
type selectFlags struct {
	ownerFlags
	holder holderFlags // release only
	label  string
	all    bool
}

func (f *selectFlags) add(cmd *cobra.Command, verb string) {
	cmd.Flags().StringVar(&f.label, "label", "", verb+" the owner's ports with this label")
	cmd.Flags().BoolVar(&f.all, "all", false, verb+" every port of the owner")
	f.ownerFlags.add(cmd)
}

// port returns the PORT of args (0 without one), refusing --all with PORT
// or --label, and missing (unless nil) when none of them is given.
func (f *selectFlags) port(args []string, missing error) (uint16, error) {
	var port uint16
	switch {
	case len(args) == 1:
		p, err := parsePort("port", args[0])
		if err != nil {
			return 0, err
		}
		port = p
	case f.label == "" && !f.all && missing != nil:
		return 0, missing
	}
	if f.all && (port != 0 || f.label != "") {
		return 0, usagef("--all with a PORT or --label: give one of them")
	}
	return port, nil
}

// selectRows returns the store (nil when there is none yet), the owner's
// rows that PORT (args), --label or --all select, and the owner.
func (a *app) selectRows(ctx context.Context, cmd *cobra.Command, f *selectFlags, args []string) (store.Store, []store.Reservation, store.Owner, error) {
	var missing error
	if !cmd.Flags().Changed("owner") && !cmd.Flags().Changed("owner-pid") { // --owner alone names every port of that owner
		missing = usagef("give a PORT, --label, --all, or --owner PID for every port of PID")
	}
	port, err := f.port(args, missing)
	if err != nil {
		return nil, nil, store.Owner{}, err
	}
	own, err := f.resolve(ctx, cmd)
	if err != nil {
		return nil, nil, store.Owner{}, err
	}
	s, err := a.openStore(ctx)
	if err != nil || s == nil {
		return nil, nil, own, err
	}
	rows, err := s.List(ctx, store.Filter{Port: port, Label: scopedLabel(a.cfg.Scope, f.label), OwnerPID: own.PID})
	if err != nil {
		_ = s.Close()
		return nil, nil, own, err
	}
	mine := rows[:0]
	for _, r := range rows {
		_, in := unscoped(r.Label, a.cfg.Scope)
		// Not the pid's earlier process (that is for reap); with --all
		// --scope, the scope's ports only.
		if r.Owner.Same(own) && (in || !f.all || !a.scopeGiven) {
			mine = append(mine, r)
		}
	}
	return s, mine, own, nil
}

func (a *app) releaseCmd() *cobra.Command {
	var f selectFlags
	cmd := &cobra.Command{
		Use:   "release [PORT]",
		Short: "Release ports of the calling shell (or --owner): a PORT, those with --label, or --all",
		Long: `Release ports of --owner, by default the shell that ran berth: the given PORT
(every protocol and address the owner holds it for), those labelled --label,
or with --all every port the owner holds; --all --scope S only the ports
labelled in scope S. A port the MRU file handed out, which no store records,
is released by its PORT too. Ports of exited processes need no
release: berth reaps them.`,
		Example: `  berth release 8080
  berth release --label web
  berth release --all --owner 4242
  berth release --all --scope git   # the ports of this checkout's labels`,
		Args: maxArgs(1, "PORT"),
	}
	f.add(cmd, "release")
	f.holder.add(cmd, false)
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		if f.holder.set(cmd) {
			return a.releaseLeased(ctx, cmd, &f, args)
		}
		s, rows, own, err := a.selectRows(ctx, cmd, &f, args)
		switch {
		case a.storeDown(err) && len(args) == 1:
			// What the MRU file handed out has a lock and no row: PORT
			// names it without the store.
			printErr(a.stderr, a.name+": warning: ", err, "; releasing the owner's locks of the port alone, the MRU file's ports among them")
		case a.storeDown(err):
			return fmt.Errorf("%w; while it cannot be read, only a PORT the MRU file handed out can be released: 'berth release PORT'", err)
		case err != nil:
			return err
		case s != nil:
			defer func() { _ = s.Close() }()
		}
		keeper, _ := portlock.ProcessKeeper(own.PID)
		released := map[store.Key]bool{}
		for _, r := range rows {
			if err := s.Release(ctx, r.Key, own); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if _, err := keeper.Drop(string(r.Protocol), r.Addr, r.Port); err != nil {
				fmt.Fprintf(a.stderr, "%s: warning: %s: its lock stays with the keeper of pid %d until that process exits: %v\n", a.name, r.Key, own.PID, err)
			}
			released[r.Key] = true
			fmt.Fprintf(a.stdout, "released %s\n", r.Key)
		}
		// A port the MRU file handed out has a lock and no row: the
		// owner's keeper lets go of it when it is named. Not for --all: the
		// keeper holds the owner's locks of every store.
		if len(args) == 1 {
			port, _ := parsePort("port", args[0]) // selectRows has checked it
			for _, k := range keeperLocks(keeper, port, released) {
				fmt.Fprintf(a.stdout, "released %s\n", k)
				released[k] = true
			}
		}
		if len(released) == 0 {
			fmt.Fprintf(a.stderr, "%s: nothing to release for pid %d\n", a.name, own.PID)
		}
		return nil
	})
	return cmd
}

// keeperLocks has keeper let go of the locks it holds of port that are not
// in skip, and returns their keys.
func keeperLocks(keeper portlock.Keeper, port uint16, skip map[store.Key]bool) []store.Key {
	held, err := portlock.List()
	if err != nil {
		return nil
	}
	var out []store.Key
	for _, l := range held {
		if l.Port != port {
			continue
		}
		addr := l.Addr
		if !addr.IsValid() {
			addr = netip.IPv4Unspecified() // a wildcard lock
		}
		k := store.Key{Protocol: store.Protocol(l.Network), Addr: addr, Port: l.Port}
		if skip[k] {
			continue
		}
		if ok, err := keeper.Drop(l.Network, addr, l.Port); err == nil && ok {
			out = append(out, k)
		}
	}
	return out
}

func (a *app) transferCmd() *cobra.Command {
	var (
		f  selectFlags
		to int
	)
	cmd := &cobra.Command{
		Use:   "transfer PORT|--label L|--all --to PID",
		Short: "Hand ports of the calling shell (or --owner) to another running process",
		Long: `Hand ports of --owner, by default the shell that ran berth, to the running
process --to: from then on they stay reserved exactly as long as that process
runs. This is how a script gives a daemon it has just started the port it
allocated for it.`,
		Example: `  PORT=$(berth get --label api)
  ./api-server --port "$PORT" &
  berth transfer "$PORT" --to $!`,
		Args: maxArgs(1, "PORT"),
	}
	f.add(cmd, "hand over")
	cmd.Flags().IntVar(&to, "to", 0, "the running process that gets the ports")
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		if to <= 0 {
			return usagef("--to %d: want the process id of a running process", to)
		}
		dest, err := lookupOwner(ctx, "--to", to)
		if err != nil {
			return err
		}
		s, rows, own, err := a.selectRows(ctx, cmd, &f, args)
		if err != nil {
			return err
		}
		if s != nil {
			defer func() { _ = s.Close() }()
		}
		if len(rows) == 0 {
			return fmt.Errorf("%w: pid %d holds no port that matches; 'berth ls --owner %d' lists what it holds", store.ErrNotFound, own.PID, own.PID)
		}
		for _, r := range rows {
			if err := s.Transfer(ctx, r.Key, own, dest); err != nil {
				return err
			}
			a.moveLock(r.Key, own.PID, dest.PID)
			fmt.Fprintf(a.stdout, "transferred %s to pid %d\n", r.Key, dest.PID)
		}
		return nil
	})
	return cmd
}

func parsePort(what, s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, usagef("%s %q: want a number from 1 to 65535", what, s)
	}
	return uint16(n), nil
}

// databaseFile is the state store's file in the state directory.
const databaseFile = "berth.db"

func (a *app) dbPath() string { return filepath.Join(a.cfg.StateDir, databaseFile) }

// openStore opens the fleet's store of --store, else the SQLite file of
// the state directory (nil, no error, when there is none yet); waits for
// a locked store end with --timeout.
func (a *app) openStore(ctx context.Context) (store.Store, error) {
	if a.cfg.StoreDSN != "" {
		return a.fleetStore(ctx)
	}
	if _, err := os.Stat(a.dbPath()); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	s, err := statestore.Open(ctx, a.dbPath(), statestore.Options{Logger: a.cfg.Logger, BusyTimeout: a.cfg.Timeout, SweepInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return s, nil
}

// listRows returns the rows of the store that match flt: none when there
// is no store yet.
func (a *app) listRows(ctx context.Context, flt store.Filter) ([]store.Reservation, error) {
	s, err := a.openStore(ctx)
	if err != nil || s == nil {
		return nil, err
	}
	defer func() { _ = s.Close() }()
	return s.List(ctx, flt)
}

// storeDown reports whether err, of openStore, is a store the fallback mode
// serves through from the MRU file (damaged, of a newer schema,
// unreadable): then ls and release have the kernel locks to go by. A busy
// store, a shortage or an unsafe directory is never that.
func (a *app) storeDown(err error) bool {
	return errors.Is(err, store.ErrUnavailable) && modeOf(a.cfg) != portalloc.ModeStateStore && !errors.Is(err, store.ErrBusy) &&
		!errors.Is(err, context.DeadlineExceeded) && !transient.Is(err) && !errors.Is(err, store.ErrUnsafe)
}

// moveLock hands the lock of key from the keeper of process from to that
// of process to, never free on the way. Without a keeper (not on Linux,
// or from holds no lock of it) the row alone keeps the port.
func (a *app) moveLock(key store.Key, from, to int) {
	fk, err := portlock.ProcessKeeper(from)
	if err != nil {
		return
	}
	lk, err := fk.Take(string(key.Protocol), key.Addr, key.Port)
	if err != nil || lk == nil {
		return
	}
	defer func() { _ = lk.Close() }()
	tk, err := portlock.ProcessKeeper(to)
	if err == nil && !lk.HeldBy(to) {
		err = tk.Hold(0, lk)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "%s: warning: %s: its lock could not follow it to pid %d (%v); its row keeps it from berth processes of this store\n", a.name, key, to, err)
	}
}

// noArgs accepts no positional arguments; hint follows the error.
func noArgs(name, hint string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		q := make([]string, len(args))
		for i, s := range args {
			q[i] = strconv.Quote(s)
		}
		msg := fmt.Sprintf("%s takes no arguments, got %s", name, strings.Join(q, " "))
		if hint != "" {
			msg += " (" + hint + ")"
		}
		return &usageError{msg}
	}
}

// exactArgs accepts exactly n positional arguments, named what; maxArgs at
// most n.
func exactArgs(n int, what string) cobra.PositionalArgs { return nArgs(n, n, what) }
func maxArgs(n int, what string) cobra.PositionalArgs   { return nArgs(0, n, what) }

func nArgs(least, most int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case least == most && len(args) != most:
			return usagef("%s takes %s, got %d arguments", cmd.Name(), what, len(args))
		case len(args) > most:
			return usagef("%s takes at most %d %s, got %d arguments", cmd.Name(), most, what, len(args))
		}
		return nil
	}
}
