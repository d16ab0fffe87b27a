package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/who"
	"github.com/berth-go/berth/store"
)

// Environment of the processes the supervisor starts.
const (
	envRole    = "BERTH_TORTURE_ROLE" // "worker", "fleet" or "child"
	envDir     = "BERTH_TORTURE_DIR"  // the run's directory
	envRange   = "BERTH_TORTURE_RANGE"
	envSeed    = "BERTH_TORTURE_SEED"
	envChild   = "BERTH_TORTURE_CHILD"   // a child's key and lifetime: proto,addr,port,ms
	envProc    = "BERTH_TORTURE_PROC"    // the process's name in the logs
	envTimeout = "BERTH_TORTURE_TIMEOUT" // bound of every portalloc call, a Go duration
	envStore   = "BERTH_TORTURE_STORE"   // the run's PostgreSQL connection string, if any
	envHost    = "BERTH_TORTURE_HOST"    // the worker's fleet host (Config.Host), with a store
	envLeases  = "BERTH_TORTURE_LEASES"  // "1": the worker also holds ports under leases (-leases)
	envFDs     = "BERTH_TORTURE_FDS"     // "1": the worker runs under descriptor pressure (-fd-pressure)
	envFaults  = "BERTH_TORTURE_FAULTS"  // "1": the run restarts its server or fails over (-pg-restart-every, -failover-every)
)

// MaybeRunRole runs this process as a worker or child of a torture run when
// the supervisor started it as one, and then exits. Otherwise it returns.
// Programs that run the harness (and their tests) call it first thing.
func MaybeRunRole() {
	var err error
	switch os.Getenv(envRole) {
	case "":
		return
	case "worker":
		err = runWorker()
	case "child":
		err = runChild()
	case "fleet":
		err = runFleetWorker()
	default:
		err = fmt.Errorf("unknown role %q", os.Getenv(envRole))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Addresses workers draw from.
var addrs = []netip.Addr{
	netip.MustParseAddr("127.0.0.1"),
	netip.MustParseAddr("::1"),
	netip.MustParseAddr("0.0.0.0"),
	netip.MustParseAddr("::"),
}

const maxHeld = 32 // per worker, so a small range runs full

// workerEnv is what the supervisor tells a worker or a fleet worker
// through its environment, and the log it opens.
type workerEnv struct {
	log     *eventLog
	rangeOf store.Range
	timeout time.Duration
	proc    string
	rng     *rand.Rand
	seed    uint64
	leases  bool // Config.Leases
	fds     bool // Config.FDPressure
	// faults: the run restarts its server or fails over, and a call that
	// finds it out of reach is counted, not an error.
	faults bool
}

// startWorker reads the worker's environment and opens its log. Its
// context ends when the supervisor closes the worker's stdin, which is
// how it ends a run.
func startWorker() (workerEnv, context.Context, context.CancelFunc, error) {
	var env workerEnv
	r, err := store.ParseRange(os.Getenv(envRange))
	if err != nil {
		return env, nil, nil, err
	}
	timeout, err := time.ParseDuration(os.Getenv(envTimeout))
	if err != nil {
		return env, nil, nil, fmt.Errorf("%s: %w", envTimeout, err)
	}
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	env = workerEnv{rangeOf: r, timeout: timeout, seed: seed, proc: os.Getenv(envProc), rng: rand.New(rand.NewPCG(seed, uint64(os.Getpid()))),
		leases: os.Getenv(envLeases) == "1", fds: os.Getenv(envFDs) == "1", faults: os.Getenv(envFaults) == "1"}
	if env.log, err = openLog(os.Getenv(envDir), env.proc); err != nil {
		return env, nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return env, ctx, cancel, nil
}

// runWorker loops doing random operations until its stdin closes, then
// releases everything and exits.
func runWorker() error {
	env, ctx, cancel, err := startWorker()
	if err != nil {
		return err
	}
	defer func() { _ = env.log.f.Close() }()
	defer cancel()
	log := env.log
	cfg := portalloc.Config{
		Mode: portalloc.ModeStateStore, StateDir: filepath.Join(os.Getenv(envDir), "state"),
		StoreDSN: os.Getenv(envStore), Host: os.Getenv(envHost),
		Range: env.rangeOf, AllowEphemeralOverlap: true, Timeout: env.timeout,
	}
	// The checker places the comparisons with the store after a restart
	// or a failover by the repair events this logs, and reads the keys of
	// failed probes; the store's other decisions go in the log.
	errs := portalloc.TextLogger(os.Stderr, slog.LevelError).GetSink()
	cfg.Logger = logr.New(repairSink{log: log, errs: errs, probeKeys: env.faults || cfg.Host != ""})
	a, err := open(ctx, log, cfg, env.faults)
	if err != nil {
		if ctx.Err() != nil {
			return nil // told to stop while it opened the store
		}
		log.add(Event{Kind: KindError, Err: err.Error()})
		return err
	}
	w := &worker{workerEnv: env, a: a, held: map[store.Reservation]io.Closer{}}
	if env.leases {
		w.leases = map[string]*leased{}
	}
	var stopPressure func()
	if env.fds {
		w.press, stopPressure = startPressure(ctx, log, rand.New(rand.NewPCG(env.seed, uint64(os.Getpid())+1)))
	}
	for ctx.Err() == nil {
		w.step(ctx)
	}
	if stopPressure != nil {
		stopPressure() // the limit is back: the releases below need no luck
	}
	for r, sock := range w.held {
		w.release(ctx, r, sock)
	}
	for _, l := range w.leases {
		w.endLease(l, KindRelease, "")
		w.giveBackLease(ctx, l)
	}
	w.retryReleases(ctx)
	log.add(Event{Kind: KindExit, Reaped: a.Stats().Reaped})
	return a.Close()
}

// open makes the worker's Allocator. Opening waits for the store's locks
// like any call, and a worker frozen while it holds one makes it time out:
// that is counted as a call that timed out, and the worker tries again;
// so is a store lost under each of the open's attempts (-lose-store), and
// a server out of reach while the run restarts it or fails over (faults).
func open(ctx context.Context, log *eventLog, cfg portalloc.Config, faults bool) (*portalloc.Allocator, error) {
	for {
		start := time.Now()
		a, err := fleet.New(ctx, cfg)
		switch {
		case ctx.Err() != nil:
			return a, err
		case timedOut(err):
			log.add(Event{Kind: KindCall, Op: "open", DurNS: int64(time.Since(start)), Timeout: true, Err: err.Error()})
		case errors.Is(err, store.ErrLost):
			// The store was lost again and again while it opened (its
			// directory removed every second or so, and a frozen worker
			// holding the lock the opener waited for): a program opens it
			// again, as this worker does.
			log.add(Event{Kind: KindCall, Op: "open", DurNS: int64(time.Since(start)), Lost: true, Err: err.Error()})
			time.Sleep(10 * time.Millisecond)
		case faults && errors.Is(err, store.ErrUnavailable):
			log.add(Event{Kind: KindCall, Op: "open", DurNS: int64(time.Since(start)), Unavailable: true, Err: err.Error()})
			time.Sleep(50 * time.Millisecond) // the server is starting
		default:
			return a, err
		}
	}
}

type worker struct {
	workerEnv
	a      *portalloc.Allocator
	nchild int                             // children started, for their names
	held   map[store.Reservation]io.Closer // the grants the worker holds, with the sockets proving them
	probes int64                           // the allocator's probe failures logged so far
	// leases holds the worker's leases by holder (-leases; nil without),
	// nlease counts those asked for, for their holders' names.
	leases map[string]*leased
	nlease int
	press  *pressure // the worker's descriptor pressure (-fd-pressure; nil without)
	// unreleased are grants whose release failed for a passing reason (a
	// shortage, a timeout): their rows are the live worker's until it
	// releases them, so it tries again.
	unreleased []store.Reservation
	retried    time.Time // when retryReleases last ran from step
}

// retryGap spaces the tries of failed releases while the worker goes on:
// a server that is restarting refuses each at once.
const retryGap = 50 * time.Millisecond

// call runs one portalloc call bounded by the run's timeout (Allocate and
// Reserve also bound themselves by it), and logs that it returned, how
// long it took, and whether it gave up waiting.
func (w *worker) call(ctx context.Context, op string, f func(ctx context.Context) error) error {
	err := timedCall(ctx, w.log, w.timeout, op, f, w.faults)
	if n := w.a.Stats().ProbeFailures; n > w.probes {
		w.log.add(Event{Kind: KindProbe, Op: op, Probes: n - w.probes})
		w.probes = n
	}
	return err
}

// timedCall is call without the probe count. With faults, a call that found the server
// out of reach (unavailable) is marked so.
func timedCall(ctx context.Context, log *eventLog, timeout time.Duration, op string, f func(ctx context.Context) error, faults bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	e := Event{Kind: KindCall, Op: op, DurNS: int64(time.Since(start)), Grace: errors.Is(err, store.ErrGrace)}
	switch {
	case timedOut(err):
		e.Timeout, e.Err = true, err.Error()
	case errors.Is(err, store.ErrTransient):
		e.Transient, e.Err = true, err.Error()
	case errors.Is(err, store.ErrLost):
		e.Lost, e.Err = true, err.Error()
	case faults && unavailable(err):
		e.Unavailable, e.Err = true, err.Error()
	}
	log.add(e)
	return err
}

// unavailable reports whether err says the PostgreSQL server could not be
// reached or went away: portalloc's ErrStoreUnavailable, or the
// store.ErrStorage of pgstore's own calls.
func unavailable(err error) bool {
	return errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrStorage)
}

// timedOut reports whether err says a call gave up waiting: for its
// deadline, or for a store another process kept locked. A call cut short
// because the run ended did not time out.
func timedOut(err error) bool {
	return !errors.Is(err, context.Canceled) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrBusy))
}

func (w *worker) step(ctx context.Context) {
	if w.leases != nil {
		w.leaseSteps(ctx)
	}
	if len(w.unreleased) > 0 && time.Since(w.retried) >= retryGap {
		w.retried = time.Now()
		w.retryReleases(ctx)
	}
	switch n := w.rng.IntN(100); {
	case n < 35 && len(w.held) < maxHeld:
		w.grant(ctx, false)
	case n < 50 && len(w.held) < maxHeld:
		w.grant(ctx, true)
	case n < 80 && len(w.held) > 0:
		for r, sock := range w.held { // a random one: map order
			w.release(ctx, r, sock)
			break
		}
	case n < 85:
		w.handoff(ctx)
	default:
		time.Sleep(time.Duration(1+w.rng.IntN(10)) * time.Millisecond)
	}
}

func (w *worker) request() portalloc.Request {
	proto := store.TCP
	if w.rng.IntN(2) == 0 {
		proto = store.UDP
	}
	return portalloc.Request{Protocol: proto, Addr: addrs[w.rng.IntN(len(addrs))], Label: "torture"}
}

// grant allocates (or reserves a random port of the range), logs the grant,
// and binds it at once: a duplicate grant is then caught by the kernel.
func (w *worker) grant(ctx context.Context, static bool) {
	req := w.request()
	start := time.Now()
	r, err := w.ask(ctx, req, static, "")
	dur := time.Since(start)
	switch {
	case err == nil:
	case errors.Is(err, store.ErrExhausted):
		w.log.add(Event{Kind: KindExhausted, DurNS: int64(dur)})
		return
	case errors.Is(err, store.ErrHeld):
		var ce *store.ConflictError
		if errors.As(err, &ce) && ce.Holder.Owner.Holder != "" {
			// A fleet-wide port: the store kept it off this host.
			w.log.add(Event{Kind: KindLeaseHeld, Proto: string(req.Protocol), Addr: req.Addr.String(), Port: ce.Key.Port})
		}
		return
	case ctx.Err() != nil, timedOut(err), errors.Is(err, store.ErrTransient), errors.Is(err, store.ErrGrace), w.faults && unavailable(err):
		return // counted with the call
	default:
		w.log.add(Event{Kind: KindError, Err: unexpected(err)})
		return
	}
	if _, mine := w.held[r]; mine {
		return // Reserve of a key this worker holds returns it again
	}
	w.granted(r)
	w.log.add(Event{Kind: KindGrant, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Static: static, DurNS: int64(dur), Reaped: w.a.Stats().Reaped})
	sock, ok := w.bindGrant(ctx, r, "")
	if !ok {
		w.giveBack(ctx, r)
		return
	}
	w.held[r] = sock
}

// ask allocates a port for req, or reserves a random port of the range
// (static), through w.call; the call's name ends in suffix.
func (w *worker) ask(ctx context.Context, req portalloc.Request, static bool, suffix string) (r store.Reservation, err error) {
	op := "allocate"
	if static {
		op = "reserve"
	}
	err = w.call(ctx, op+suffix, func(ctx context.Context) (err error) {
		if static {
			port := w.rangeOf.First + uint16(w.rng.IntN(w.rangeOf.Size()))
			r, err = w.a.Reserve(ctx, req, port)
		} else {
			r, err = w.a.Allocate(ctx, req)
		}
		return err
	})
	return r, err
}

// unexpected says what an unexpected error of a call is; a shortage of
// descriptors that does not wrap store.ErrTransient, as the package
// promises, says so.
func unexpected(err error) string {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return "a shortage of descriptors that does not wrap store.ErrTransient: " + err.Error()
	}
	return err.Error()
}

// bindGrant binds r, granted to the worker (to holder, if not ""), and
// logs the bind. A bind that fails for want of descriptors (the worker's
// own pressure) is logged as such, not as a conflict, and tried again
// once the spell is over: a grant must still meet the kernel. When the
// bind fails for good, it logs the grant's release, so its claim ends
// there and the failure is counted once, not again as every later grant
// of the port; the caller then gives the grant back.
func (w *worker) bindGrant(ctx context.Context, r store.Reservation, holder string) (io.Closer, bool) {
	for try := 0; ; try++ {
		sock, err := bind(r)
		e := Event{Kind: KindBind, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Holder: holder}
		switch {
		case err == nil:
			w.log.add(e)
			return sock, true
		case w.press != nil && (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)):
			e.Err, e.EMFILE = err.Error(), true
			w.log.add(e)
			if try < 3 && w.press.wait(ctx, 5*time.Second) {
				continue
			}
		default:
			e.Err = err.Error() + boundBy(ctx, string(r.Protocol), r.Port)
			w.log.add(e)
		}
		w.log.add(Event{Kind: KindRelease, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Holder: holder})
		return nil, false
	}
}

// release closes the socket first, logs, then releases: the logged claim
// ends before any other process can be granted the port.
func (w *worker) release(ctx context.Context, r store.Reservation, sock io.Closer) {
	_ = sock.Close()
	w.log.add(Event{Kind: KindRelease, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port})
	delete(w.held, r)
	// Releases run even after the run's context ends: that is when a
	// worker gives back everything it holds. One that times out leaves a
	// row of this live worker, reaped once it exits.
	w.giveBack(ctx, r)
}

// giveBack releases a grant whose claim the log has ended. A release
// that fails for a passing reason is tried again later (retryReleases):
// the row stays the live worker's meanwhile, and no one else may have it.
func (w *worker) giveBack(ctx context.Context, r store.Reservation) {
	err := w.call(context.WithoutCancel(ctx), "release", func(ctx context.Context) error { return w.a.Release(ctx, r) })
	switch {
	case err == nil, errors.Is(err, store.ErrNotFound):
	case timedOut(err), errors.Is(err, store.ErrTransient), w.faults && unavailable(err):
		w.unreleased = append(w.unreleased, r)
	default:
		w.log.add(Event{Kind: KindError, Err: "release: " + unexpected(err)})
	}
}

// granted forgets a failed release of r, now granted to the worker
// again: trying it again would release the new grant, whose socket the
// worker binds. The Allocator itself does again a release of its that
// failed on a fleet's store, unless the key is held again.
func (w *worker) granted(r store.Reservation) {
	w.unreleased = slices.DeleteFunc(w.unreleased, func(x store.Reservation) bool {
		return x.Protocol == r.Protocol && x.Addr == r.Addr && x.Port == r.Port
	})
}

// retryReleases tries the releases that failed for a passing reason once
// more each.
func (w *worker) retryReleases(ctx context.Context) {
	rs := w.unreleased
	w.unreleased = nil
	for _, r := range rs {
		w.giveBack(ctx, r)
	}
}

// handoff allocates a port for a short-lived child, transfers the
// reservation to it, and lets it bind. The child waits for the go-ahead,
// so it never binds a port that is not yet its own.
func (w *worker) handoff(ctx context.Context) {
	start := time.Now()
	r, err := w.ask(ctx, w.request(), false, "")
	if err != nil {
		return
	}
	w.granted(r)
	w.log.add(Event{Kind: KindGrant, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Handoff: true, DurNS: int64(time.Since(start))})
	self, err := os.Executable()
	if err != nil {
		w.log.add(Event{Kind: KindError, Err: err.Error()})
		return
	}
	w.nchild++
	child := fmt.Sprintf("%s.%d", w.proc, w.nchild)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envRole+"=child", envProc+"="+child,
		fmt.Sprintf("%s=%s,%s,%d,%d", envChild, r.Protocol, r.Addr, r.Port, 20+w.rng.IntN(200)))
	// Half the children inherit the reservation's lock (Files), so that
	// Transfer finds it held there; the others get it from a keeper.
	var locks []*os.File
	if w.rng.IntN(2) == 0 {
		locks, err = w.a.Files(r)
		cmd.ExtraFiles = locks
	}
	var goAhead io.WriteCloser
	if err == nil {
		goAhead, err = cmd.StdinPipe()
	}
	if err == nil {
		err = cmd.Start()
	}
	for _, f := range locks {
		_ = f.Close()
	}
	if err != nil {
		// In a spell, a start can also fail with EBADF: the fork's child
		// could not set up its descriptors under the lowered limit (seen
		// once in 1.6 million grants, with the limit at the count open).
		short := w.press != nil && (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || (errors.Is(err, syscall.EBADF) && w.press.on()))
		if short {
			w.log.add(Event{Kind: KindShort, Op: "start child", Err: err.Error()})
		} else {
			w.log.add(Event{Kind: KindError, Err: "start child: " + err.Error()})
		}
		w.log.add(Event{Kind: KindRelease, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port})
		w.giveBack(ctx, r)
		return
	}
	go func() {
		_ = cmd.Wait()
		w.log.add(Event{Kind: KindChildGone, Child: child})
	}()
	if err := w.call(ctx, "transfer", func(ctx context.Context) error { return w.a.Transfer(ctx, r, cmd.Process.Pid) }); err != nil {
		_ = goAhead.Close() // the child exits without binding
		w.log.add(Event{Kind: KindRelease, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port})
		w.giveBack(ctx, r)
		return
	}
	w.log.add(Event{Kind: KindTransfer, Proto: string(r.Protocol), Addr: r.Addr.String(), Port: r.Port, Child: child})
	_, _ = goAhead.Write([]byte{1})
	_ = goAhead.Close()
}

// runChild waits for the go-ahead, binds its port, holds it for a while,
// and exits; its reservation is reaped after it.
func runChild() error {
	parts := strings.Split(os.Getenv(envChild), ",")
	if len(parts) != 4 {
		return fmt.Errorf("%s=%q: want proto,addr,port,ms", envChild, os.Getenv(envChild))
	}
	proto, addr := parts[0], parts[1]
	port, _ := strconv.Atoi(parts[2])
	ms, _ := strconv.Atoi(parts[3])
	log, err := openLog(os.Getenv(envDir), os.Getenv(envProc))
	if err != nil {
		return err
	}
	defer func() { _ = log.f.Close() }()
	ev := func(kind string) Event { return Event{Kind: kind, Proto: proto, Addr: addr, Port: uint16(port)} }
	// Without the go-ahead the worker gave up on the handoff, or died
	// before it. A child that cannot bind exits at once: its claim ends
	// there, and the failure is counted once, not again as every later
	// grant of the port.
	if b, _ := io.ReadAll(io.LimitReader(os.Stdin, 1)); len(b) > 0 {
		r := store.Reservation{Key: store.Key{Protocol: store.Protocol(proto), Addr: netip.MustParseAddr(addr), Port: uint16(port)}}
		e := ev(KindChildBind)
		sock, err := bind(r)
		if err != nil {
			e.Err = err.Error() + boundBy(context.Background(), proto, uint16(port))
		}
		log.add(e)
		if err == nil {
			time.Sleep(time.Duration(ms) * time.Millisecond)
			_ = sock.Close()
		}
	}
	log.add(ev(KindChildExit))
	return nil
}

// bind listens on exactly what r grants, as its consumer would.
func bind(r store.Reservation) (io.Closer, error) {
	if r.Protocol == store.UDP {
		return net.ListenPacket("udp", r.AddrPort().String())
	}
	return net.Listen("tcp", r.AddrPort().String())
}

// boundBy says who had network port when a bind was refused: its sockets
// and its locks as package who sees them, with the processes that hold them.
func boundBy(ctx context.Context, network string, port uint16) string {
	reps, err := who.Lookup(ctx, nil, port)
	if err != nil {
		return " (who: " + err.Error() + ")"
	}
	s := slices.DeleteFunc(reps[0].Sockets, func(s who.Socket) bool { return string(s.Protocol) != network })
	l := slices.DeleteFunc(reps[0].Locks, func(l who.Lock) bool { return string(l.Protocol) != network })
	return fmt.Sprintf(" (sockets %+v, locks %+v, error %v)", s, l, reps[0].SocketsErr)
}
