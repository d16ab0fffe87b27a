package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/store"
)

const (
	maxArgsWidth = 160             // characters who shows of a command line
	killWait     = 5 * time.Second // how long who --kill waits for the processes it signalled to exit, within --timeout
)

func (a *app) whoCmd() *cobra.Command {
	var (
		asJSON bool
		kill   string // the signal of --kill; "" without it
	)
	cmd := &cobra.Command{
		Use:   "who PORT[/tcp|/udp]...",
		Short: "Show who holds a port: berth's reservation and every process bound to it",
		Long: `For each PORT, show berth's reservations of it (owner, label, alive), the
kernel locks berth processes hold for it (a reservation's, or one no row of
this store stands for: a test helper's, another store's or user's berth),
and every socket the system shows bound to it, berth's or not: listening,
unconnected (UDP) or connected, with the pid, user, name and command line of
each process that holds it (a keeper, which holds the locks of an owner that
runs no berth code, names that owner in its command line). PORT/tcp or
PORT/udp shows one protocol only.

Only Linux tells which process binds a port (/proc/net and /proc/PID/fd);
elsewhere berth who shows its reservations and says that the system cannot
tell the rest. A process that is not root cannot see another user's
descriptors: such a socket is shown with its user, without a process.

--kill signals the processes that hold the ports (TERM, or --kill=SIGNAL),
those the caller may signal only: never another user's process unless berth
runs as root. It says what it did, then waits up to 5s for them to exit; it
fails (exit 1) when it could not signal one, or one still runs.`,
		Example: `  berth who 3000
  berth who --json 3000 5432/tcp
  berth who --kill 3000          # SIGTERM whatever holds port 3000
  berth who --kill=KILL 3000`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("who needs a PORT: berth who PORT...")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&kill, "kill", "", "signal the processes bound to the ports: TERM, or --kill=SIGNAL (name or number)")
	cmd.Flags().Lookup("kill").NoOptDefVal = "TERM"
	cmd.RunE = a.action(func(ctx context.Context, args []string) error {
		var (
			ports []whoPort // each PORT as asked, once
			nums  []uint16
			sig   syscall.Signal
			err   error
		)
		for _, s := range args {
			p, err := parseWhoPort(s)
			if err != nil {
				return err
			}
			if !slices.Contains(ports, p) {
				ports, nums = append(ports, p), append(nums, p.port)
			}
		}
		if kill != "" {
			if sig, err = parseSignal(kill); err != nil {
				return err
			}
		}
		// A store that cannot be read leaves the system's side to show: that is what
		// someone asking who holds a port needs most.
		var storeErr error // why berth's reservations are not shown
		s, err := a.openStore(ctx)
		if err != nil {
			printErr(a.stderr, a.name+": ", err, "; showing the sockets alone")
			s, storeErr = nil, err
		}
		if s != nil {
			defer func() { _ = s.Close() }()
		}
		reports, err := who.Lookup(ctx, s, nums...)
		if err != nil && s != nil && ctx.Err() == nil {
			printErr(a.stderr, a.name+": ", err, "; showing the sockets alone")
			storeErr = err
			reports, err = who.Lookup(ctx, nil, nums...)
		}
		if err != nil {
			return err
		}
		byPort := map[uint16]who.Report{}
		for _, r := range reports {
			byPort[r.Port] = r
		}
		shownReports := make([]who.Report, len(ports))
		for i, p := range ports {
			shownReports[i] = narrow(byPort[p.port], p.proto)
		}
		out := a.stdout
		if asJSON {
			err, out = a.writeJSON(whoJSONOf(shownReports, ports, storeErr)), a.stderr // --kill's words: the JSON stays JSON
		} else {
			err = a.printWho(shownReports, ports, storeErr)
		}
		if err != nil || kill == "" {
			return err
		}
		return killHolders(ctx, out, shownReports, sig)
	})
	return cmd
}

// whoPort is one PORT argument: a port, and a protocol or "" for both.
type whoPort struct {
	port  uint16
	proto store.Protocol
}

// parseWhoPort parses PORT, PORT/tcp or PORT/udp.
func parseWhoPort(s string) (whoPort, error) {
	num, proto, hasProto := strings.Cut(s, "/")
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return whoPort{}, usagef("PORT %q: want a port number from 1 to 65535, optionally with /tcp or /udp", s)
	}
	p := whoPort{port: uint16(n)}
	switch {
	case !hasProto:
	case proto == "tcp", proto == "udp":
		p.proto = store.Protocol(proto)
	default:
		return whoPort{}, usagef("PORT %q: want /tcp or /udp after the port, not /%s", s, proto)
	}
	return p, nil
}

// parseSignal parses --kill: a name, with or without SIG, or a number.
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, usagef("--kill %q: want a signal number from 1 to 64, or a name such as TERM, INT, HUP or KILL", s)
		}
		return syscall.Signal(n), nil
	}
	if sig, ok := signalByName("SIG" + strings.TrimPrefix(strings.ToUpper(s), "SIG")); ok {
		return sig, nil
	}
	return 0, usagef("--kill %q: want a signal name such as TERM, INT, HUP or KILL (%s), or its number", s, strings.Join(signalNames(), ", "))
}

// who's JSON.
type (
	whoJSON struct {
		Port         uint16       `json:"port"`
		Protocol     string       `json:"protocol,omitempty"` // the PORT/PROTO asked for
		Reservations []whoResJSON `json:"reservations"`
		// ReservationsUnknown says why berth's store could not be read.
		ReservationsUnknown string          `json:"reservations_unknown,omitempty"`
		Sockets             []whoSocketJSON `json:"sockets"`
		// SocketsUnknown says why the system could not tell the sockets.
		SocketsUnknown string `json:"sockets_unknown,omitempty"`
		// Locks are the kernel locks berth processes hold for the port.
		Locks []whoLockJSON `json:"locks"`
	}
	whoLockJSON struct {
		Protocol  string        `json:"protocol"`
		Address   string        `json:"address"` // "*" for a wildcard lock
		Processes []whoProcJSON `json:"processes"`
	}
	whoResJSON struct {
		Protocol  string `json:"protocol"`
		Address   string `json:"address"`
		Label     string `json:"label"`
		Kind      string `json:"kind"`
		OwnerPID  int    `json:"owner_pid"`
		OwnerName string `json:"owner_name"`
		Holder    string `json:"holder,omitempty"`
		Alive     bool   `json:"alive"`
	}
	whoSocketJSON struct {
		Protocol  string        `json:"protocol"`
		Local     string        `json:"local"`
		Remote    string        `json:"remote,omitempty"`
		State     string        `json:"state"`
		UID       int           `json:"uid"`
		User      string        `json:"user"`
		Processes []whoProcJSON `json:"processes"`
	}
	whoProcJSON struct {
		PID  int      `json:"pid"`
		UID  int      `json:"uid"`
		User string   `json:"user"`
		Name string   `json:"name"`
		Args []string `json:"args"`
	}
)

// narrow keeps r's reservations, sockets and locks of proto ("": all).
func narrow(r who.Report, proto store.Protocol) who.Report {
	if proto != "" {
		r.Reservations = slices.DeleteFunc(slices.Clone(r.Reservations), func(x who.Reservation) bool { return x.Protocol != proto })
		r.Sockets = slices.DeleteFunc(slices.Clone(r.Sockets), func(x who.Socket) bool { return x.Protocol != proto })
		r.Locks = slices.DeleteFunc(slices.Clone(r.Locks), func(x who.Lock) bool { return x.Protocol != proto })
	}
	return r
}

func whoJSONOf(reports []who.Report, ports []whoPort, storeErr error) []whoJSON {
	procs := func(ps []who.Process) []whoProcJSON {
		out := make([]whoProcJSON, len(ps))
		for i, p := range ps {
			out[i] = whoProcJSON(p)
		}
		return out
	}
	out := make([]whoJSON, 0, len(reports))
	for i, r := range reports {
		j := whoJSON{Port: r.Port, Protocol: string(ports[i].proto), Reservations: []whoResJSON{}, Sockets: []whoSocketJSON{}, Locks: []whoLockJSON{}}
		for _, x := range r.Reservations {
			j.Reservations = append(j.Reservations, whoResJSON{string(x.Protocol), x.Addr.String(), x.Label, string(x.Kind), x.Owner.PID, x.Owner.Name, x.Owner.Holder, x.Alive})
		}
		for _, s := range r.Sockets {
			sj := whoSocketJSON{Protocol: string(s.Protocol), Local: s.Local.String(), State: s.State, UID: s.UID, User: s.User, Processes: procs(s.Processes)}
			if s.Remote.IsValid() {
				sj.Remote = s.Remote.String()
			}
			j.Sockets = append(j.Sockets, sj)
		}
		for _, l := range r.Locks {
			j.Locks = append(j.Locks, whoLockJSON{Protocol: string(l.Protocol), Address: lockAddr(l.Addr), Processes: procs(l.Processes)})
		}
		if r.SocketsErr != nil {
			j.SocketsUnknown = r.SocketsErr.Error()
		}
		if storeErr != nil {
			j.ReservationsUnknown = storeErr.Error()
		}
		out = append(out, j)
	}
	return out
}

// printWho prints a block per port: its reservations, locks and sockets.
func (a *app) printWho(reports []who.Report, ports []whoPort, storeErr error) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	for i, r := range reports {
		if fmt.Fprintf(tw, "port %d", r.Port); ports[i].proto != "" {
			fmt.Fprintf(tw, "/%s", ports[i].proto)
		}
		fmt.Fprintln(tw)
		for _, x := range r.Reservations {
			alive := "alive"
			if !x.Alive {
				alive = colour(a.stdout, "31", "dead (reaped when it stands in the way)")
			}
			owner := fmt.Sprintf("pid %d (%s)", x.Owner.PID, dash(shown(x.Owner.Name, maxNameWidth)))
			if x.Owner.Holder != "" {
				owner = "holder " + shown(x.Owner.Holder, maxNameWidth)
				if !x.Alive {
					alive = colour(a.stdout, "31", "lease ended")
				}
			}
			fmt.Fprintf(tw, "  reserved\t%s %s  label %s  %s  %s\n", x.Protocol, x.Addr, dash(shown(x.Label, maxLabelWidth)), owner, alive)
		}
		switch {
		case storeErr != nil:
			fmt.Fprintf(tw, "  reserved\tunknown: berth's state store could not be read\n")
		case len(r.Reservations) == 0:
			fmt.Fprintf(tw, "  reserved\tno reservation by berth\n")
		}
		for _, l := range r.Locks {
			where := fmt.Sprintf("  locked\t%s %s\theld\t", l.Protocol, lockAddr(l.Addr))
			if len(l.Processes) == 0 {
				fmt.Fprintln(tw, where+"-\t-\t-\t(its holders are hidden: they are another user's; root sees them)")
			}
			for _, p := range l.Processes {
				fmt.Fprintln(tw, where+procLine(p))
			}
		}
		if r.SocketsErr != nil {
			fmt.Fprintf(tw, "  bound\tunknown: %s\n", printable(r.SocketsErr.Error()))
			continue
		}
		if len(r.Sockets) == 0 {
			fmt.Fprintf(tw, "  bound\tno socket is bound to it\n")
		}
		for _, l := range socketLines(r.Sockets) {
			fmt.Fprintf(tw, "  bound\t%s\n", l)
		}
	}
	return tw.Flush()
}

// lockAddr is the address of a lock as who and ls show it: "*" for a wildcard, which
// locks both.
func lockAddr(a netip.Addr) string {
	if !a.IsValid() {
		return "*"
	}
	return a.String()
}

// procLine words a process that holds a socket or a lock, for who's table.
func procLine(p who.Process) string {
	return fmt.Sprintf("pid %d\t%s\t%s\t%s", p.PID, dash(shown(p.User, maxNameWidth)), dash(shown(p.Name, maxNameWidth)), shown(strings.Join(p.Args, " "), maxArgsWidth))
}

// procName names a process in who --kill's words.
func procName(p who.Process) string {
	return fmt.Sprintf("pid %d (%s)", p.PID, shown(p.Name, maxNameWidth))
}

// socketLines words sockets, a line per socket and process; connected ones of the same
// processes and address are counted on one line.
func socketLines(socks []who.Socket) []string {
	var lines []string
	count := map[string]int{}
	for _, s := range socks {
		state := s.State
		if s.Remote.IsValid() {
			state = "connected"
		}
		where := fmt.Sprintf("%s %s\t%s", s.Protocol, s.Local, state)
		var procs []string
		for _, p := range s.Processes {
			procs = append(procs, procLine(p))
		}
		if len(procs) == 0 {
			procs = []string{fmt.Sprintf("-\t%s\t-\t(its processes are hidden: they are another user's; root sees them)", dash(shown(s.User, maxNameWidth)))}
		}
		for _, p := range procs {
			l := where + "\t" + p
			if count[l] == 0 {
				lines = append(lines, l)
			}
			count[l]++
		}
	}
	for i, l := range lines {
		if n := count[l]; n > 1 {
			where, rest, _ := strings.Cut(l, "\tconnected\t")
			lines[i] = fmt.Sprintf("%s\tconnected (%d)\t%s", where, n, rest)
		}
	}
	return lines
}

// killHolders signals each process that holds the reports' sockets once, waits up to
// killWait for them to exit, and says so on w; it fails when one could not be signalled
// or still runs.
func killHolders(ctx context.Context, w io.Writer, reports []who.Report, sig syscall.Signal) error {
	var (
		procs   []who.Process
		failed  []string
		unknown bool
	)
	for _, r := range reports {
		unknown = unknown || r.SocketsErr != nil
		for _, s := range r.Sockets {
			if len(s.Processes) == 0 {
				h := fmt.Sprintf("port %d (%s %s of user %s)", r.Port, s.Protocol, s.Local, shown(s.User, maxNameWidth))
				fmt.Fprintf(w, "not signalled: the processes holding %s are another user's\n", h)
				failed = append(failed, h)
			}
			for _, p := range s.Processes {
				if !slices.ContainsFunc(procs, func(q who.Process) bool { return q.PID == p.PID }) {
					procs = append(procs, p)
				}
			}
		}
	}
	if unknown {
		fmt.Fprintf(w, "signalled nothing: this system does not tell which processes are bound to a port\n")
		return errors.New("--kill: this system does not tell which processes hold the ports")
	}
	if len(procs) == 0 && len(failed) == 0 {
		fmt.Fprintf(w, "signalled nothing: no process is bound to the ports\n")
		return nil
	}
	var sent []who.Process
	for _, p := range procs {
		what := procName(p)
		if err := who.Signal(p, sig); err != nil {
			switch {
			case errors.Is(err, os.ErrProcessDone):
				fmt.Fprintf(w, "not signalled %s: it has exited\n", what)
				continue
			case errors.Is(err, who.ErrNotPermitted):
				fmt.Fprintf(w, "not signalled %s: it belongs to user %s, and only root may signal another user's process\n", what, shown(p.User, maxNameWidth))
			default:
				fmt.Fprintf(w, "not signalled %s: %s\n", what, printable(err.Error()))
			}
			failed = append(failed, what)
			continue
		}
		fmt.Fprintf(w, "sent %s to %s\n", signalName(sig), what)
		sent = append(sent, p)
	}
	// Wait for them to go, so that a script can bind the port next.
	deadline := time.Now().Add(killWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for len(sent) > 0 && time.Now().Before(deadline) {
		sent = slices.DeleteFunc(sent, func(p who.Process) bool { return !running(p.PID) })
		if len(sent) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range sent {
		fmt.Fprintf(w, "%s still runs %v after %s; --kill=KILL ends it at once\n", procName(p), killWait.Round(time.Second), signalName(sig))
		failed = append(failed, procName(p))
	}
	if len(failed) > 0 {
		return fmt.Errorf("--kill: %d holders not stopped: %s", len(failed), strings.Join(failed, ", "))
	}
	return nil
}
