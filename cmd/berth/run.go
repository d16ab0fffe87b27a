package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-go/berth/portalloc"
)

// runFlags are berth run's flags.
type runFlags struct {
	ports  []string
	set    string
	listen bool
	addr   string
}

// portName is the rule for --port names: 1-64 bytes, a letter first.
var portName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// runPort is one --port NAME[:udp].
type runPort struct {
	name, env string
	protocol  portalloc.Protocol
}

func parseRunPort(s string) (runPort, error) {
	name, proto, hasProto := strings.Cut(s, ":")
	p := runPort{name: name, protocol: portalloc.TCP}
	switch {
	case !portName.MatchString(name):
		return runPort{}, usagef("--port %q: want NAME or NAME:udp, NAME 1 to 64 letters, digits, '_' or '-', a letter first", s)
	case hasProto && proto == "udp":
		p.protocol = portalloc.UDP
	case hasProto && proto != "tcp":
		return runPort{}, usagef("--port %q: want NAME, NAME:tcp or NAME:udp", s)
	}
	p.env = strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_PORT"
	return p, nil
}

func (a *app) runCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [--port NAME[:udp]]... [--set SPEC.json] [--listen] [--] COMMAND [ARGS...]",
		Short: "Run COMMAND with ports of its own, in its environment, for as long as it runs",
		Long: `Reserve ports, put them in the environment, and replace berth with COMMAND
(exec: same process id), so that COMMAND owns its ports for exactly as long as
it runs and they come back when it exits, crashed or not.

--port web gives COMMAND WEB_PORT=<port> (the name upper-cased, '-' as '_');
--port dns:udp a UDP port in DNS_PORT. --set reserves every port of a set spec
(the JSON of portalloc.SetSpec) and gives COMMAND every member's variables.

With --listen, berth also binds each port and passes the sockets as systemd
does (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES; descriptors from 3, in the
order of --port), for programs that take their sockets that way: no other
program can bind the port in between.

Everything after the first argument that is not a flag (or after --) is
COMMAND and its arguments, flags included.`,
		Example: `  berth run --port web -- ./server --addr 127.0.0.1:$WEB_PORT   # shell expands too early
  berth run --port web -- sh -c './server --addr 127.0.0.1:$WEB_PORT'
  berth run --port http --port metrics -- ./app
  berth run --set stack.json -- docker compose up
  berth run --listen --port http -- ./socket-activated-server`,
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
	cmd.RunE = a.action(func(ctx context.Context, args []string) error { return a.runRun(ctx, &f, args) })
	return cmd
}

func (a *app) runRun(ctx context.Context, f *runFlags, args []string) error {
	var ports []runPort
	seen := map[string]bool{}
	for _, s := range f.ports {
		p, err := parseRunPort(s)
		if err != nil {
			return err
		}
		if seen[p.env] {
			return usagef("--port %q: two ports would both be $%s; give each a name of its own", s, p.env)
		}
		seen[p.env] = true
		ports = append(ports, p)
	}
	addr, err := netip.ParseAddr(f.addr)
	if err != nil {
		return usagef("--addr %q: want an IP address such as 127.0.0.1, ::1, 0.0.0.0 or ::", f.addr)
	}
	var spec *portalloc.SetSpec
	if f.set != "" {
		b, err := os.ReadFile(f.set)
		if err != nil {
			return usagef("--set: %v", err)
		}
		sp, err := portalloc.ParseSetSpec(b)
		if err != nil {
			return usagef("--set %s: %v", f.set, err)
		}
		spec = &sp
	}
	if len(ports) == 0 && spec == nil {
		return usagef("run needs --port or --set: which ports should COMMAND have?")
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return usagef("COMMAND %q: %v", args[0], err)
	}

	al, err := portalloc.New(ctx, a.cfg)
	if err != nil {
		return err
	}
	defer func() { _ = al.Close() }() // releases everything unless exec happens
	defer a.fallbackHint(al)
	var (
		env   []string
		rs    []portalloc.Reservation
		names []string
	)
	for _, p := range ports {
		r, err := al.Allocate(ctx, portalloc.Request{Protocol: p.protocol, Address: addr, Label: p.name})
		if err != nil {
			return err
		}
		rs = append(rs, r)
		names = append(names, p.name)
		env = append(env, p.env+"="+strconv.Itoa(int(r.Port)))
	}
	var set *portalloc.Set
	if spec != nil {
		if set, err = al.AllocateSet(ctx, *spec); err != nil {
			return err
		}
		vars := map[string]string{}
		for _, m := range set.Members() {
			for _, kv := range m.Env() {
				k, v, _ := strings.Cut(kv, "=")
				if old, ok := vars[k]; ok && old != v {
					return usagef("--set %s: members of set %q give $%s different ports (%s, %s): berth run gives every variable to one COMMAND; give each group one member", f.set, set.Name, k, old, v)
				}
				if seen[k] {
					return usagef("--set %s: $%s is both a --port and a variable of the set; rename the --port", f.set, k)
				}
				if _, ok := vars[k]; !ok {
					env = append(env, kv)
				}
				vars[k] = v
			}
		}
	}

	var files []*os.File
	if f.listen {
		if spec != nil {
			return usagef("--listen with --set: berth run binds --port ports only; let the set's programs bind theirs")
		}
		for i, r := range rs {
			file, err := bindFile(ctx, r)
			if err != nil {
				return fmt.Errorf("--listen %s (%s): %w", names[i], r, err)
			}
			defer func() { _ = file.Close() }()
			files = append(files, file)
		}
	}

	// From here the ports are COMMAND's: this process's, which COMMAND
	// becomes.
	self := os.Getpid()
	for _, r := range rs {
		if err := al.Transfer(ctx, r, self); err != nil {
			return err
		}
	}
	if set != nil {
		if err := set.TransferAll(ctx, self); err != nil {
			return err
		}
	}
	environ := withoutListenVars(os.Environ())
	environ = append(environ, env...)
	if len(files) > 0 {
		environ = append(environ, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_PID="+strconv.Itoa(self), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	for _, kv := range env {
		a.cfg.Logger.V(1).Info("berth run", "set", kv)
	}
	a.fallbackHint(al)
	if err := al.Close(); err != nil {
		return err
	}
	return execCommand(path, args, environ, files)
}

// bindFile binds r's port and returns the socket as a file (a descriptor
// of its own; the listener itself is closed).
func bindFile(ctx context.Context, r portalloc.Reservation) (*os.File, error) {
	addr := r.AddrPort().String()
	var lc net.ListenConfig
	if r.Protocol == portalloc.UDP {
		c, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return nil, err
		}
		defer func() { _ = c.Close() }()
		uc, ok := c.(*net.UDPConn)
		if !ok {
			return nil, errors.New("not a UDP socket")
		}
		return uc.File()
	}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Close() }()
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return nil, errors.New("not a TCP listener")
	}
	return tl.File()
}

// withoutListenVars drops inherited socket-activation variables, which
// would describe descriptors COMMAND does not have.
func withoutListenVars(env []string) []string {
	for _, name := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		env = withoutVar(env, name)
	}
	return env
}

// withoutVar returns env without the variable name.
func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
