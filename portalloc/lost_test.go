package portalloc_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// A live holder's store is lost under it: its state directory removed, its
// database replaced by an empty file, or truncated. The holder puts its
// rows back, under their labels, and its own Allocator never hands its
// port out; a file left damaged is left alone, and the holder serves from
// the MRU file. (That no other process gets the port meanwhile, whoever owns
// it, is guarantee_lost_test.go's.)

func init() {
	// lostholder reserves BERTH_TEST_PORT (unbound) in the mode BERTH_MODE
	// and answers commands on stdin: "alloc" allocates from
	// BERTH_TEST_RANGE (which holds the port) and prints the port and
	// "store" or "fallback", "stats" prints Restored and Lost. With
	// BERTH_TEST_NOCHECK it checks its store only when it writes.
	workers["lostholder"] = func(ctx context.Context) error {
		if os.Getenv("BERTH_TEST_NOCHECK") != "" {
			portalloc.SetCheckInterval(time.Hour)
		} else {
			portalloc.SetCheckInterval(20 * time.Millisecond)
		}
		r, err := store.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		cfg := workerConfig()
		cfg.Range, cfg.AllowEphemeralOverlap = r, true
		a, err := portalloc.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		if _, err := a.Reserve(ctx, portalloc.Request{Label: "holder"}, uint16(port)); err != nil {
			return err
		}
		fmt.Println("ready")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "alloc":
				r, err := a.Allocate(ctx, portalloc.Request{Label: "more"})
				if err != nil {
					fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", " "))
					continue
				}
				from := "store"
				if a.Stats().Fallback != "" {
					from = "fallback"
				}
				fmt.Println(r.Port, from)
			case "stats":
				st := a.Stats()
				fmt.Println(st.Restored, st.Lost)
			}
		}
		return sc.Err()
	}
}

func TestHolderPutsBackLostStore(t *testing.T) {
	losses := []struct {
		name string
		lose func(dir string) error
		// damaged: what is left is no store berth may write to: it is
		// left alone, and the holder serves from the MRU file, its own
		// port still locked.
		damaged bool
	}{
		{"state directory removed", func(dir string) error { return os.RemoveAll(dir) }, false},
		{"database replaced by an empty file", func(dir string) error {
			db := filepath.Join(dir, "berth.db")
			if err := os.Remove(db); err != nil {
				return err
			}
			return os.WriteFile(db, nil, 0o600)
		}, false},
		{"database truncated in place", func(dir string) error {
			return os.Truncate(filepath.Join(dir, "berth.db"), 0)
		}, false},
		// What a checkpoint makes of a truncated file: some pages back,
		// not all, which no store can tell from a damaged file.
		{"database truncated to half", func(dir string) error {
			db := filepath.Join(dir, "berth.db")
			fi, err := os.Stat(db)
			if err != nil {
				return err
			}
			return os.Truncate(db, fi.Size()/2)
		}, true},
	}
	for _, loss := range losses {
		for _, check := range []bool{true, false} {
			name := loss.name
			if !check {
				name += ", holder idle"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				first := freeRun(t, 4)
				port := first + 1
				env := []string{"BERTH_STATE_DIR=" + dir, "BERTH_MODE=" + string(portalloc.ModeStateStoreWithFallback), "BERTH_TEST_PORT=" + strconv.Itoa(int(port)),
					"BERTH_TEST_RANGE=" + fmt.Sprintf("%d-%d", first, first+3)}
				if !check {
					env = append(env, "BERTH_TEST_NOCHECK=1")
				}
				holder := spawn(t, "lostholder", env...).ready(t)
				pid := holder.cmd.Process.Pid

				if err := loss.lose(dir); err != nil {
					t.Fatal(err)
				}
				db := filepath.Join(dir, "berth.db")
				left, _ := os.ReadFile(db)
				if check && !loss.damaged {
					// The holder notices by itself, at its next check, and
					// puts its row back.
					deadline := time.Now().Add(20 * time.Second)
					for !holderRowBack(t, dir, port, pid) {
						if time.Now().After(deadline) {
							t.Fatalf("the holder's row of port %d is not back 20s after the loss", port)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				// The holder allocates the rest of its range: never its own
				// port, and from the store (or, from a damaged one, the MRU
				// file).
				from := " store"
				if loss.damaged {
					from = " fallback"
				}
				for range 3 {
					if _, err := fmt.Fprintln(holder.stdin, "alloc"); err != nil {
						t.Fatal(err)
					}
					line := readLine(t, holder)
					if strings.HasPrefix(line, strconv.Itoa(int(port))+" ") {
						t.Errorf("the holder's own Allocate returned its held port %d", port)
					}
					if !strings.HasSuffix(line, from) {
						t.Errorf("holder's alloc = %q; want a port served from the%s", line, from)
					}
				}
				if loss.damaged {
					if now, _ := os.ReadFile(db); string(now) != string(left) {
						t.Error("the damaged file was changed")
					}
					return
				}
				if !holderRowBack(t, dir, port, pid) {
					t.Errorf("the holder's row of port %d is not back after it wrote to the store", port)
				}
				if _, err := fmt.Fprintln(holder.stdin, "stats"); err != nil {
					t.Fatal(err)
				}
				if line := readLine(t, holder); !strings.HasSuffix(line, " 0") || strings.HasPrefix(line, "0 ") {
					t.Errorf("holder's Restored, Lost = %q; want some restored, none lost", line)
				}
			})
		}
	}
}

// holderRowBack reports whether dir's store has the holder's row of port,
// under its label: the store there, whichever it is now, is opened for it
// (a new one if need be, as any berth process would).
func holderRowBack(tb testing.TB, dir string, port uint16, pid int) bool {
	tb.Helper()
	rows := storeRows(tb, dir, store.Filter{Port: port})
	return len(rows) == 1 && rows[0].Owner.PID == pid && rows[0].Label == "holder"
}

// TestTransferAcrossALostStore: a Transfer whose store was lost (its state
// directory removed) before it ran puts the process's rows back in a store
// made anew and hands the row over there: it ends the new owner's, and no
// port is counted lost.
func TestTransferAcrossALostStore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	a := newAllocator(t, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: dir, Logger: (&logCounter{}).logger()})
	r, err := a.Allocate(ctx, portalloc.Request{Label: "child"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.Allocate(ctx, portalloc.Request{Label: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	child := spawn(t, "sleeper")
	t.Cleanup(func() { _ = child.cmd.Process.Kill() }) // it never reads stdin
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := a.Transfer(ctx, r, child.cmd.Process.Pid); err != nil {
		t.Fatalf("Transfer across a lost store = %v; want nil", err)
	}
	if st := a.Stats(); st.Lost != 0 || st.Restored < 1 {
		t.Errorf("Stats() = %+v; want rows restored, none lost", st)
	}
	if h := a.Held(); len(h) != 1 || h[0] != kept {
		t.Errorf("Held() after the transfer = %v; want %v alone", h, kept)
	}
	if rows := storeRows(t, dir, store.Filter{Port: r.Port}); len(rows) != 1 || rows[0].Owner.PID != child.cmd.Process.Pid || rows[0].Label != "child" {
		t.Errorf("rows of port %d = %+v; want one, the child's (pid %d)", r.Port, rows, child.cmd.Process.Pid)
	}
	if rows := storeRows(t, dir, store.Filter{Port: kept.Port}); len(rows) != 1 || rows[0].Owner.PID != os.Getpid() {
		t.Errorf("rows of port %d = %+v; want this process's, put back", kept.Port, rows)
	}
}
