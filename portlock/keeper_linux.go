package portlock

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// A keeper speaks on a sequenced-packet unix socket bound to an abstract
// name of its owner, one request and one answer a packet:
//
//	hold TTL KEY  (the lock's descriptors ride along, SCM_RIGHTS)  ok
//	drop KEY                                                      ok 1 | ok 0
//	take KEY                         ok (descriptors ride along) | ok 0
//	renew TTL                                                     ok N
//	list                                                          ok KEY...
//
// TTL in nanoseconds, KEY as a lock's name after its prefix
// (tcp/24989/127.0.0.1); an error is answered "err MESSAGE".

// keeperEnv is the variable that makes a program a keeper (see Keeper):
// "1 SPEC" starts the keeper in the background and exits, "2 SPEC" is the
// keeper, SPEC "p PID START" or "h HOLDER-HASH".
const keeperEnv = "BERTH_PORTLOCK_KEEPER"

func init() {
	if spec, ok := os.LookupEnv(keeperEnv); ok {
		os.Exit(keeperMain(spec))
	}
}

// sockName is the abstract name the keeper of k listens on.
func (k Keeper) sockName() string { return prefix + "keep/" + strings.ReplaceAll(k.spec(), " ", "/") }

func (k Keeper) spec() string {
	if k.holder != "" {
		sum := sha256.Sum256([]byte(k.holder))
		return "h " + hex.EncodeToString(sum[:16])
	}
	return "p " + strconv.Itoa(k.pid) + " " + strconv.FormatUint(k.start, 10)
}

// ioTimeout bounds one request to a keeper, and its start.
const ioTimeout = 10 * time.Second

// dial connects to k's keeper.
func (k Keeper) dial() (int, error) {
	if k.pid == 0 && k.holder == "" {
		return -1, errors.New("portlock: the zero Keeper names no owner")
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	tv := syscall.NsecToTimeval(ioTimeout.Nanoseconds())
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv)
	if err := again(func() error { return syscall.Connect(fd, &syscall.SockaddrUnix{Name: "@" + k.sockName()}) }); err != nil {
		_ = syscall.Close(fd)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return -1, ErrNoKeeper
		}
		return -1, os.NewSyscallError("connect", err)
	}
	return fd, nil
}

// again runs f until no signal interrupts it: the kernel does not restart a
// call on a socket with a timeout (signal(7)), and Go preempts by signal.
func again(f func() error) error {
	for {
		if err := f(); !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// call sends one request with files and returns what follows "ok", and the
// descriptors that came with the answer.
func call(c int, req string, files []*os.File) (string, []int, error) {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	if err := again(func() error { return syscall.Sendmsg(c, []byte(req), oob, nil, 0) }); err != nil {
		return "", nil, os.NewSyscallError("sendmsg", err)
	}
	buf := make([]byte, 64<<10)
	oob = make([]byte, syscall.CmsgSpace(16*4))
	n, oobn, _, _, err := syscall.Recvmsg(c, buf, oob, syscall.MSG_CMSG_CLOEXEC)
	for errors.Is(err, syscall.EINTR) {
		n, oobn, _, _, err = syscall.Recvmsg(c, buf, oob, syscall.MSG_CMSG_CLOEXEC)
	}
	switch {
	case err != nil:
		return "", nil, os.NewSyscallError("recvmsg", err)
	case n == 0:
		return "", nil, syscall.ECONNRESET // the keeper went away
	}
	fds, _ := rights(oob[:oobn])
	reply := string(buf[:n])
	rest, ok := strings.CutPrefix(reply, "ok")
	if !ok {
		closeAll(fds)
		if msg, ok := strings.CutPrefix(reply, "err "); ok {
			return "", nil, errors.New(msg)
		}
		return "", nil, fmt.Errorf("unexpected answer %q", reply)
	}
	return strings.TrimPrefix(rest, " "), fds, nil
}

// ask speaks one request to k's keeper (what names it in errors).
func (k Keeper) ask(what, req string) (string, []int, error) {
	c, err := k.dial()
	if err != nil {
		return "", nil, fmt.Errorf("portlock: %s: %w", k, err)
	}
	defer func() { _ = syscall.Close(c) }()
	got, fds, err := call(c, req, nil)
	if err != nil {
		return "", nil, fmt.Errorf("portlock: %s: %s: %w", k, what, err)
	}
	return got, fds, nil
}

func (k Keeper) hold(ttl time.Duration, locks []*Lock) error {
	var err error
	for try := 0; try < 3; try++ {
		var c int
		c, err = k.dial()
		if errors.Is(err, ErrNoKeeper) {
			if err = k.launch(); err == nil {
				c, err = k.dial()
			}
		}
		if err != nil {
			continue
		}
		err = k.send(c, ttl, locks)
		_ = syscall.Close(c)
		if err == nil || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			break
		}
		// The keeper was leaving as we came (it held nothing): start
		// another.
	}
	if err != nil {
		return fmt.Errorf("portlock: hand locks to %s: %w", k, err)
	}
	return nil
}

func (k Keeper) send(c int, ttl time.Duration, locks []*Lock) error {
	for _, l := range locks {
		files, err := l.Files()
		if err != nil {
			return err
		}
		_, _, err = call(c, "hold "+strconv.FormatInt(int64(ttl), 10)+" "+key(l.network, l.addr, l.port), files)
		for _, f := range files {
			_ = f.Close()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", l, err)
		}
	}
	return nil
}

func (k Keeper) drop(key string) (bool, error) {
	got, _, err := k.ask("drop "+key, "drop "+key)
	if errors.Is(err, ErrNoKeeper) {
		return false, nil
	}
	return got == "1", err
}

func (k Keeper) take(key string) ([]handle, error) {
	_, fds, err := k.ask("take "+key, "take "+key)
	if errors.Is(err, ErrNoKeeper) || errors.Is(err, syscall.ECONNRESET) {
		return nil, nil // none runs, or it left, holding nothing
	} else if err != nil || len(fds) == 0 {
		return nil, err // an error, or it does not hold it
	}
	hs := make([]handle, len(fds))
	for i, fd := range fds {
		hs[i] = sock(fd)
	}
	return hs, nil
}

func (k Keeper) renew(ttl time.Duration) (int, error) {
	got, _, err := k.ask("renew", "renew "+strconv.FormatInt(int64(ttl), 10))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(got)
}

// launch starts k's keeper and waits until it listens. A keeper that
// another process started meanwhile will do as well.
func (k Keeper) launch() error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer func() { _ = pr.Close() }()
	// What ps shows, and what berth ls names a lock's holder by.
	args := []string{"berth-keeper", "pid", strconv.Itoa(k.pid)}
	if k.holder != "" {
		args = []string{"berth-keeper", "holder", k.holder}
	}
	err = self(args, "1 "+k.spec(), pw).Run()
	_ = pw.Close()
	if err != nil {
		return fmt.Errorf("start keeper: %w", err)
	}
	_ = pr.SetReadDeadline(time.Now().Add(ioTimeout))
	buf := make([]byte, 256)
	n, _ := pr.Read(buf)
	switch got := strings.TrimSpace(string(buf[:n])); got {
	case "ready", "exists":
		return nil
	case "gone":
		return fmt.Errorf("start keeper: pid %d has exited", k.pid)
	case "":
		return errors.New("start keeper: it did not start")
	default:
		return fmt.Errorf("start keeper: %s", got)
	}
}

// self is this program again as a keeper (keeperEnv set to spec), in a
// session of its own, handed ready. A first copy starts the keeper and
// exits: the keeper is nobody's child then, and leaves no zombie behind in
// a program that runs on.
func self(args []string, spec string, ready *os.File) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = args
	cmd.Env = []string{keeperEnv + "=" + spec}
	cmd.ExtraFiles = []*os.File{ready}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// keeperMain runs a program started as a keeper, and returns its exit code.
func keeperMain(spec string) int {
	stage, spec, _ := strings.Cut(spec, " ")
	ready := os.NewFile(3, "ready")
	if stage == "1" {
		if err := self(os.Args, "2 "+spec, ready).Start(); err != nil {
			fmt.Fprintf(ready, "%v", err)
			return 1
		}
		return 0
	}
	// Named for ps, top and berth who, which read the name the kernel
	// keeps (the executable's, else).
	name := []byte("berth-keeper\x00")
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0)
	k, err := runKeeper(spec, ready)
	if err != nil {
		fmt.Fprintf(ready, "%v", err)
		return 1
	}
	k.serve()
	return 0
}

// kept is a lock a keeper holds: its descriptors, and for a holder's
// keeper when its lease ends.
type kept struct {
	fds []int
	end time.Time
}

type keeper struct {
	ln     int
	holder bool
	uid    int
	gone   chan struct{} // closed when the owner process exits

	mu    sync.Mutex // guards held, conns and empty
	held  map[string]kept
	conns int
	empty time.Time // when the keeper last held nothing and had no connection
	wake  chan struct{}
}

// firstGrace is how long a new keeper waits for its first lock; idleGrace
// how long it stays once it holds nothing and nobody speaks to it.
const (
	firstGrace = 30 * time.Second
	idleGrace  = time.Second
)

func runKeeper(spec string, ready *os.File) (*keeper, error) {
	f := strings.Fields(spec)
	k := &keeper{held: map[string]kept{}, uid: os.Getuid(), gone: make(chan struct{}), wake: make(chan struct{}, 1)}
	switch {
	case len(f) == 2 && f[0] == "h":
		k.holder = true
	case len(f) == 3 && f[0] == "p":
		pid, err1 := strconv.Atoi(f[1])
		start, err2 := strconv.ParseUint(f[2], 10, 64)
		if err := cmp.Or(err1, err2); err != nil {
			return nil, err
		}
		if err := watch(pid, start, k.gone); err != nil {
			return nil, err // keeperMain writes it: "gone", or why pid cannot be watched
		}
	default:
		return nil, fmt.Errorf("keeper: bad spec %q", spec)
	}
	ln, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Bind(ln, &syscall.SockaddrUnix{Name: "@" + prefix + "keep/" + strings.Join(f, "/")}); err != nil {
		_ = syscall.Close(ln)
		if err == syscall.EADDRINUSE {
			fmt.Fprint(ready, "exists")
			os.Exit(0)
		}
		return nil, err
	}
	if err := syscall.Listen(ln, 64); err != nil {
		return nil, err
	}
	k.ln = ln
	k.empty = time.Now().Add(firstGrace - idleGrace)
	fmt.Fprint(ready, "ready")
	_ = ready.Close()
	return k, nil
}

// watch closes gone when process pid, started at start, exits; an error
// when it is not running now.
func watch(pid int, start uint64, gone chan struct{}) error {
	const sysPidfdOpen = 434 // the same number on every architecture
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 && errno != syscall.ENOSYS {
		return errno
	}
	if s, err := startOf(pid); err != nil || s != start {
		return errors.New("gone")
	}
	go func() {
		defer close(gone)
		if errno == syscall.ENOSYS {
			for {
				time.Sleep(200 * time.Millisecond)
				if s, err := startOf(pid); err != nil || s != start {
					return
				}
			}
		}
		// A pidfd polls readable once its process has exited.
		pfd := pollFd{fd: int32(fd), events: 1 /* POLLIN */}
		for {
			_, _, e := syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&pfd)), 1, ^uintptr(0))
			if e != syscall.EINTR {
				return
			}
		}
	}()
	return nil
}

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

// serve runs the keeper until its owner is gone, or it holds nothing and
// nobody has spoken to it for idleGrace.
func (k *keeper) serve() {
	go k.accept()
	for {
		k.mu.Lock()
		now := time.Now()
		next := now.Add(time.Hour)
		for key, h := range k.held {
			switch {
			case h.end.IsZero():
			case !now.Before(h.end):
				closeAll(h.fds)
				delete(k.held, key)
			case h.end.Before(next):
				next = h.end
			}
		}
		if len(k.held) == 0 && k.conns == 0 {
			if k.empty.IsZero() {
				k.empty = now
			}
			if idle := k.empty.Add(idleGrace); !now.Before(idle) {
				_ = syscall.Close(k.ln) // no one can reach it any more
				k.mu.Unlock()
				return
			} else if idle.Before(next) {
				next = idle
			}
		} else {
			k.empty = time.Time{}
		}
		k.mu.Unlock()
		t := time.NewTimer(time.Until(next))
		select {
		case <-k.gone:
			// Let go now: built with -race, a program sleeps a second as it exits.
			k.mu.Lock()
			for _, h := range k.held {
				closeAll(h.fds)
			}
			k.mu.Unlock()
			return
		case <-k.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func (k *keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *keeper) accept() {
	for {
		fd, _, err := syscall.Accept4(k.ln, syscall.SOCK_CLOEXEC)
		if err == syscall.EINTR || err == syscall.ECONNABORTED {
			continue
		}
		if err != nil {
			return // closed: the keeper leaves
		}
		cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err != nil || (int(cred.Uid) != k.uid && cred.Uid != 0) {
			_ = syscall.Close(fd)
			continue
		}
		k.mu.Lock()
		k.conns++
		k.mu.Unlock()
		go k.talk(fd)
	}
}

// talk answers the requests of one connection.
func (k *keeper) talk(fd int) {
	defer func() {
		_ = syscall.Close(fd)
		k.mu.Lock()
		k.conns--
		k.mu.Unlock()
		k.poke()
	}()
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(16*4))
	for {
		n, oobn, flags, _, err := syscall.Recvmsg(fd, buf, oob, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		fds, ferr := rights(oob[:oobn])
		if flags&syscall.MSG_CTRUNC != 0 && ferr == nil {
			ferr = errors.New("too many descriptors")
		}
		reply, give := k.handle(string(buf[:n]), fds, ferr) // give: descriptors that go with the answer (take)
		var oob []byte
		if len(give) > 0 {
			oob = syscall.UnixRights(give...)
		}
		err = syscall.Sendmsg(fd, []byte(reply), oob, nil, 0)
		closeAll(give) // the taker has its own copies now, or the send failed
		if err != nil {
			return
		}
		k.poke()
	}
}

func rights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := syscall.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// handle carries out one request, which came with fds and ferr, and returns
// the answer, and for take the descriptors that go with it, which the caller
// sends and closes.
func (k *keeper) handle(req string, fds []int, ferr error) (string, []int) {
	f := strings.Fields(req)
	hold := len(f) == 3 && f[0] == "hold" && len(fds) > 0 && ferr == nil
	if !hold {
		closeAll(fds)
	}
	if ferr != nil {
		return "err " + ferr.Error(), nil
	} else if len(f) == 0 {
		return "err empty request", nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case hold:
		ttl, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			closeAll(fds)
			return "err bad ttl", nil
		}
		h := kept{fds: fds}
		if k.holder {
			h.end = time.Now().Add(time.Duration(ttl))
		}
		if old, ok := k.held[f[2]]; ok {
			closeAll(old.fds) // copies of the same lock: the new ones keep it
		}
		k.held[f[2]] = h
		return "ok", nil
	case (f[0] == "drop" || f[0] == "take") && len(f) == 2:
		h, ok := k.held[f[1]]
		if !ok {
			return "ok 0", nil
		}
		delete(k.held, f[1])
		if f[0] == "take" {
			return "ok", h.fds
		}
		closeAll(h.fds)
		return "ok 1", nil
	case f[0] == "renew" && len(f) == 2:
		ttl, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return "err bad ttl", nil
		}
		end := time.Now().Add(time.Duration(ttl))
		for key, h := range k.held {
			if k.holder {
				h.end = end
			}
			k.held[key] = h
		}
		return "ok " + strconv.Itoa(len(k.held)), nil
	case f[0] == "list" && len(f) == 1:
		keys := make([]string, 0, len(k.held))
		for key := range k.held {
			keys = append(keys, key)
		}
		return strings.TrimSpace("ok " + strings.Join(keys, " ")), nil
	}
	return "err unknown request " + strconv.Quote(f[0]), nil
}

// startOf reads the start of process pid as the kernel records it: field
// 22 of /proc/PID/stat, clock ticks since boot.
func startOf(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("portlock: pid %d: %w", pid, err)
	}
	// The name, field 2, is in parentheses and may hold anything.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 20 || !strings.Contains(string(b), ")") {
		return 0, fmt.Errorf("portlock: pid %d: unreadable stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("portlock: pid %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
