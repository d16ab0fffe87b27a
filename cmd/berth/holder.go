package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/store"
)

// Ports of named holders (--holder): they belong to no process, and last until released
// or their lease (--ttl) ends.

// errNoLease: the holder has no port whose lease has not ended (exit 4).
var errNoLease = errors.New("the holder has no port whose lease has not ended")

// holderFlags are --holder and --ttl of a holder on this host.
type holderFlags struct {
	holder string
	ttl    time.Duration
}

func (h *holderFlags) add(cmd *cobra.Command, withTTL bool) {
	cmd.Flags().StringVar(&h.holder, "holder", "", fmt.Sprintf(`a named holder the ports belong to instead of a process, e.g. "ci/job-4711" (1 to %d bytes of printable text); they outlive the shell that ran berth, until released or their lease ends`, store.MaxHolderLen))
	if withTTL {
		cmd.Flags().DurationVar(&h.ttl, "ttl", time.Hour, "how long the holder's lease lasts (1s to 720h), e.g. 8h; renew extends it")
	}
}

// set reports whether --holder was given.
func (h *holderFlags) set(cmd *cobra.Command) bool { return cmd.Flags().Changed("holder") }

// check validates --holder and --ttl, and refuses them with --owner.
func (h *holderFlags) check(cmd *cobra.Command) error {
	for _, f := range []string{"owner", "owner-pid"} {
		if cmd.Flags().Changed(f) {
			return usagef("--holder with --%s: a holder's ports belong to no process; give one of them", f)
		}
	}
	if err := (store.Owner{Holder: h.holder}).Validate(); err != nil {
		return usagef("--holder %q: want 1 to %d bytes of printable text (letters, digits, punctuation, spaces; no control characters), e.g. \"ci/job-4711\"", h.holder, store.MaxHolderLen)
	}
	if cmd.Flags().Lookup("ttl") != nil && store.CheckTTL(h.ttl) != nil {
		return usagef("--ttl %v: want a duration from 1s to 720h (30 days), e.g. 8h", h.ttl)
	}
	return nil
}

// strictAllocator opens an Allocator of the state store only, for a holder's ports: the
// MRU file keeps no lease.
func (a *app) strictAllocator(ctx context.Context) (*portalloc.Allocator, error) {
	cfg := a.cfg
	if cfg.Mode == portalloc.ModeMRU {
		return nil, usagef("--holder with BERTH_MODE=mru: a holder's ports need the state store, which the MRU mode does not use")
	}
	cfg.Mode = portalloc.ModeStateStore
	return fleet.New(ctx, cfg)
}

// releaseLeased is release with --holder.
func (a *app) releaseLeased(ctx context.Context, cmd *cobra.Command, f *selectFlags, args []string) error {
	h := &f.holder
	if err := h.check(cmd); err != nil {
		return err
	}
	port, err := f.port(args, usagef("give a PORT, --label or --all: which ports of holder %q to release", h.holder))
	if err != nil {
		return err
	}
	return a.onHolder(ctx, h, "released %d %s of holder %q\n", "holds no port that matches (none was reserved, it was released, or its lease ended and it was reaped)",
		func(al *portalloc.Allocator) (int, error) {
			return al.ReleaseHolder(ctx, h.holder, store.Filter{Port: port, Label: f.label})
		})
}

// onHolder runs op on an Allocator for h's ports and says how many it acted on as done
// says; when h has none, the error says so as none does.
func (a *app) onHolder(ctx context.Context, h *holderFlags, done, none string, op func(*portalloc.Allocator) (int, error)) error {
	al, err := a.strictAllocator(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = al.Close() }()
	n, err := op(al)
	if errors.Is(err, store.ErrNotFound) {
		return &userError{msg: "holder " + strconv.Quote(h.holder) + " " + none, err: fmt.Errorf("%w: %w", errNoLease, err)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, done, n, plural(n, "port"), h.holder)
	return nil
}

func (a *app) renewCmd() *cobra.Command {
	var h holderFlags
	cmd := &cobra.Command{
		Use:   "renew --holder NAME [--ttl D]",
		Short: "Extend the lease of every port of a holder; exit 4 if it has none",
		Long: `Extend the lease of every port of --holder whose lease has not ended: each
lasts --ttl (default 1h) from now. A lease that has ended is never renewed,
since another program may have its port by now: berth says so and exits 4,
as it does for a holder with no ports. Get the ports again then.`,
		Example: `  berth renew --holder ci/job-4711 --ttl 8h || PORT=$(berth get --holder ci/job-4711 --ttl 8h)`,
		Args:    noArgs("renew", "name the holder with --holder"),
	}
	h.add(cmd, true)
	cmd.RunE = a.action(func(ctx context.Context, _ []string) error {
		if !h.set(cmd) {
			return usagef("renew needs --holder NAME: the holder whose leases to extend")
		}
		if err := h.check(cmd); err != nil {
			return err
		}
		return a.onHolder(ctx, &h, "renewed %d %s of holder %q for "+h.ttl.String()+"\n",
			"has no port whose lease has not ended (none was reserved, it was released, or its lease ended: an ended lease is never renewed, since its port may be another's by now); get the ports again",
			func(al *portalloc.Allocator) (int, error) { return al.Renew(ctx, h.holder, h.ttl) })
	})
	return cmd
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// leaseLeft shows how long a holder's lease has left, for ls.
func leaseLeft(r store.Reservation) string {
	if r.Expires.IsZero() {
		return "yes (lease of another namespace)"
	}
	left := time.Until(r.Expires)
	d := left.Round(time.Second)
	h, m, sec := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	switch {
	case left <= 0:
		return "ended"
	case h > 0:
		return fmt.Sprintf("%dh%02dm left", h, m)
	case m > 0:
		return fmt.Sprintf("%dm%02ds left", m, sec)
	}
	return fmt.Sprintf("%ds left", sec)
}
