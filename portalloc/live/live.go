// Package live reads the ports others hold without holding them: the live
// reservations of a scope in a state store, by label (PortOf) or all of
// them (Ports), and writes them as environment variables (WriteEnv) for a
// second shell, docker compose's .env file or an editor's envFile. It
// changes nothing in the store. berth port and berth env are built on it.
package live

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/internal/scopes"
	"github.com/berth-go/berth/store"
)

// ErrNoReservation: PortOf found no live reservation of the label.
var ErrNoReservation = errors.New("no live reservation")

// Port is a live reservation of a scope, as Ports and PortOf read
// it from a store, for programs that want the ports others hold without
// holding them: a second shell, docker compose, an editor's envFile.
type Port struct {
	// Label is the reservation's label as its scope knows it (see
	// scope.Unscoped), and Scope the scope.
	Label, Scope string
	// Var is the environment variable the port goes by: EnvVar(Label).
	Var      string
	Protocol portalloc.Protocol
	Addr     netip.Addr
	Port     uint16
	// OwnerPID is the process that holds the port; 0 for a named holder
	// under a lease, which Holder names.
	OwnerPID int
	Holder   string
	Created  time.Time
}

// live reports whether r's owner runs, or its lease has not ended.
func live(ctx context.Context, r store.Reservation) bool {
	if r.Owner.IsLease() {
		return r.LeaseLive()
	}
	return r.Owner.Alive(ctx)
}

func livePort(r store.Reservation, label, scope string) Port {
	lp := Port{Label: label, Scope: scope, Var: EnvVar(label), Protocol: r.Protocol, Addr: r.Addr, Port: r.Port, Created: r.Created}
	if r.Owner.IsLease() {
		lp.Holder = r.Owner.Name
	} else {
		lp.OwnerPID = r.Owner.PID
	}
	return lp
}

// Ports returns the live reservations with a label in scope (a scope
// as scope.Resolve returns it, or Allocator.Config().Scope; "" for labels
// of no scope), one for each variable (see EnvVar): where several would
// give one variable, the newest. They are sorted by variable. It reads s
// and changes nothing; s is a store OpenStore (or fleet.OpenStore) opened.
func Ports(ctx context.Context, s store.Store, scope string) ([]Port, error) {
	rows, err := s.List(ctx, store.Filter{})
	if err != nil {
		return nil, opError("list the live ports", err)
	}
	byVar := map[string]Port{}
	for _, r := range rows {
		label, ok := scopes.Unscoped(r.Label, scope)
		if !ok || !live(ctx, r) {
			continue
		}
		lp := livePort(r, label, scope)
		if prev, ok := byVar[lp.Var]; !ok || lp.Created.After(prev.Created) {
			byVar[lp.Var] = lp
		}
	}
	out := make([]Port, 0, len(byVar))
	for _, lp := range byVar {
		out = append(out, lp)
	}
	slices.SortFunc(out, func(a, b Port) int { return cmp.Compare(a.Var, b.Var) })
	return out, nil
}

// PortOf returns the live reservation of label in scope for protocol
// (zero: TCP); where there are several (one label on two addresses), the
// newest. A label with no live reservation of its own also finds the port
// berth run --port label gives its command (labelled run/port/label). It reads s and changes nothing. When there is none, the error
// wraps ErrNoReservation; a label that could not be recorded is a
// *FieldError for "label".
func PortOf(ctx context.Context, s store.Store, scope, label string, protocol portalloc.Protocol) (Port, error) {
	if protocol == "" {
		protocol = portalloc.TCP
	}
	if label == "" {
		return Port{}, opError("", &portalloc.FieldError{Field: "label", Value: label, Want: "the label of a reservation"})
	}
	if err := store.CheckLabel(label); err != nil {
		return Port{}, opError("", err)
	}
	if protocol != portalloc.TCP && protocol != portalloc.UDP {
		return Port{}, opError("", &portalloc.FieldError{Field: "protocol", Value: string(protocol), Want: `"tcp" or "udp"`})
	}
	var (
		best  Port
		found bool
	)
	// The label itself, else the --port NAME of berth run (run/port/NAME).
	for _, l := range []string{label, "run/port/" + label} {
		rows, err := s.List(ctx, store.Filter{Protocol: protocol, Label: scopes.Label(scope, l)})
		if err != nil {
			return Port{}, opError(fmt.Sprintf("port of %q", label), err)
		}
		for _, r := range rows {
			if !live(ctx, r) {
				continue
			}
			if lp := livePort(r, l, scope); !found || lp.Created.After(best.Created) {
				best, found = lp, true
			}
		}
		if found {
			break
		}
	}
	if !found {
		in := ""
		if scope != "" {
			in = fmt.Sprintf(" in scope %q", scope)
		}
		return Port{}, opError("", fmt.Errorf("%s port of %q%s: %w", protocol, label, in, ErrNoReservation))
	}
	return best, nil
}

// EnvVar returns the environment variable a port labelled label goes by,
// as berth run names its --port ports: a label berth run gave
// ("run/port/web") by its port's name, WEB_PORT; any other by the whole
// label, upper-cased, with every character but a letter or digit as '_'
// and "_PORT" after it ("api.http" is API_HTTP_PORT, "dev/api/0/http"
// DEV_API_0_HTTP_PORT); a leading digit gets a '_' before it.
func EnvVar(label string) string {
	name := label
	if rest, ok := strings.CutPrefix(label, "run/port/"); ok && rest != "" {
		name = rest
	}
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	v := b.String()
	if v == "" || v[0] >= '0' && v[0] <= '9' {
		v = "_" + v
	}
	return v + "_PORT"
}

// EnvFormat is how WriteEnv writes variables.
type EnvFormat string

// The formats of WriteEnv.
const (
	// EnvShell writes "export WEB_PORT=23456" lines, for eval in a POSIX
	// shell.
	EnvShell EnvFormat = "sh"
	// EnvDotenv writes "WEB_PORT=23456" lines: docker compose's .env file,
	// VS Code's envFile, direnv's dotenv.
	EnvDotenv EnvFormat = "dotenv"
	// EnvJSON writes one JSON object of variables and port numbers,
	// {"WEB_PORT": 23456}.
	EnvJSON EnvFormat = "json"
)

// WriteEnv writes ports to w as variables (Port.Var) in format, in the
// order given (Ports sorts them by variable). An unknown format is a
// *FieldError for "format".
func WriteEnv(w io.Writer, ports []Port, format EnvFormat) error {
	var err error
	switch format {
	case EnvShell, EnvDotenv:
		var b strings.Builder
		for _, p := range ports {
			if format == EnvShell {
				b.WriteString("export ")
			}
			fmt.Fprintf(&b, "%s=%d\n", p.Var, p.Port)
		}
		_, err = io.WriteString(w, b.String())
	case EnvJSON:
		m := make(map[string]uint16, len(ports))
		for _, p := range ports {
			m[p.Var] = p.Port
		}
		var out []byte
		if out, err = json.MarshalIndent(m, "", "  "); err == nil {
			_, err = w.Write(append(out, '\n'))
		}
	default:
		return opError("", &portalloc.FieldError{Field: "format", Value: string(format), Want: `"sh", "dotenv" or "json"`})
	}
	if err != nil {
		return opError("write the ports' variables", err)
	}
	return nil
}

// opError is the error of a call of the package: portalloc's prefix, once.
func opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return &portalloc.OpError{Op: op, Err: err}
}
