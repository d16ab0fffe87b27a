package torture

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	MaybeRunRole()
	goleak.VerifyTestMain(m)
}

// writeLogs writes synthetic per-process logs for the checker.
func writeLogs(t *testing.T, logs map[string][]Event) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, evs := range logs {
		var b []byte
		for _, e := range evs {
			line, _ := json.Marshal(e)
			b = append(append(b, line...), '\n')
		}
		if err := os.WriteFile(filepath.Join(dir, "logs", name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func grant(t int64, proc string, addr string, port uint16) Event {
	return Event{T: t, Kind: KindGrant, Proc: proc, Proto: "tcp", Addr: addr, Port: port}
}

func release(t int64, proc string, addr string, port uint16) Event {
	return Event{T: t, Kind: KindRelease, Proc: proc, Proto: "tcp", Addr: addr, Port: port}
}

// TestCheckFindsViolations: the checker must catch what it exists to catch.
func TestCheckFindsViolations(t *testing.T) {
	tests := []struct {
		name string
		logs map[string][]Event
		want string // substring of the one violation; "" for none
	}{
		{"sequential grants of one key", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "127.0.0.1", 26000), release(20, "w1", "127.0.0.1", 26000)},
			"worker-2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, ""},
		{"overlapping grants of one key", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "127.0.0.1", 26000), release(40, "w1", "127.0.0.1", 26000)},
			"worker-2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"wildcard overlapping a specific address", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "::", 26000)},
			"worker-2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"different specific addresses may overlap", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "::1", 26000)},
			"worker-2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, ""},
		{"a kill ends the victim's claims", map[string][]Event{
			"worker-1.jsonl":   {grant(10, "w1", "0.0.0.0", 26000)},
			"supervisor.jsonl": {{T: 20, Kind: KindKill, Proc: "w1"}},
			"worker-2.jsonl":   {grant(30, "w2", "127.0.0.1", 26000)},
		}, ""},
		{"a handoff lasts until the child exits", map[string][]Event{
			"worker-1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Handoff: true},
				{T: 11, Kind: KindTransfer, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Child: "w1.1"}},
			"child-9.jsonl":  {{T: 50, Kind: KindChildExit, Proc: "w1.1"}},
			"worker-2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a reused pid is another process", map[string][]Event{
			"w1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "w1", PID: 7, Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
			"supervisor.jsonl": {{T: 20, Kind: KindKill, Proc: "w1", PID: 7}},
			"w9.jsonl":         {{T: 30, Kind: KindGrant, Proc: "w9", PID: 7, Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
		}, ""},
		{"a failed bind", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "127.0.0.1", 26000), {T: 11, Kind: KindBind, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Err: "address already in use"}},
		}, "could not bind"},
		{"a child's failed bind", map[string][]Event{
			"child-9.jsonl": {{T: 10, Kind: KindChildBind, Proc: "w1.1", Proto: "udp", Addr: "::1", Port: 26001, Err: "address already in use"}},
		}, "could not bind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Check(writeLogs(t, tt.logs))
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if rep.ViolationCount != 0 {
					t.Errorf("violations = %q; want none", rep.Violations)
				}
				return
			}
			if rep.ViolationCount != 1 || len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0], tt.want) {
				t.Errorf("violations = %q; want one saying %q", rep.Violations, tt.want)
			}
		})
	}
}

// TestRun runs the real harness briefly: processes, kills, handoffs.
func TestRun(t *testing.T) {
	sum, err := Run(context.Background(), Config{Workers: 4, Duration: 3 * time.Second, KillEvery: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sum.Print(&b)
	t.Log("\n" + b.String())
	if !sum.OK() {
		t.Fatal("the run violated an invariant")
	}
	if sum.Kills == 0 || sum.Handoffs == 0 || sum.Allocations == 0 || sum.Reservations == 0 {
		t.Errorf("the run did not exercise everything: %d kills, %d handoffs, %d allocations, %d reservations",
			sum.Kills, sum.Handoffs, sum.Allocations, sum.Reservations)
	}
}
