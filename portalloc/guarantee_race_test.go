package portalloc_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// The guarantee across processes: whatever their stores, two berth
// processes are never both granted conflicting keys. Each racer here keeps
// a store of its own, so no store can referee: only the kernel locks do.

func init() {
	// race serves reservations for its parent: a line "reserve PROTO
	// ADDR PORT" makes it Reserve the key and answer "ok", "held" or
	// "error: ..."; a line "release" releases what it holds and answers
	// "released".
	workers["race"] = func(ctx context.Context) error {
		a, err := portalloc.New(ctx, workerConfig())
		if err != nil {
			return err
		}
		defer func() { _ = a.Close() }()
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		var held []store.Reservation
		for in.Scan() {
			f := strings.Fields(in.Text())
			switch {
			case len(f) == 4 && f[0] == "reserve":
				port, _ := strconv.Atoi(f[3])
				r, err := a.Reserve(ctx, portalloc.Request{Protocol: store.Protocol(f[1]), Addr: netip.MustParseAddr(f[2])}, uint16(port))
				switch {
				case err == nil:
					held = append(held, r)
					fmt.Println("ok")
				case errors.Is(err, store.ErrHeld):
					fmt.Println("held")
				default:
					fmt.Println("error:", err)
				}
			case len(f) == 1 && f[0] == "release":
				for _, r := range held {
					if err := a.Release(ctx, r); err != nil {
						fmt.Println("error:", err)
					}
				}
				held = nil
				fmt.Println("released")
			default:
				fmt.Println("error: bad request", in.Text())
			}
		}
		return nil
	}
}

// TestRaceConflictingKeys: in each round, racing processes ask at the
// same moment for keys of one port that conflict under berth's rule (a
// wildcard and a specific address of a family, the IPv6 wildcard and IPv4,
// one address twice) or do not (two specific addresses); what they are
// granted never conflicts, and a key nothing else asks for is granted.
func TestRaceConflictingKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	mixes := [][]string{
		{"0.0.0.0", "127.0.0.1"},
		{"::", "127.0.0.1"},
		{"::", "0.0.0.0"},
		{"::", "::1"},
		{"0.0.0.0", "::1", "127.0.0.1"},
		{"127.0.0.1", "127.0.0.1"},
		{"::", "::", "0.0.0.0", "0.0.0.0"},
	}
	const racers = 6
	ps := make([]*proc, racers)
	for i := range ps {
		ps[i] = spawn(t, "race", "BERTH_STATE_DIR="+t.TempDir()).ready(t)
	}
	rounds := 60
	if raceEnabled {
		rounds = 30
	}
	granted := 0
	for round := range rounds {
		mix := mixes[round%len(mixes)]
		port := freeRun(t, 1)
		proto := store.TCP
		if round%3 == 2 {
			proto = store.UDP
		}
		keys := make([]store.Key, racers)
		for i := range keys {
			keys[i] = store.Key{Protocol: proto, Addr: netip.MustParseAddr(mix[i%len(mix)]), Port: port}
		}
		answers := make([]string, racers)
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fmt.Fprintf(p.stdin, "reserve %s %s %d\n", keys[i].Protocol, keys[i].Addr, port)
				line, err := p.out.ReadString('\n')
				if err != nil {
					line = "error: " + err.Error()
				}
				answers[i] = strings.TrimSpace(line)
			}()
		}
		wg.Wait()
		var won []store.Key
		for i, ans := range answers {
			switch ans {
			case "ok":
				for _, w := range won {
					if w.Conflicts(keys[i]) {
						t.Fatalf("round %d: %v and %v were both granted (answers %q)", round, w, keys[i], answers)
					}
				}
				won = append(won, keys[i])
			case "held":
			default:
				t.Fatalf("round %d: racer %d asked for %v: %s", round, i, keys[i], ans)
			}
		}
		if len(won) == 0 {
			// Every racer may lose a race (each saw another's lock),
			// never all of them always: counted below.
			t.Logf("round %d: nobody was granted %v", round, keys)
		}
		granted += len(won)
		for _, p := range ps {
			fmt.Fprintln(p.stdin, "release")
			if line := readLine(t, p); line != "released" {
				t.Fatalf("round %d: release: %s", round, line)
			}
		}
	}
	if granted < rounds {
		t.Errorf("%d grants in %d rounds; want at least one a round on average", granted, rounds)
	}
}
