package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/store"
)

type runFlags struct {
	ports  []string
	set    string
	listen bool
	sticky bool
	addr   string
	// envFile is --env-file: the variables, written for COMMAND's lifetime.
	envFile string
	// restart and watch make berth run stay COMMAND's parent (supervise).
	restart string
	watch   []string
}

// runSet is the set berth run makes of its --port ports, each in the group
// runGroup, labelled "run/port/NAME".
const (
	runSet   = "run"
	runGroup = "port"
)

// portSpec turns the values of --port, NAME[:tcp|:udp], into a set spec of
// one group, each port in $NAME_PORT (NAME upper-cased, '-' as '_').
func portSpec(values []string, addr netip.Addr, sticky bool) (portset.SetSpec, error) {
	g := portset.GroupSpec{Name: runGroup}
	seen := map[string]string{} // --port value by variable
	for _, s := range values {
		name, proto, hasProto := strings.Cut(s, ":")
		p := portset.PortSpec{Name: name, Shared: true, Protocol: store.TCP, Addr: addr, Sticky: sticky,
			Env: strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_PORT"}
		switch {
		case !hasProto, proto == "tcp":
		case proto == "udp":
			p.Protocol = store.UDP
		default:
			return portset.SetSpec{}, usagef("--port %q: want NAME, NAME:tcp or NAME:udp", s)
		}
		// Each port on its own first, so a bad name is reported as such
		// rather than as a duplicate of another bad one.
		one := portset.SetSpec{Name: runSet, Groups: []portset.GroupSpec{{Name: runGroup, Ports: []portset.PortSpec{p}}}}
		if err := one.Validate(); err != nil {
			return portset.SetSpec{}, portFlagErr(s, err)
		}
		switch prev, dup := seen[p.Env]; {
		case dup && prev == s:
			return portset.SetSpec{}, usagef("--port %q twice: two ports would both be $%s; give each a name of its own", s, p.Env)
		case dup:
			return portset.SetSpec{}, usagef("--port %q and --port %q would both be $%s; give each a name of its own", prev, s, p.Env)
		}
		seen[p.Env] = s
		g.Ports = append(g.Ports, p)
	}
	return portset.SetSpec{Name: runSet, Groups: []portset.GroupSpec{g}}, nil
}

// portFlagErr words what portalloc found wrong with the port of --port s.
func portFlagErr(s string, err error) error {
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "SetSpec" {
		return err
	}
	// The value alone: --port names where it came from.
	value := *fe
	value.Field, value.At = "", ""
	if strings.HasSuffix(fe.At, ".name") {
		return usagef("--port %q: want NAME or NAME:udp; NAME %s", s, value.Error())
	}
	return usagef("--port %q: %s", s, value.Error())
}

func (a *app) runCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [--port NAME[:udp]]... [--set SPEC.json] [--listen] [--restart POLICY] [--watch PATH]... [--] COMMAND [ARGS...]",
		Short: "Run COMMAND with ports of its own, in its environment, for as long as it runs",
		Long: `Reserve ports, put them in the environment, and replace berth with COMMAND
(exec: same process id), so that COMMAND owns its ports for exactly as long as
it runs and they come back when it exits, crashed or not.

--port web gives COMMAND WEB_PORT=<port> (the name upper-cased, '-' as '_');
--port dns:udp a UDP port in DNS_PORT. The --port ports are reserved all or
none, as a set named "run": berth ls shows them as run/port/NAME. --set
reserves every port of a set spec (the JSON of portset.SetSpec) and gives
COMMAND every member's variables; a spec whose members would give one
variable different ports (two groups with the same env, a member-scoped
port of a group of several members) is refused before a port is taken.

With --listen, berth also binds each port and passes the sockets as systemd
does (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES; descriptors from 3, in the
order of --port), for programs that take their sockets that way: no other
program can bind the port in between.

With --restart on-failure|always or --watch PATH, berth stays COMMAND's
parent instead: it holds the ports (and the sockets of --listen) for its own
lifetime and starts COMMAND again when it exits (on-failure: with a status
other than 0; backoff from 100ms, doubling to 10s) or when a file under a
watched PATH changes (SIGTERM to COMMAND, SIGKILL 5s later; checked every
200ms, after 300ms without further change). With --listen, a client that
connects between two runs waits in the backlog and is served by the next.
COMMAND runs in a process group of its own, without the terminal as its
input; SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to it, and
SIGINT or SIGTERM also end berth once COMMAND has exited, with its status.
The ports are released when berth ends; killed with SIGKILL, it takes
COMMAND with it (on Linux) and its ports are reaped.

Everything after the first argument that is not a flag (or after --) is
COMMAND and its arguments, flags included.`,
		Example: `  berth run --port web -- ./server --addr 127.0.0.1:$WEB_PORT   # shell expands too early
  berth run --port web -- sh -c './server --addr 127.0.0.1:$WEB_PORT'
  berth run --port http --port metrics -- ./app
  berth run --scope git --sticky --port web -- ./dev-server   # this checkout's port, as last time
  berth run --set stack.json -- docker compose up
  berth run --listen --port http -- ./socket-activated-server
  berth run --port web --env-file .env -- docker compose up   # ${WEB_PORT} in compose.yaml
  berth run --listen --port http --restart on-failure --watch ./src -- ./server`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("run needs a COMMAND to run: berth run --port NAME -- COMMAND ARGS...")
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false) // COMMAND's flags are its own
	cmd.Flags().StringArrayVar(&f.ports, "port", nil, "a port for COMMAND, NAME or NAME:udp, in $NAME_PORT; repeat for more")
	cmd.Flags().StringVar(&f.set, "set", "", "a set spec (JSON) whose ports COMMAND gets, in its members' variables")
	cmd.Flags().BoolVar(&f.listen, "listen", false, "bind the ports and pass the sockets systemd-style (LISTEN_FDS)")
	cmd.Flags().StringVar(&f.addr, "addr", "127.0.0.1", "address the --port ports are for; 0.0.0.0 and :: are the wildcards")
	cmd.Flags().StringVar(&f.envFile, "env-file", "", "also write COMMAND's port variables to this file (NAME=PORT lines: docker compose's .env, an editor's envFile) while COMMAND runs; removed when it exits")
	cmd.Flags().BoolVar(&f.sticky, "sticky", false, "give each --port the port it had last time (in this --scope) when it is free")
	cmd.Flags().StringVar(&f.restart, "restart", "no", "stay COMMAND's parent and start it again when it exits: no, on-failure or always")
	cmd.Flags().StringArrayVar(&f.watch, "watch", nil, "stay COMMAND's parent and start it again when a file under PATH changes; repeat for more")
	cmd.RunE = a.action(func(ctx context.Context, args []string) error { return a.runRun(ctx, &f, args) })
	return cmd
}

// exitCode is the exit status of the program berth ran: run exits with it,
// printing nothing.
type exitCode struct{ code int }

func (e *exitCode) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func (a *app) runRun(ctx context.Context, f *runFlags, args []string) error {
	addr, err := parseAddr(f.addr)
	if err != nil {
		return err
	}
	var ports, spec *portset.SetSpec
	if len(f.ports) > 0 {
		sp, err := portSpec(f.ports, addr, f.sticky)
		if err != nil {
			return err
		}
		ports = &sp
	}
	if f.set != "" {
		sp, err := readSetSpec(f.set)
		if err != nil {
			return err
		}
		if ports != nil && sp.Name == runSet {
			// Its ports would be taken for those of --port of the same names.
			return usagef("--set %s: the set is named %q, as berth run names the set of its --port ports; rename it", f.set, runSet)
		}
		// berth run gives every member's variables to one COMMAND: check
		// that they fit in one environment before a port is taken.
		if err := sp.ValidateOneEnv(); err != nil {
			return usagef("--set %s: %v", f.set, inSpecWords(err))
		}
		for _, g := range sp.Groups {
			for _, k := range g.EnvNames() {
				if ports != nil && slices.ContainsFunc(ports.Groups[0].Ports, func(p portset.PortSpec) bool { return p.Env == k }) {
					return usagef("--set %s: $%s is both a --port and a variable of group %q of the set; rename the --port", f.set, k, g.Name)
				}
			}
		}
		spec = &sp
	}
	switch {
	case ports == nil && spec == nil:
		return usagef("run needs --port or --set: which ports should COMMAND have?")
	case f.sticky && ports == nil:
		return usagef("--sticky applies to --port ports; a --set spec says \"sticky\" per port")
	case f.listen && spec != nil:
		return usagef("--listen with --set: berth run binds --port ports only; let the set's programs bind theirs")
	case f.restart != "no" && f.restart != "on-failure" && f.restart != "always":
		return usagef("--restart %q: want no, on-failure or always", f.restart)
	}
	for _, p := range f.watch {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return usagef("--watch %q: no such file or directory; want a file or directory that exists", p)
		} else if err != nil {
			return usagef("--watch %q: %v", p, err)
		}
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return usagef("COMMAND %q: %v", args[0], err)
	}

	al, err := fleet.New(ctx, a.cfg)
	if err != nil {
		return err
	}
	defer func() { _ = al.Close() }() // releases everything unless exec happens
	var (
		env  []string
		sets []*portset.Set
		vars = map[string]bool{}
	)
	for _, sp := range []*portset.SetSpec{ports, spec} {
		if sp == nil {
			continue
		}
		set, err := portset.Allocate(ctx, al, *sp) // all of its ports or none
		if err != nil {
			return err
		}
		sets = append(sets, set)
		// ValidateOneEnv made sure a variable set twice has one port.
		for _, m := range set.Members() {
			for _, kv := range m.Env() {
				if k, _, _ := strings.Cut(kv, "="); !vars[k] {
					env = append(env, kv)
					vars[k] = true
				}
			}
		}
	}

	var (
		files []*os.File
		names []string
	)
	for i := 0; f.listen && i < len(ports.Groups[0].Ports); i++ {
		name := ports.Groups[0].Ports[i].Name
		r := sets[0].Members()[0].Ports[name]
		file, err := bindFile(ctx, r)
		if err != nil {
			return fmt.Errorf("--listen %s (%s): %w", name, r, err)
		}
		defer func() { _ = file.Close() }()
		files, names = append(files, file), append(names, name)
	}

	// The file lives as long as this process: COMMAND's, once it execs
	// COMMAND, or COMMAND's parent's when it supervises.
	if f.envFile != "" {
		if err := writeEnvFile(f.envFile, env); err != nil {
			return err
		}
	}
	// LISTEN_PID is set where COMMAND starts, with the sockets in place
	// (see place).
	environ := append(withoutVars(os.Environ(), "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"), env...)
	if len(files) > 0 {
		environ = append(environ, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	held := al.Held()
	a.fallbackHint(al, held)
	if f.restart != "no" || len(f.watch) > 0 {
		// The ports stay this process's, for as long as it runs: al
		// releases them when it closes.
		return a.supervise(context.WithoutCancel(ctx), path, args, environ, files, f)
	}

	// From here the ports are COMMAND's, which this process becomes: their
	// locks pass through exec as descriptors from 64 up, let go when it
	// exits.
	for _, r := range held {
		fs, err := al.Files(r)
		if err != nil {
			return err
		}
		if err := keepAcrossExec(fs); err != nil {
			return fmt.Errorf("keep the lock of %s across exec: %w", r, err)
		}
	}
	for _, set := range sets {
		if err := set.TransferAll(ctx, os.Getpid()); err != nil {
			return err
		}
	}
	for _, kv := range env {
		a.cfg.Logger.V(1).Info("berth run", "set", kv)
	}
	if err := al.Close(); err != nil {
		return err
	}
	return execCommand(path, args, environ, files)
}

// bindFile binds r's port and returns the socket as a file of its own.
func bindFile(ctx context.Context, r store.Reservation) (*os.File, error) {
	var (
		lc  net.ListenConfig
		c   io.Closer
		err error
	)
	if r.Protocol == store.UDP {
		c, err = lc.ListenPacket(ctx, "udp", r.AddrPort().String())
	} else {
		c, err = lc.Listen(ctx, "tcp", r.AddrPort().String())
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	return c.(interface{ File() (*os.File, error) }).File()
}

func withoutVars(env []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k)
	})
}

func readSetSpec(path string) (portset.SetSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return portset.SetSpec{}, usagef("--set: %v", err)
	}
	sp, err := portset.ParseSetSpec(b)
	if err != nil {
		return portset.SetSpec{}, usagef("--set %s: %v", path, inSpecWords(err))
	}
	return sp, nil
}
