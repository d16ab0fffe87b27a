//go:build unix

package listenfd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-go/berth/store"
)

// The systemd socket-activation variables a Handoff sets and
// Inherit reads. Sockets start at file descriptor 3.
const (
	envListenFDs     = "LISTEN_FDS"
	envListenFDNames = "LISTEN_FDNAMES"
	envListenPID     = "LISTEN_PID"
	listenFDsStart   = 3
)

// maxNameLen is the longest name of a socket passed by a Handoff, as
// systemd limits a name in LISTEN_FDNAMES: printable ASCII (space
// included) other than ':', its separator.
const maxNameLen = 255

// nameProblem says what is wrong with a socket name, or "" when it may be
// used.
func nameProblem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case len(name) > maxNameLen:
		return fmt.Sprintf("it has %d bytes", len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < ' ' || c > '~' || c == ':' {
			return fmt.Sprintf("it has %s at byte %d", strconv.QuoteToASCII(name[i:i+1]), i)
		}
	}
	return ""
}

var nameWant = fmt.Sprintf("1 to %d printable ASCII characters other than ':'", maxNameLen)

// Handoff passes bound sockets to a child process the way systemd's socket
// activation does: as file descriptors 3, 4, ... with LISTEN_FDS (how many)
// and LISTEN_FDNAMES (their names, colon-separated). A child that accepts
// them never binds, so nothing can come between the allocation and its
// listening: with Listen, the socket was bound inside the transaction that
// reserved the port.
//
// LISTEN_PID must hold the child's own pid, which is unknown until it
// starts. Apply therefore runs the command through /bin/sh, which sets
// LISTEN_PID to its pid and then execs the command in its place, so the pid
// stays the same: systemd-aware programs (sd_listen_fds) accept the sockets.
// Set NoPIDWrapper to run the command directly without LISTEN_PID;
// Inherit accepts that.
//
// The zero Handoff is empty and ready to use. It is not safe for concurrent
// use.
type Handoff struct {
	// NoPIDWrapper skips the /bin/sh wrapper that sets LISTEN_PID.
	NoPIDWrapper bool

	names []string
	files []*os.File
	locks []*os.File
}

// Add adds a listener under name. The Handoff keeps a duplicate of its
// descriptor until Close; the caller may close l once the child started.
// The name goes into LISTEN_FDNAMES: 1 to 255 printable ASCII characters
// other than ':', each name once per Handoff. Other names are refused with
// a *store.FieldError, which wraps store.ErrInvalid.
func (h *Handoff) Add(name string, l net.Listener) error {
	return h.add(name, l, "listener", "a listener with a file descriptor to pass, such as a *net.TCPListener")
}

// AddPacketConn adds a UDP socket under name.
func (h *Handoff) AddPacketConn(name string, c net.PacketConn) error {
	return h.add(name, c, "packet conn", "a packet conn with a file descriptor to pass, such as a *net.UDPConn")
}

// add adds sock, named field in errors (with want, what it must be).
func (h *Handoff) add(name string, sock any, field, want string) error {
	fs, ok := sock.(interface{ File() (*os.File, error) })
	if !ok {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: field, Value: fmt.Sprintf("%T %s", sock, name), Want: want})
	}
	if why := nameProblem(name); why != "" {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: "socket name", Value: name, Want: nameWant + "; " + why})
	}
	if slices.Contains(h.names, name) {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: "socket name", Value: name, Want: "a name of its own for each socket; this one is handed off already"})
	}
	f, err := fs.File()
	if err != nil {
		return fmt.Errorf("listenfd: hand off %q: %w", name, err)
	}
	h.names = append(h.names, name)
	h.files = append(h.files, f)
	return nil
}

// AddLocks passes files, the kernel locks of the sockets' reservations
// (portalloc.Allocator.Files), to the child after the sockets, so that the
// child holds the locks itself for as long as it runs: a Transfer of the
// reservations to it then needs no keeper. The Handoff owns the files: its
// Close closes them.
func (h *Handoff) AddLocks(files []*os.File) { h.locks = append(h.locks, files...) }

// Apply sets up cmd, before it starts, to receive the sockets (and the
// locks, after them). cmd must have no ExtraFiles of its own: the sockets
// must be descriptors 3 onward.
func (h *Handoff) Apply(cmd *exec.Cmd) error {
	if cmd == nil {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: "cmd", Value: "nil", Want: "the *exec.Cmd to hand the sockets to"})
	}
	if len(cmd.ExtraFiles) > 0 {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: "cmd.ExtraFiles", Value: fmt.Sprintf("%d files", len(cmd.ExtraFiles)), Want: "none: the handed-off sockets must start at descriptor 3"})
	}
	if cmd.Process != nil {
		return fmt.Errorf("listenfd: %w", &store.FieldError{Field: "cmd", Value: cmd.String(), Want: "a command that has not started yet"})
	}
	cmd.ExtraFiles = append(append(cmd.ExtraFiles, h.files...), h.locks...)
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	env = withoutListenVars(env)
	cmd.Env = append(env, envListenFDs+"="+strconv.Itoa(len(h.files)), envListenFDNames+"="+strings.Join(h.names, ":"))
	if h.NoPIDWrapper {
		return nil
	}
	// sh sets LISTEN_PID to its own pid and execs the command, which keeps
	// that pid: "$0" is the program, "$@" its arguments.
	path := cmd.Path
	args := append([]string{"sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`, path}, cmd.Args[1:]...)
	cmd.Path, cmd.Args = "/bin/sh", args
	return nil
}

// Close closes the Handoff's copies of the sockets. Call it once the child
// has started (it has its own copies then), or when giving up.
func (h *Handoff) Close() error {
	var errs []error
	for _, f := range append(h.files, h.locks...) {
		errs = append(errs, f.Close())
	}
	h.files, h.names, h.locks = nil, nil, nil
	return errors.Join(errs...)
}

func withoutListenVars(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k != envListenFDs && k != envListenFDNames && k != envListenPID {
			out = append(out, kv)
		}
	}
	return out
}

// Inherited are the sockets a process received through socket activation,
// by name.
type Inherited struct {
	Listeners   map[string]net.Listener
	PacketConns map[string]net.PacketConn
}

// Inherit returns the sockets this process was handed by a Handoff
// (or by systemd), by the names in LISTEN_FDNAMES ("unknown" where a name is
// missing; a name given twice gets "#2", "#3" ... after it), and unsets the
// LISTEN_* variables so that its own children do not take them for theirs.
// With no LISTEN_FDS, or a LISTEN_PID that is not this process's, it returns
// no sockets and no error, as sd_listen_fds does.
//
// It takes only descriptors that are listening stream sockets or datagram
// sockets. Any other descriptor in the range (a file the runtime opened, a
// connected socket) is left open and untouched, and named in the error,
// which comes with the sockets that were taken.
func Inherit() (Inherited, error) {
	in := Inherited{Listeners: map[string]net.Listener{}, PacketConns: map[string]net.PacketConn{}}
	defer func() {
		for _, k := range []string{envListenFDs, envListenFDNames, envListenPID} {
			_ = os.Unsetenv(k)
		}
	}()
	nStr := os.Getenv(envListenFDs)
	if nStr == "" {
		return in, nil
	}
	if pid := os.Getenv(envListenPID); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return in, nil
	}
	n, err := strconv.Atoi(nStr)
	if err != nil || n < 0 || n > 1024 {
		return in, fmt.Errorf("listenfd: %w", &store.FieldError{Field: envListenFDs, Value: nStr, Want: "a count of descriptors from 0 to 1024"})
	}
	names := strings.Split(os.Getenv(envListenFDNames), ":")
	seen := map[string]int{}
	var errs []error
	for i := range n {
		name := "unknown"
		if i < len(names) && names[i] != "" {
			name = names[i]
		}
		if seen[name]++; seen[name] > 1 {
			name = fmt.Sprintf("%s#%d", name, seen[name])
		}
		fd := listenFDsStart + i
		l, c, err := takeSocket(fd, name)
		switch {
		case err != nil:
			errs = append(errs, err)
		case l != nil:
			in.Listeners[name] = l
		default:
			in.PacketConns[name] = c
		}
	}
	if err := errors.Join(errs...); err != nil {
		return in, fmt.Errorf("listenfd: %s=%s: %w", envListenFDs, nStr, err)
	}
	return in, nil
}

// takeSocket wraps descriptor fd when it is a listening or datagram socket,
// and then closes fd itself (the wrapper holds a duplicate). Any other
// descriptor is left as it was: the probe works on a duplicate, so no
// *os.File (whose finalizer would close it) ever owns fd.
func takeSocket(fd int, name string) (net.Listener, net.PacketConn, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("descriptor %d (%q): %w", fd, name, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return nil, nil, fmt.Errorf("descriptor %d (%q) is not a socket; left open", fd, name)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, nil, fmt.Errorf("descriptor %d (%q): %w", fd, name, err)
	}
	syscall.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), name)
	defer func() { _ = f.Close() }() // the wrappers hold duplicates of their own
	var (
		l net.Listener
		c net.PacketConn
	)
	if l, err = net.FileListener(f); err != nil {
		var perr error
		if c, perr = net.FilePacketConn(f); perr != nil {
			return nil, nil, fmt.Errorf("descriptor %d (%q) is a socket but neither listening nor datagram (%w); left open", fd, name, err)
		}
	}
	_ = syscall.Close(fd) // taken: the wrapper is the only holder now
	return l, c, nil
}
