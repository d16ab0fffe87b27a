package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	// flockHolder takes the store's write lock the way a berth process
	// does (the flock of <db>.lock) and holds it until stdin closes.
	extraWorkers["flockholder"] = func(_ context.Context, db string, out *json.Encoder, wait func()) error {
		fd, err := unix.Open(db+".lock", unix.O_RDWR|unix.O_CREAT, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
			return err
		}
		_ = out.Encode(event{Event: "locked"})
		wait()
		return nil
	}
	// tryhold reserves tcp 127.0.0.1:BERTH_TEST_LO and says "done" (then
	// holds it until stdin closes) or "refused".
	extraWorkers["tryhold"] = func(ctx context.Context, db string, out *json.Encoder, wait func()) error {
		s, err := statestore.Open(ctx, db, statestore.Options{SweepInterval: -1})
		if err != nil {
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		defer s.Close()
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_LO"))
		key := store.Key{Protocol: store.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(port)}
		if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
			if errors.Is(err, store.ErrHeld) {
				return out.Encode(event{Event: "refused"})
			}
			return out.Encode(event{Event: "error", Error: err.Error()})
		}
		_ = out.Encode(event{Event: "done"})
		wait()
		return nil
	}
}

// TestStoppedLockHolderNamed: when a process stopped with SIGSTOP holds the
// write lock, a call gives up after BusyTimeout with ErrBusy and names the
// holder's pid, saying it is stopped.
func TestStoppedLockHolderNamed(t *testing.T) {
	ctx := context.Background()
	_, path := open(t)
	pid, letGo := stoppedHolder(t, path)
	s2 := openBusy(t, path, 300*time.Millisecond)
	start := time.Now()
	_, err := s2.Reserve(ctx, store.Request{Key: tcp(lo4, 30400)})
	took := time.Since(start)
	if !errors.Is(err, store.ErrBusy) {
		t.Fatalf("Reserve under a stopped lock holder = %v; want ErrBusy", err)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("pid %d", pid)) || !strings.Contains(msg, "stopped") {
		t.Errorf("error = %q; want it to name pid %d and say it is stopped", msg, pid)
	}
	if took > 5*time.Second {
		t.Errorf("Reserve took %v with BusyTimeout 300ms", took)
	}
	// Continued, the holder lets go when told, and the store works.
	letGo()
	if _, err := s2.Reserve(ctx, store.Request{Key: tcp(lo4, 30400)}); err != nil {
		t.Errorf("Reserve after the holder let go = %v", err)
	}
}

// TestHolderSurvivesClockSteps: a live holder's reservation is never handed
// to an intruder, whatever the wall clock does in between: +300 s, -300 s,
// and 0.6 s steps across a second boundary. The clock is set back from the
// monotonic clock after each step, and in a cleanup should the test fail.
func TestHolderSurvivesClockSteps(t *testing.T) {
	trueNow, setClock := takeClock(t)

	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "berth.db")
	holder := startWorker(t, "tryhold", path, "BERTH_TEST_LO=30500")
	holder.until(t, "done")
	for _, step := range []time.Duration{300 * time.Second, -300 * time.Second, 600 * time.Millisecond, -600 * time.Millisecond} {
		if step%time.Second != 0 {
			// Step from just below (or above) a whole second, so the
			// step crosses one.
			frac := 550 * time.Millisecond
			if step < 0 {
				frac = 250 * time.Millisecond
			}
			now := time.Duration(trueNow() % int64(time.Second))
			time.Sleep((frac - now + time.Second) % time.Second)
		}
		if err := setClock(trueNow() + int64(step)); err != nil {
			if errors.Is(err, unix.EPERM) {
				t.Skipf("stepping the wall clock: %v", err)
			}
			t.Fatal(err)
		}
		// The intruder is a fresh process, which reads every identity and
		// liveness anew while the clock is off.
		intruder := startWorker(t, "tryhold", path, "BERTH_TEST_LO=30500")
		e := intruder.next(t)
		_ = setClock(trueNow())
		if e.Event != "refused" {
			t.Fatalf("clock stepped %v: the intruder said %+v; want it refused port 30500, which a live process holds", step, e)
		}
		_ = intruder.cmd.Wait()
	}
	s := openAt(t, path)
	rs, err := s.List(ctx, store.Filter{})
	if err != nil || len(rs) != 1 || rs[0].Owner.PID != holder.cmd.Process.Pid {
		t.Errorf("rows after the steps = %v, %v; want the holder's one row", rs, err)
	}
}

// TestLockWaitsKeepDescriptors: two stores of one process that wait for
// each other's write lock thousands of times, and one whose waits are
// abandoned under a stopped holder, keep at most two descriptors of the
// lock file each open (the store's own and the waiter's), and every write
// still gets the lock.
func TestLockWaitsKeepDescriptors(t *testing.T) {
	ctx := context.Background()
	s1, path := open(t)
	s2 := openAt(t, path)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		s := s1
		if g%2 == 1 {
			s = s2
		}
		wg.Go(func() {
			for i := range 300 {
				key := tcp(lo4, uint16(31000+g*300+i))
				if _, err := s.Reserve(ctx, store.Request{Key: key}); err != nil {
					errs <- err
					return
				}
				if err := s.Release(ctx, key, store.Owner{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := lockDescriptors(t, path); n > 4 {
		t.Errorf("%d descriptors of the lock file open after contended writes; want at most 4 (two stores)", n)
	}

	// Waits abandoned under a stopped holder: each leaves its descriptor
	// with the blocked waiter until the holder lets go, then none.
	_, letGo := stoppedHolder(t, path)
	s3 := openBusy(t, path, 50*time.Millisecond)
	for i := range 3 {
		if _, err := s3.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(32300+i))}); !errors.Is(err, store.ErrBusy) {
			t.Fatalf("Reserve under a stopped holder = %v; want ErrBusy", err)
		}
	}
	letGo()
	for i := range 50 {
		if _, err := s3.Reserve(ctx, store.Request{Key: tcp(lo4, uint16(32400+i))}); err != nil {
			t.Fatalf("Reserve after the holder let go = %v", err)
		}
	}
	// The abandoned waiters get the lock in turn once the holder is gone,
	// and close their descriptors; give them a moment.
	deadline := time.Now().Add(5 * time.Second)
	for lockDescriptors(t, path) > 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := lockDescriptors(t, path); n > 6 {
		t.Errorf("%d descriptors of the lock file open after abandoned waits; want at most 6 (three stores)", n)
	}
}

// stoppedHolder starts a process that takes the write lock of db, stops it
// with SIGSTOP, and returns its pid and a func that continues it and has it
// let go.
func stoppedHolder(tb testing.TB, db string) (pid int, letGo func()) {
	tb.Helper()
	w := startWorker(tb, "flockholder", db)
	w.until(tb, "locked")
	pid = w.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		tb.Fatal(err)
	}
	reaped := false // once it is, pid may be another process's
	tb.Cleanup(func() {
		if !reaped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	return pid, func() {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = w.stdin.Close()
		_ = w.cmd.Wait()
		reaped = true
	}
}

// openBusy opens db with the given BusyTimeout and no sweep, and closes it
// at the end of the test.
func openBusy(tb testing.TB, db string, busy time.Duration) store.Store {
	tb.Helper()
	s, err := statestore.Open(context.Background(), db, statestore.Options{SweepInterval: -1, BusyTimeout: busy})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// lockDescriptors counts this process's open descriptors of db's lock file.
func lockDescriptors(tb testing.TB, db string) int {
	tb.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Skipf("cannot list descriptors: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == db+".lock" {
			n++
		}
	}
	return n
}
