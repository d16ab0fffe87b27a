package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/internal/owner"
	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/portlock"
	"github.com/berth-go/berth/store"
)

type lsFlags struct {
	json        bool
	port, label string
	owner       int
	holder      string
	bound       bool
}

func (a *app) lsCmd() *cobra.Command {
	var f lsFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List reservations: who holds which port, and whether the holder still runs",
		Long: `List reservations: who holds which port, and whether the holder still runs.
PROCESS is the owner's program as it is now. A port locked by a process of this
host that has no row in the store (a test's port from porttest, another user's
berth, a berth of another store) is listed too, with KIND lock.

With --scope, only the reservations labelled in that scope, their labels shown
without it; otherwise every reservation, a label of a scope shown as
LABEL@SCOPE. --label names a label of the scope in effect (--scope, else
$BERTH_SCOPE).`,
		Example: "  berth ls --label api.http\n  berth ls --scope git\n  berth ls --json | jq '.[] | select(.alive == false)'",
		Args:    noArgs("ls", "filter with --port, --label, --owner"),
	}
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&f.port, "port", "", "only this port")
	cmd.Flags().StringVar(&f.label, "label", "", "only this label")
	cmd.Flags().IntVar(&f.owner, "owner", 0, "only reservations of this process id")
	cmd.Flags().IntVar(&f.owner, "owner-pid", 0, "the older spelling of --owner")
	_ = cmd.Flags().MarkHidden("owner-pid")
	cmd.Flags().StringVar(&f.holder, "holder", "", "only the ports of this named holder")
	cmd.Flags().BoolVar(&f.bound, "bound", false, "show whether each port is bound right now (BOUND: yes, no, or ? where the system cannot tell)")
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		flt := store.Filter{OwnerPID: f.owner, Label: scopedLabel(a.cfg.Scope, f.label), Holder: f.holder}
		if f.port != "" {
			p, err := parsePort("--port", f.port)
			if err != nil {
				return err
			}
			flt.Port = p
		}
		if f.owner < 0 {
			return usagef("--owner %d: want a process id above 0", f.owner)
		}
		rows, err := a.listRows(ctx, flt)
		if a.storeDown(err) {
			printErr(a.stderr, a.name+": warning: ", err, "; listing the kernel locks alone, the MRU file's ports among them")
		} else if err != nil {
			return err
		}
		if a.scopeGiven {
			rows = inScope(rows, a.cfg.Scope)
		}
		if f.holder == "" && f.label == "" && !a.scopeGiven {
			rows = append(rows, lockRows(ctx, rows, flt)...)
		}
		var bound []*bool
		if f.bound {
			if bound, err = boundRows(ctx, rows); err != nil {
				return err
			}
		}
		if f.json {
			out := make([]rowJSON, len(rows))
			for i, r := range rows {
				var started *time.Time
				if at, ok := r.Owner.StartedAt(); ok {
					at = at.UTC()
					started = &at
				}
				out[i] = rowJSON{string(r.Protocol), r.Addr.String(), r.Port, r.Label, kind(r),
					r.Owner.PID, processName(ctx, r), started, r.Owner.Start, r.Created.UTC(), r.Owner.Alive(ctx), r.Owner.Holder, nil, nil, nil}
				if r.Owner.Holder != "" {
					out[i].Alive = r.Expires.IsZero() || time.Now().Before(r.Expires)
				}
				if r.Owner.Holder != "" && !r.Expires.IsZero() {
					at := r.Expires.UTC().Round(time.Second)
					left := max(int64(time.Until(r.Expires).Round(time.Second).Seconds()), 0)
					out[i].Expires, out[i].LeaseSeconds = &at, &left
				}
				if f.bound {
					out[i].Bound = bound[i]
				}
			}
			return a.writeJSON(out)
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		boundCol := ""
		if f.bound {
			boundCol = "\tBOUND"
		}
		fmt.Fprintln(tw, "PROTO\tADDRESS\tPORT\tLABEL\tKIND\tPID\tPROCESS\tAGE\tALIVE"+boundCol)
		now := time.Now()
		for i, r := range rows {
			alive := "yes"
			if !r.Owner.Alive(ctx) {
				alive = colour(a.stdout, "31", "dead")
			}
			width := maxNameWidth
			if r.Kind == "" {
				width = maxLabelWidth // a lock's: "keeper of pid 123456" whole
			}
			pid, name := fmt.Sprint(r.Owner.PID), dash(shown(processName(ctx, r), width))
			if r.Owner.Holder != "" {
				// A holder under a lease: its name, and the time its lease has left.
				pid, name, alive = "-", "holder "+shown(r.Owner.Holder, maxNameWidth), leaseLeft(r)
				if alive == "ended" {
					alive = colour(a.stdout, "31", alive)
				}
			}
			switch {
			case !f.bound:
			case bound[i] == nil:
				alive += "\t?"
			case *bound[i]:
				alive += "\tyes"
			default:
				alive += "\tno"
			}
			created := "-"
			if !r.Created.IsZero() {
				created = age(now.Sub(r.Created))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Protocol, lockAddr(r.Addr), r.Port, dash(shown(r.Label, maxLabelWidth)), kind(r),
				pid, name, created, alive)
		}
		return tw.Flush()
	})
	return cmd
}

func (a *app) reapCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "reap",
		Short:   "Delete reservations whose process has exited, and print them",
		Example: "  berth reap",
		Args:    noArgs("reap", ""),
	}
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		s, err := a.openStore(ctx)
		if err != nil {
			return err
		}
		if s == nil {
			fmt.Fprintln(a.stdout, "reaped 0 reservations")
			return nil
		}
		defer func() { _ = s.Close() }()
		before, err := s.List(ctx, store.Filter{})
		if err != nil {
			return err
		}
		n, err := s.Reap(ctx)
		if err != nil {
			return err
		}
		after, err := s.List(ctx, store.Filter{})
		if err != nil {
			return err
		}
		for _, r := range before {
			if slices.ContainsFunc(after, func(x store.Reservation) bool { return x.Key == r.Key }) {
				continue
			}
			label := ""
			if r.Label != "" {
				label = " label " + shown(r.Label, maxLabelWidth)
			}
			fmt.Fprintf(a.stdout, "reaped %s of pid %d (%s)%s\n", r.Key, r.Owner.PID, shown(r.Owner.Name, maxNameWidth), label)
		}
		fmt.Fprintf(a.stdout, "reaped %d reservations\n", n)
		return nil
	})
	return cmd
}

// writeJSON writes v as indented JSON, escaped for the terminal (jsonSafe).
func (a *app) writeJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(append(jsonSafe(b), '\n'))
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
	// A holder's port: owner_pid 0, when the lease ends and how many
	// seconds it has left (0 once ended); those two are absent for a lease
	// of another time namespace.
	Holder       string     `json:"holder,omitempty"`
	Expires      *time.Time `json:"expires,omitempty"`
	LeaseSeconds *int64     `json:"lease_seconds,omitempty"`
	// Bound, with --bound, is whether the port is bound right now (a
	// *bool: null where the system cannot tell).
	Bound any `json:"bound,omitempty"`
}

// boundRows tells, for ls --bound, whether each row's port is bound now by
// a socket of its protocol on an overlapping address: nil where the system
// cannot tell (all but Linux). ls never probes by binding, which could make
// a program's own bind fail.
func boundRows(ctx context.Context, rows []store.Reservation) ([]*bool, error) {
	bound := make([]*bool, len(rows))
	socks, err := who.Bound(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		return bound, nil
	}
	if err != nil {
		return nil, err
	}
	for i, r := range rows {
		b := slices.ContainsFunc(socks, func(s who.Socket) bool {
			return s.Protocol == r.Protocol && s.Local.Port() == r.Port && !s.Remote.IsValid() && who.Overlaps(s.Local.Addr(), r.Addr)
		})
		bound[i] = &b
	}
	return bound, nil
}

// kind is a row's kind, or "lock" for a lock that no row stands for.
func kind(r store.Reservation) string { return cmp.Or(string(r.Kind), "lock") }

// processName is the current name of r's owner while it runs, else the
// name recorded (for a lock, as lockRows named it).
func processName(ctx context.Context, r store.Reservation) string {
	o := r.Owner
	if r.Kind != "" && o.Holder == "" && o.PID > 0 && o.Alive(ctx) {
		return cmp.Or(owner.NameOf(ctx, o.PID), o.Name)
	}
	return o.Name
}

// lockRows returns, as rows of kind "lock", the kernel locks of this host
// that match flt and no row of rows stands for (porttest's, another
// user's, another store's). The owner is the first process that holds the
// lock, known by its start, so that it shows as alive while it does.
func lockRows(ctx context.Context, rows []store.Reservation, flt store.Filter) []store.Reservation {
	held, err := portlock.List()
	if err != nil {
		return nil
	}
	var out []store.Reservation
	for _, l := range held {
		k := store.Key{Protocol: store.Protocol(l.Network), Addr: l.Addr, Port: l.Port}
		if (flt.Port != 0 && k.Port != flt.Port) || (flt.Protocol != "" && k.Protocol != flt.Protocol) || len(l.PIDs) == 0 ||
			(flt.OwnerPID != 0 && !slices.Contains(l.PIDs, flt.OwnerPID)) {
			continue
		}
		if slices.ContainsFunc(rows, func(r store.Reservation) bool {
			return r.Protocol == k.Protocol && r.Port == k.Port && (r.Addr == k.Addr || (!k.Addr.IsValid() && r.Addr.IsUnspecified()))
		}) {
			continue
		}
		pid := l.PIDs[0]
		o, err := store.LookupOwner(ctx, pid)
		if err != nil {
			o = store.Owner{PID: pid} // gone since List: shown as dead
		}
		o.Name = lockHolderName(ctx, pid)
		out = append(out, store.Reservation{Key: k, Owner: o})
	}
	return out
}

// lockHolderName names the process pid that holds a lock: a keeper by the
// owner it keeps for, any other by its name.
func lockHolderName(ctx context.Context, pid int) string {
	args, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if f := strings.Split(strings.TrimRight(string(args), "\x00"), "\x00"); len(f) == 3 && f[0] == "berth-keeper" {
		return "keeper of " + f[1] + " " + f[2] // "pid 1234", "holder ci/job-1"
	}
	return owner.NameOf(ctx, pid)
}

// inScope returns the rows labelled in scope, with the scope cut.
func inScope(rows []store.Reservation, sc string) []store.Reservation {
	out := rows[:0]
	for _, r := range rows {
		if l, ok := unscoped(r.Label, sc); ok {
			r.Label = l
			out = append(out, r)
		}
	}
	return out
}

func dash(s string) string { return cmp.Or(s, "-") }

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
