package portalloc_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/internal/marker"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/fleet"
	"github.com/berth-go/berth/portalloc/statedir"
	"github.com/berth-go/berth/store"
)

// A live holder's store is lost under it: its state directory removed, its
// database replaced by an empty file, or truncated in place. No other
// process may get the holder's port at any moment, the holder puts its rows
// back, and its own Allocator never hands the port out.

func init() {
	// lostholder reserves BERTH_TEST_PORT (unbound) in the default mode and
	// answers commands on stdin: "alloc" allocates from BERTH_TEST_RANGE
	// (which holds the port) and prints the port, "stats" prints
	// Restored and Lost. With BERTH_TEST_NOCHECK it checks its store only
	// when it writes, so that marks alone guard its port until then.
	workers["lostholder"] = func(ctx context.Context) error {
		if os.Getenv("BERTH_TEST_NOCHECK") != "" {
			defer portalloc.SetCheckInterval(time.Hour)()
		} else {
			defer portalloc.SetCheckInterval(20 * time.Millisecond)()
		}
		r, err := portalloc.ParseRange(os.Getenv("BERTH_TEST_RANGE"))
		if err != nil {
			return err
		}
		a, err := portalloc.New(ctx, portalloc.Config{StateDir: os.Getenv("BERTH_STATE_DIR"), Range: r, AllowEphemeralOverlap: true})
		if err != nil {
			return err
		}
		defer a.Close()
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
				fmt.Println(r.Port, r.Backend)
			case "stats":
				st := a.Stats()
				fmt.Println(st.Restored, st.Lost, st.Backend)
			}
		}
		return sc.Err()
	}
	// intruder tries, from a new Allocator each time as a fresh `berth
	// get` would, to reserve BERTH_TEST_PORT until stdin closes, and
	// prints "got" each time it does.
	workers["intruder"] = func(ctx context.Context) error {
		port, _ := strconv.Atoi(os.Getenv("BERTH_TEST_PORT"))
		stop := make(chan struct{})
		go func() {
			_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
			close(stop)
		}()
		fmt.Println("ready")
		tries := 0
		for {
			select {
			case <-stop:
				fmt.Println("tries", tries)
				return nil
			default:
			}
			a, err := portalloc.New(ctx, portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: os.Getenv("BERTH_STATE_DIR"), Timeout: 5 * time.Second})
			if err != nil {
				continue // the directory is being made again: try again
			}
			tries++
			if r, err := a.Reserve(ctx, portalloc.Request{Label: "intruder"}, uint16(port)); err == nil {
				fmt.Println("got", r.Port)
			} else if !errors.Is(err, portalloc.ErrPortHeld) {
				fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", " "))
			}
			_ = a.Close()
		}
	}
}

func TestHolderSurvivesLostStore(t *testing.T) {
	losses := []struct {
		name string
		lose func(dir string) error
	}{
		{"state directory removed", func(dir string) error { return os.RemoveAll(dir) }},
		{"database replaced by an empty file", func(dir string) error {
			db := filepath.Join(dir, statedir.DatabaseFile)
			if err := os.Remove(db); err != nil {
				return err
			}
			return os.WriteFile(db, nil, 0o600)
		}},
		{"database truncated in place", func(dir string) error {
			return os.Truncate(filepath.Join(dir, statedir.DatabaseFile), 0)
		}},
		// What a checkpoint makes of a truncated file: some pages back,
		// not all. Nobody but its holders can tell it from a damaged one.
		{"database truncated to half", func(dir string) error {
			db := filepath.Join(dir, statedir.DatabaseFile)
			fi, err := os.Stat(db)
			if err != nil {
				return err
			}
			return os.Truncate(db, fi.Size()/2)
		}},
	}
	for _, loss := range losses {
		for _, check := range []bool{true, false} {
			name := loss.name
			if !check {
				if !marker.Supported() {
					continue // without marks, only the holder's check guards the port
				}
				name += ", holder idle"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				first := freeRun(t, 4)
				port := first + 1
				env := []string{"BERTH_STATE_DIR=" + dir, "BERTH_TEST_PORT=" + strconv.Itoa(int(port)),
					"BERTH_TEST_RANGE=" + fmt.Sprintf("%d-%d", first, first+3)}
				if !check {
					env = append(env, "BERTH_TEST_NOCHECK=1")
				}
				holder := spawn(t, "lostholder", env...).ready(t)
				intruder := spawn(t, "intruder", env...).ready(t)

				if err := loss.lose(dir); err != nil {
					t.Fatal(err)
				}
				// The intruder has been asking since before the loss; let
				// it ask on for a while after it.
				time.Sleep(1500 * time.Millisecond)
				// The holder allocates the rest of its range: never its
				// own port.
				for range 3 {
					if _, err := fmt.Fprintln(holder.stdin, "alloc"); err != nil {
						t.Fatal(err)
					}
					line := readLine(t, holder)
					if strings.HasPrefix(line, strconv.Itoa(int(port))+" ") {
						t.Errorf("the holder's own Allocate returned its held port %d", port)
					}
					if !strings.HasSuffix(line, " "+portalloc.BackendStateStore) {
						t.Errorf("holder's alloc = %q; want a port of the state store", line)
					}
				}
				if _, err := fmt.Fprintln(intruder.stdin, "stop"); err != nil {
					t.Fatal(err)
				}
				var tries string
				for {
					line := readLine(t, intruder)
					if strings.HasPrefix(line, "got ") {
						t.Errorf("intruder got the live holder's port: %s", line)
						continue
					}
					if strings.HasPrefix(line, "error:") {
						t.Logf("intruder: %s", line)
						continue
					}
					tries = line
					break
				}
				t.Logf("intruder: %s", tries)

				// The holder's row is back, under its label.
				s, err := fleet.OpenStore(context.Background(), portalloc.Config{StateDir: dir})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				rows, err := s.List(context.Background(), store.Filter{Port: port})
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) != 1 || rows[0].Owner.PID != holder.cmd.Process.Pid || rows[0].Label != "holder" {
					t.Errorf("rows of port %d after the loss = %v; want the holder's (pid %d, label holder)", port, rows, holder.cmd.Process.Pid)
				}
				if _, err := fmt.Fprintln(holder.stdin, "stats"); err != nil {
					t.Fatal(err)
				}
				if line := readLine(t, holder); !strings.HasSuffix(line, " 0 "+portalloc.BackendStateStore) || strings.HasPrefix(line, "0 ") {
					t.Errorf("holder's Restored, Lost, Backend = %q; want some restored, none lost, the state store", line)
				}
			})
		}
	}
}
