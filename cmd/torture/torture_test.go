package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/store"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/internal/netns"
	"github.com/berth-go/berth/internal/pgserver"
)

func TestMain(m *testing.M) {
	MaybeRunRole()
	goleak.VerifyTestMain(m)
}

// writeLogs writes synthetic per-process logs for the checker.
func writeLogs(tb testing.TB, logs map[string][]Event) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		tb.Fatal(err)
	}
	for name, evs := range logs {
		var b []byte
		for _, e := range evs {
			line, _ := json.Marshal(e)
			b = append(append(b, line...), '\n')
		}
		if err := os.WriteFile(filepath.Join(dir, "logs", name), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

func grant(t int64, proc string, addr string, port uint16) Event {
	return Event{T: t, Kind: KindGrant, Proc: proc, Proto: "tcp", Addr: addr, Port: port}
}

func hostGrant(t int64, proc, host, addr string, port uint16) Event {
	return Event{T: t, Kind: KindGrant, Proc: proc, Host: host, Proto: "tcp", Addr: addr, Port: port}
}

// leaseGrant is a grant of 0.0.0.0:26000/tcp to holder, whose call began
// at since, under a lease of ttl.
func leaseGrant(t int64, proc, holder string, since, ttl int64) Event {
	return Event{T: t, Kind: KindGrant, Proc: proc, Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: holder, Since: since, TTLNS: ttl}
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
		{"one key on two hosts at once", map[string][]Event{
			"w1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
			"w2.jsonl": {{T: 30, Kind: KindGrant, Proc: "w2", Host: "host-2", Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
		}, ""},
		{"one key twice on one host of several", map[string][]Event{
			"w1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-2", Proto: "tcp", Addr: "::", Port: 26000}},
			"w2.jsonl": {{T: 20, Kind: KindGrant, Proc: "w2", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
			"w3.jsonl": {{T: 30, Kind: KindGrant, Proc: "w3", Host: "host-2", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
		}, "double grant"},
		{"a retirement ends the claims of its host", map[string][]Event{
			"w1.jsonl": {hostGrant(10, "w1", "host-2", "::", 26000),
				{T: 12, Kind: KindGrant, Proc: "w1", Host: "host-2", Proto: "tcp", Addr: "127.0.0.1", Port: 26001, Handoff: true},
				{T: 13, Kind: KindTransfer, Proc: "w1", Host: "host-2", Proto: "tcp", Addr: "127.0.0.1", Port: 26001, Child: "w1.1"}},
			"supervisor.jsonl": {{T: 15, Kind: KindKill, Proc: "w1"}, {T: 20, Kind: KindRetire, Host: "host-2", Reaped: 2}},
			"w5.jsonl":         {hostGrant(30, "w5", "host-2", "127.0.0.1", 26000), hostGrant(31, "w5", "host-2", "127.0.0.1", 26001)},
		}, ""},
		{"a retirement ends only the claims of its host", map[string][]Event{
			"w1.jsonl":         {hostGrant(10, "w1", "host-1", "::", 26000)},
			"supervisor.jsonl": {{T: 20, Kind: KindRetire, Host: "host-2"}},
			"w5.jsonl":         {hostGrant(30, "w5", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a retirement ends no claim made after it", map[string][]Event{
			"supervisor.jsonl": {{T: 5, Kind: KindRetire, Host: "host-2"}},
			"w5.jsonl":         {hostGrant(10, "w5", "host-2", "0.0.0.0", 26000)},
			"w6.jsonl":         {hostGrant(30, "w6", "host-2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a child the retirement killed held its port until then", map[string][]Event{
			"w1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-2", Proto: "tcp", Addr: "127.0.0.1", Port: 26001, Handoff: true},
				{T: 11, Kind: KindTransfer, Proc: "w1", Host: "host-2", Proto: "tcp", Addr: "127.0.0.1", Port: 26001, Child: "w1.1"}},
			"supervisor.jsonl": {{T: 12, Kind: KindKill, Proc: "w1"}, {T: 40, Kind: KindRetire, Host: "host-2"}},
			"w5.jsonl":         {hostGrant(30, "w5", "host-2", "127.0.0.1", 26001)},
		}, "double grant"},
		{"a fleet-wide grant is held on every host", map[string][]Event{
			"f1.jsonl": {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
			"w5.jsonl": {hostGrant(30, "w5", "host-3", "::1", 26000)},
		}, "double grant"},
		{"a retirement does not end a fleet-wide grant", map[string][]Event{
			"f1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
			"supervisor.jsonl": {{T: 20, Kind: KindRetire, Host: "host-3"}},
			"w5.jsonl":         {hostGrant(30, "w5", "host-3", "::1", 26000)},
		}, "double grant"},
		{"a released fleet-wide grant", map[string][]Event{
			"f1.jsonl": {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000},
				{T: 20, Kind: KindRelease, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
			"w5.jsonl": {hostGrant(30, "w5", "host-3", "::1", 26000)},
		}, ""},
		{"two fleet-wide grants of one port", map[string][]Event{
			"f1.jsonl": {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "udp", Addr: "::1", Port: 26000}},
			"f2.jsonl": {{T: 30, Kind: KindGrant, Proc: "f2", Fleet: true, Proto: "udp", Addr: "::", Port: 26000}},
		}, "double grant"},
		{"a fleet-wide grant that one host could not bind", map[string][]Event{
			"f1.jsonl": {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000},
				{T: 11, Kind: KindBind, Proc: "f1", Fleet: true, Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000},
				{T: 12, Kind: KindBind, Proc: "f1", Fleet: true, Host: "host-2", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Err: "address already in use"},
				{T: 13, Kind: KindRelease, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
		}, "could not bind"},
		{"a failed bind", map[string][]Event{
			"worker-1.jsonl": {grant(10, "w1", "127.0.0.1", 26000), {T: 11, Kind: KindBind, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Err: "address already in use"}},
		}, "could not bind"},
		{"a lease outlives its killed worker", map[string][]Event{
			"w1.jsonl":         {leaseGrant(10, "w1", "w1/lease-1", 5, 100)},
			"supervisor.jsonl": {{T: 20, Kind: KindKill, Proc: "w1"}},
			"w2.jsonl":         {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a lease that ran out", map[string][]Event{
			"w1.jsonl":         {leaseGrant(10, "w1", "w1/lease-1", 5, 20)},
			"supervisor.jsonl": {{T: 12, Kind: KindKill, Proc: "w1"}},
			"w2.jsonl":         {grant(30, "w2", "127.0.0.1", 26000)},
		}, ""},
		{"a renewal extends a lease", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 20),
				{T: 21, Kind: KindRenew, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1", Since: 20, TTLNS: 20},
				{T: 22, Kind: KindLeaseDrop, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
			"w2.jsonl": {grant(30, "w2", "::1", 26000)},
		}, "double grant"},
		{"a released lease", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 100),
				{T: 15, Kind: KindRelease, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
			"w2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, ""},
		{"a release of another holder's lease ends nothing", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 100),
				{T: 15, Kind: KindRelease, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-2"}},
			"w2.jsonl": {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a lease the store ended before its time", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 100),
				{T: 30, Kind: KindLeaseEnded, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
		}, "lease ended before its time"},
		{"a lease found ended after its time", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 20),
				{T: 30, Kind: KindLeaseEnded, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
		}, ""},
		// A lost store loses no lease: the holder's keeper keeps its
		// lock, so every conflict across a loss is a violation.
		{"a lease across a store loss", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 100),
				{T: 12, Kind: KindLeaseDrop, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
			"supervisor.jsonl": {{T: 15, Kind: KindLoseStore}},
			"w2.jsonl":         {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a lease across a store loss, its grant logged after another's", map[string][]Event{
			"w1.jsonl":         {leaseGrant(40, "w1", "w1/lease-1", 5, 100)},
			"supervisor.jsonl": {{T: 15, Kind: KindLoseStore}},
			"w2.jsonl":         {grant(30, "w2", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a lease found ended across a store loss, before its time", map[string][]Event{
			"w1.jsonl": {leaseGrant(10, "w1", "w1/lease-1", 5, 100),
				{T: 25, Kind: KindLeaseEnded, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1"}},
			"supervisor.jsonl": {{T: 15, Kind: KindLoseStore}},
		}, "lease ended before its time"},
		{"a lease's bind failing across a store loss", map[string][]Event{
			"w1.jsonl": {leaseGrant(40, "w1", "w1/lease-1", 5, 100),
				{T: 41, Kind: KindBind, Proc: "w1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Holder: "w1/lease-1", Err: "address already in use"}},
			"supervisor.jsonl": {{T: 15, Kind: KindLoseStore}},
			"w2.jsonl":         {grant(30, "w2", "127.0.0.1", 26000), release(35, "w2", "127.0.0.1", 26000)},
		}, "could not bind"},
		{"a bind refused for want of descriptors", map[string][]Event{
			"w1.jsonl": {grant(10, "w1", "127.0.0.1", 26000),
				{T: 11, Kind: KindBind, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Err: "too many open files", EMFILE: true},
				{T: 12, Kind: KindBind, Proc: "w1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
		}, ""},
		// An asynchronous failover at 20 (promoted at 22): w1's grant,
		// asked for at 8, may be missing from the new primary until w1
		// puts it back; the grace period holds every other grant until
		// then, so a second grant of its port is a violation all the same.
		{"a row lost in an asynchronous failover, granted again before its holder is back", map[string][]Event{
			"w1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}, {T: 40, Kind: KindRepair, Proc: "w1", Restored: 0, NotRestored: 1}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a grant after the holder put its rows back", map[string][]Event{
			"w1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}, {T: 40, Kind: KindRepair, Proc: "w1"}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"w2.jsonl":         {hostGrant(50, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a grant asked for after the failover is not lost in it", map[string][]Event{
			"w1.jsonl":         {{T: 25, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}, {T: 40, Kind: KindRepair, Proc: "w1"}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a lost fleet-wide lease met by a host's grant: its holder renews it in the grace period", map[string][]Event{
			"f1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		// A port handed to a child, whose row the failover lost: nobody
		// puts it back, and once the grace period is over a fleet-wide
		// grant may meet it (documented); the child's lock keeps it from
		// the processes of its host, whose grant is a violation.
		{"a hand-off's row lost in an asynchronous failover, met by a fleet-wide grant", map[string][]Event{
			"w1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Handoff: true, DurNS: 2},
				{T: 12, Kind: KindTransfer, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Child: "w1.1"}},
			"w1.1.jsonl":       {{T: 100, Kind: KindChildExit, Proc: "w1.1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"f1.jsonl": {{T: 30, Kind: KindGrant, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000},
				{T: 31, Kind: KindBind, Proc: "f1", Fleet: true, Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Err: "address already in use"},
				{T: 32, Kind: KindRelease, Proc: "f1", Fleet: true, Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
		}, ""},
		{"a hand-off's row lost in an asynchronous failover, met by a process of its host", map[string][]Event{
			"w1.jsonl": {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Handoff: true, DurNS: 2},
				{T: 12, Kind: KindTransfer, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Child: "w1.1"}},
			"w1.1.jsonl":       {{T: 100, Kind: KindChildExit, Proc: "w1.1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover}, {T: 22, Kind: KindPromoted}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a synchronous standby loses nothing", map[string][]Event{
			"w1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}, {T: 40, Kind: KindRepair, Proc: "w1"}},
			"supervisor.jsonl": {{T: 20, Kind: KindFailover, Sync: true}, {T: 22, Kind: KindPromoted, Sync: true}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
		{"a restart loses nothing", map[string][]Event{
			"w1.jsonl":         {{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2}, {T: 40, Kind: KindRepair, Proc: "w1"}},
			"supervisor.jsonl": {{T: 20, Kind: KindPGRestart}},
			"w2.jsonl":         {hostGrant(30, "w2", "host-1", "127.0.0.1", 26000)},
		}, "double grant"},
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
	runExercising(t, Config{Workers: 4, Duration: 3 * time.Second, KillEvery: 300 * time.Millisecond}, func(sum Summary, slow time.Duration) string {
		if sum.Kills == 0 || sum.Handoffs == 0 || sum.Allocations == 0 || sum.Reservations == 0 {
			return fmt.Sprintf("%d kills, %d handoffs, %d allocations, %d reservations",
				sum.Kills, sum.Handoffs, sum.Allocations, sum.Reservations)
		}
		return ""
	})
}

// TestRunHosts runs the harness across three network-namespace hosts
// sharing one PostgreSQL store, with kills, host retirements and a fleet
// worker binding fleet-wide ports on every host: no two live holders of a
// key on one host, and the hosts did hold the same keys at once. Then it
// plants double grants in the run's own logs, one on a host and one
// against a fleet-wide grant, and checks that the checker finds each.
func TestRunHosts(t *testing.T) {
	dsn := os.Getenv("BERTH_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set BERTH_TEST_POSTGRES to a PostgreSQL DSN reachable over a unix socket to run the harness across hosts (bash .ci/postgres start prints one)")
	}
	netns.ForTest(t, 1) // skips unless namespaces can be made here
	dir := t.TempDir()
	sum := runOnce(t, Config{Store: dsn, Hosts: 3, Workers: 2, Duration: 10 * time.Second, RetireEvery: 2 * time.Second, Dir: dir})
	var b strings.Builder
	sum.Print(&b)
	t.Log("\n" + b.String())
	if !sum.OK() {
		t.Fatal("the run violated an invariant")
	}
	if sum.Kills == 0 || sum.Handoffs == 0 || sum.CrossHost == 0 || sum.Retirements < 2 || sum.RetiredRows == 0 ||
		sum.FleetGrants == 0 || sum.FleetBinds < sum.FleetGrants {
		t.Errorf("the run did not exercise everything: %d kills, %d handoffs, %d keys held on two hosts at once, "+
			"%d retirements deleting %d rows, %d fleet-wide grants bound %d times",
			sum.Kills, sum.Handoffs, sum.CrossHost, sum.Retirements, sum.RetiredRows, sum.FleetGrants, sum.FleetBinds)
	}

	evs := map[string][]Event{}
	files, err := filepath.Glob(filepath.Join(dir, "logs", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if evs[f], err = readLog(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name  string
		pick  func(e Event) bool
		host  string // the planted grant's host; "" the picked grant's
		wantS string // in the violation
	}{
		{"a second holder on one host", func(e Event) bool { return e.Host == "host-2" && !e.Handoff && !e.Fleet }, "", "on host-2 by planted"},
		{"a host's holder of a fleet-wide port", func(e Event) bool { return e.Fleet }, "host-3", "fleet-wide by f"},
	} {
		t.Run("planted "+tt.name, func(t *testing.T) {
			var g *Event
			for _, l := range evs {
				for i := range l {
					if l[i].Kind == KindGrant && tt.pick(l[i]) {
						g = &l[i]
						break
					}
				}
				if g != nil {
					break
				}
			}
			if g == nil {
				t.Fatal("the run logged no grant to plant a double grant against")
			}
			host := tt.host
			if host == "" {
				host = g.Host
			}
			// Held from just after the real grant, for a nanosecond: only
			// the real claim overlaps it.
			p := filepath.Join(dir, "logs", "planted.jsonl")
			planted := []Event{
				{T: g.T + 1, Kind: KindGrant, Proc: "planted", PID: 1, Host: host, Proto: g.Proto, Addr: g.Addr, Port: g.Port},
				{T: g.T + 2, Kind: KindRelease, Proc: "planted", PID: 1, Host: host, Proto: g.Proto, Addr: g.Addr, Port: g.Port},
			}
			var data []byte
			for _, e := range planted {
				line, _ := json.Marshal(e)
				data = append(append(data, line...), '\n')
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = os.Remove(p) }()
			rep, err := Check(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.ViolationCount != sum.ViolationCount+1 || len(rep.Violations) == 0 ||
				!strings.Contains(rep.Violations[0], "double grant") || !strings.Contains(rep.Violations[0], tt.wantS) {
				t.Errorf("violations with a double grant planted against %+v = %d %q; want one more, naming it", *g, rep.ViolationCount, rep.Violations)
			}
		})
	}
}

// TestNextStep: big steps keep the clock within bigStep of the true time,
// small ones always cross a second boundary.
func TestNextStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var big, small int
	for i := range 10000 {
		offset := time.Duration(rng.IntN(3)-1) * bigStep
		frac := time.Duration(rng.Int64N(int64(time.Second)))
		if i%100 == 0 {
			frac = time.Duration(i/100%2) * (time.Second - 1) // the edges: 0 and 999.999999 ms
		}
		d := nextStep(rng, offset, frac)
		switch {
		case d == bigStep || d == -bigStep:
			big++
			if after := offset + d; after > bigStep || after < -bigStep {
				t.Fatalf("nextStep(offset %v) = %v; want it to stay within %v of the true time", offset, d, bigStep)
			}
		case d >= 500*time.Millisecond && d < 900*time.Millisecond || d <= -500*time.Millisecond && d > -900*time.Millisecond:
			small++
			if to := frac + d; to >= 0 && to < time.Second {
				t.Fatalf("nextStep(frac %v) = %v; want a step across a second boundary", frac, d)
			}
		default:
			t.Fatalf("nextStep(%v, %v) = %v; want ±%v or 0.5-0.9 s either way", offset, frac, d, bigStep)
		}
	}
	if big < 4000 || small < 4000 {
		t.Errorf("%d big and %d small steps of 10000; want about half each", big, small)
	}
}

func call(t int64, proc string, dur time.Duration) Event {
	return Event{T: t, Kind: KindCall, Proc: proc, Op: "allocate", DurNS: int64(dur)}
}

// TestCheckProgress: a time in which no worker completes a call fails the
// run; time a worker spent frozen itself does not count against its calls.
func TestCheckProgress(t *testing.T) {
	const s = int64(time.Second)
	start := Event{T: 0, Kind: KindStart, DurNS: s} // timeout 1s: a hang is over 2s
	tests := []struct {
		name          string
		logs          map[string][]Event
		hangs, overun int
		slowest       time.Duration
	}{
		{"steady", map[string][]Event{
			"supervisor.jsonl": {start, {T: 5 * s, Kind: KindStop}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(2*s, "w1", 20e6), call(3*s, "w1", 10e6), call(4*s, "w1", 10e6)},
		}, 0, 0, 20e6},
		{"no call returns for 3s", map[string][]Event{
			"supervisor.jsonl": {start, {T: 5 * s, Kind: KindStop}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(4*s, "w1", 10e6)},
		}, 1, 0, 10e6},
		{"no call returns before the end", map[string][]Event{
			"supervisor.jsonl": {start, {T: 5 * s, Kind: KindStop}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(2*s, "w1", 10e6), call(6*s, "w1", 10e6)},
		}, 1, 0, 10e6},
		{"one call overruns the timeout", map[string][]Event{
			"supervisor.jsonl": {start, {T: 5 * s, Kind: KindStop}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(2*s, "w1", 10e6), call(3*s, "w1", 10e6), call(4*s, "w1", 10e6)},
			"w2.jsonl":         {call(4*s, "w2", 3*time.Second)},
		}, 0, 1, 3 * time.Second},
		{"a call made slow by its own freeze", map[string][]Event{
			"supervisor.jsonl": {start, {T: s, Kind: KindFreeze, Proc: "w2"}, {T: 3500e6, Kind: KindThaw, Proc: "w2"}, {T: 5 * s, Kind: KindStop}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(2*s, "w1", 10e6), call(3*s, "w1", 10e6), call(4*s, "w1", 10e6)},
			"w2.jsonl":         {call(4*s, "w2", 3*time.Second)},
		}, 0, 0, 500e6},
		{"a worker that did not stop", map[string][]Event{
			"supervisor.jsonl": {start, {T: 5 * s, Kind: KindStop}, {T: 30 * s, Kind: KindStuck, Proc: "w1", DurNS: 22 * s}},
			"w1.jsonl":         {call(s, "w1", 10e6), call(2*s, "w1", 10e6), call(3*s, "w1", 10e6), call(4*s, "w1", 10e6)},
		}, 1, 0, 10e6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Check(writeLogs(t, tt.logs))
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Hangs) != tt.hangs || len(rep.Overruns) != tt.overun {
				t.Errorf("hangs = %q, overruns = %q; want %d and %d", rep.Hangs, rep.Overruns, tt.hangs, tt.overun)
			}
			if len(rep.Slowest) == 0 || rep.Slowest[0].Dur != tt.slowest {
				t.Errorf("slowest = %v; want %v first", rep.Slowest, tt.slowest)
			}
		})
	}
}

// TestRunFreeze runs the harness briefly with workers frozen at random,
// some inside the store's lock: no double grant, and the others go on.
func TestRunFreeze(t *testing.T) {
	runExercising(t, Config{Workers: 4, Duration: 4 * time.Second, KillEvery: 300 * time.Millisecond, Freeze: true}, func(sum Summary, slow time.Duration) string {
		if sum.Freezes == 0 {
			return "no worker frozen"
		}
		return ""
	})
}

// TestRunClockStep runs the harness briefly while the wall clock is
// stepped. It needs root, and steps the clock of the whole host.
func TestRunClockStep(t *testing.T) {
	// Another program may be stepping the clock (a long torture run): wait
	// for it a while, then skip rather than fail.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Config{Workers: 4, Duration: 4 * time.Second, KillEvery: 300 * time.Millisecond, ClockStep: true})
	if errors.Is(err, ErrNeedsRoot) || err != nil && !canStepClock {
		t.Skip(err)
	}
	if err != nil && ctx.Err() != nil && strings.Contains(err.Error(), "clocklock") {
		t.Skipf("another program has been stepping the clock for 2 minutes: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sum.Print(&b)
	t.Log("\n" + b.String())
	if !sum.OK() {
		t.Fatal("the run violated an invariant")
	}
	if sum.ClockSteps == 0 {
		t.Error("the run did not step the clock")
	}
}

// TestRunLeases runs the harness briefly with workers holding ports under
// named holders' leases, renewing them, releasing some, dropping others,
// and killed with others held: no one else is granted a leased port before
// its lease was released or ran out.
func TestRunLeases(t *testing.T) {
	runExercising(t, Config{Workers: 4, Duration: 5 * time.Second, KillEvery: 300 * time.Millisecond, Leases: true}, func(sum Summary, slow time.Duration) string {
		if sum.LeaseGrants == 0 || sum.Renewals == 0 || sum.LeaseExpiries == 0 || sum.KilledLeases == 0 {
			return fmt.Sprintf("leases: %d granted, %d renewals, %d ran out, %d of them of killed workers",
				sum.LeaseGrants, sum.Renewals, sum.LeaseExpiries, sum.KilledLeases)
		}
		return ""
	})
}

// TestRunFDPressure runs the harness briefly with workers short of
// descriptors in spells: shortages are counted, never errors, and every
// grant is still bound.
func TestRunFDPressure(t *testing.T) {
	if !canPressure {
		t.Skip(errNoPressure)
	}
	runExercising(t, Config{Workers: 4, Duration: 5 * time.Second, KillEvery: 300 * time.Millisecond, FDPressure: true}, func(sum Summary, slow time.Duration) string {
		if sum.PressureSpells == 0 || sum.Transients+sum.EMFILEBinds+sum.Shortages == 0 {
			return fmt.Sprintf("descriptor shortages: %d spells, %d calls failed with ErrTransient, %d binds and %d children refused",
				sum.PressureSpells, sum.Transients, sum.EMFILEBinds, sum.Shortages)
		}
		return ""
	})
}

// TestHeldBy: a failed bind names the claims of the run that held the
// port, or says that none did.
func TestHeldBy(t *testing.T) {
	claims := []*claim{
		{proto: "tcp", addr: netip.MustParseAddr("0.0.0.0"), port: 26000, proc: "w1", start: 10, end: 50},
		{proto: "tcp", addr: netip.MustParseAddr("127.0.0.1"), port: 26000, proc: "w2", start: 20, end: 60, child: "w2.1"},
	}
	tests := []struct {
		e    Event
		want string
	}{
		{Event{T: 30, Proc: "w2.1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}, "held by tcp 0.0.0.0:26000 by w1"},
		{Event{T: 55, Proc: "w2.1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}, "no other claim of this run"},
		{Event{T: 30, Proc: "w3", Proto: "udp", Addr: "127.0.0.1", Port: 26000}, "no other claim of this run"},
		{Event{T: 65, Proc: "w3", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}, "the last before it: tcp 127.0.0.1:26000 by w2"},
	}
	for _, tt := range tests {
		if got := heldBy(claims, tt.e, 0); !strings.Contains(got, tt.want) {
			t.Errorf("heldBy(%+v) = %q; want it to say %q", tt.e, got, tt.want)
		}
	}
}

// TestLockRange: a second run on one range waits for the first.
func TestLockRange(t *testing.T) {
	r := store.Range{First: 1, Last: 2} // a lock file only: nothing binds
	unlock, err := lockRange(context.Background(), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if u, err := lockRange(ctx, r, nil); !errors.Is(err, context.DeadlineExceeded) {
		if u != nil {
			_ = u()
		}
		t.Fatalf("lockRange while held: error %v; want it to wait until the context ends", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	unlock, err = lockRange(context.Background(), r, nil)
	if err != nil {
		t.Fatalf("lockRange after unlock: %v", err)
	}
	_ = unlock()
}

// ownServerForTest skips unless the harness can start PostgreSQL servers
// of its own here and make network namespaces.
func ownServerForTest(tb testing.TB) {
	tb.Helper()
	if _, err := pgserver.Bin(); err != nil {
		tb.Skip(err)
	}
	if os.Geteuid() != 0 {
		tb.Skip("the server faults run across network-namespace hosts: root only")
	}
	netns.ForTest(tb, 1) // skips unless namespaces can be made here
}

// runOnce runs cfg. A run on PostgreSQL waits for a program that steps
// the clock to finish (see holdClock): this waits a while, then skips
// rather than fails.
func runOnce(tb testing.TB, cfg Config) Summary {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+4*cfg.Duration)
	defer cancel()
	sum, err := Run(ctx, cfg)
	if err != nil && ctx.Err() != nil && strings.Contains(err.Error(), "clocklock") {
		tb.Skipf("another program has been stepping the clock for 2 minutes: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return sum
}

// runExercising runs cfg until a run exercised what the test is about:
// exercised names what a run missed ("" for nothing), given how much
// slower than cfg the run went (1, 2 or 4). A run that violated an
// invariant fails the test at once; one that missed something (on a
// machine so busy that workers died before they granted anything, or held
// anything at a fault, or granted too few leases to see one run out) is
// run again, twice at most, each time twice as slow: twice as long, with
// its kills, restarts, failovers and retirements half as often.
func runExercising(t *testing.T, cfg Config, exercised func(sum Summary, slow time.Duration) string) {
	t.Helper()
	if cfg.KillEvery == 0 {
		cfg.KillEvery = 500 * time.Millisecond
	}
	if cfg.Hosts > 1 && cfg.RetireEvery == 0 {
		cfg.RetireEvery = 5 * time.Second
	}
	for slow := time.Duration(1); ; slow *= 2 {
		sum := runOnce(t, cfg)
		var b strings.Builder
		sum.Print(&b)
		t.Log("\n" + b.String())
		missed := exercised(sum, slow)
		switch {
		case sum.Grants == 0:
			// Not a violation: on a starved machine every worker was killed
			// before it had started. A run that granted nothing in three
			// tries, whatever else it shows, fails below.
			missed = "no grant at all"
		case !sum.OK():
			t.Fatal("the run violated an invariant")
		}
		if missed == "" {
			return
		}
		if slow == 4 {
			t.Fatalf("three runs, none exercised what it should: %s", missed)
		}
		t.Logf("the run did not exercise what it should (%s); running again twice as slow", missed)
		for _, d := range []*time.Duration{&cfg.Duration, &cfg.KillEvery, &cfg.PGRestartEvery, &cfg.FailoverEvery, &cfg.RetireEvery} {
			*d *= 2
		}
	}
}

// TestRunPGRestart restarts the run's own server every 2 s under two hosts'
// workers, three times at least (the run goes on until then): every
// connection is cut, nothing committed is lost, and no port may be granted
// twice; the workers compare their reservations with the new server and
// go on granting once the grace period after each restart is over.
func TestRunPGRestart(t *testing.T) {
	ownServerForTest(t)
	runExercising(t, Config{Hosts: 2, Workers: 2, Duration: 6 * time.Second, PGRestartEvery: 2 * time.Second, Faults: 3}, func(sum Summary, slow time.Duration) string {
		switch {
		case sum.Restarts < 3 || sum.Repairs == 0 || sum.Unavailable == 0:
			return fmt.Sprintf("%d restarts, %d comparisons with the store, %d calls failed on the server out of reach",
				sum.Restarts, sum.Repairs, sum.Unavailable)
		case sum.GrantGap.Dur > 5*time.Second*slow:
			return fmt.Sprintf("no grant for %v: the hosts did not keep granting across the restarts", sum.GrantGap.Dur)
		}
		return ""
	})
}

// TestRunFailover fails over to a synchronous standby every 4 s, twice at
// least, a new standby built each time: nothing is lost, so every
// conflict is a violation, and the hosts keep granting.
func TestRunFailover(t *testing.T) {
	ownServerForTest(t)
	runExercising(t, Config{Hosts: 2, Workers: 2, Duration: 8 * time.Second, FailoverEvery: 4 * time.Second, SyncStandby: true, Faults: 2}, func(sum Summary, slow time.Duration) string {
		if sum.FailoverLost != 0 {
			t.Fatalf("%d conflicts counted as lost to a synchronous standby: it loses nothing", sum.FailoverLost)
		}
		switch {
		case sum.Failovers < 2 || sum.Repairs == 0:
			return fmt.Sprintf("%d failovers, %d comparisons with the store", sum.Failovers, sum.Repairs)
		case sum.GrantGap.Dur > 8*time.Second*slow:
			return fmt.Sprintf("no grant for %v: the hosts did not keep granting across the failovers", sum.GrantGap.Dur)
		}
		return ""
	})
}

// TestRunFailoverAsync fails over to an asynchronous standby, three times
// at least, each losing commits another way (the primary killed as it
// runs, the standby held back for a second, synchronous_commit off),
// under two hosts' workers and a fleet worker holding fleet-wide ports:
// the grace period after each failover holds every grant until the
// holders have put back what the failover lost, so no conflict is
// allowed but one over a port handed to a child, whose row nobody puts
// back, met by a fleet-wide grant.
func TestRunFailoverAsync(t *testing.T) {
	ownServerForTest(t)
	runExercising(t, Config{Hosts: 2, Workers: 2, Duration: 8 * time.Second, FailoverEvery: 3 * time.Second, FailoverKind: FailoverAll, Faults: 3}, func(sum Summary, slow time.Duration) string {
		switch {
		case sum.Failovers < 3 || sum.Repairs == 0 || sum.FleetGrants == 0:
			return fmt.Sprintf("%d failovers, %d comparisons with the store, %d fleet-wide grants", sum.Failovers, sum.Repairs, sum.FleetGrants)
		case sum.GrantGap.Dur > 8*time.Second*slow:
			return fmt.Sprintf("no grant for %v: the hosts did not keep granting across the failovers", sum.GrantGap.Dur)
		}
		return ""
	})
}

// TestRunFaultsNeedOwnServer: the run restarts and kills only a server it
// started.
func TestRunFaultsNeedOwnServer(t *testing.T) {
	for _, cfg := range []Config{
		{Store: "host=/tmp dbname=postgres", PGRestartEvery: time.Second},
		{Store: "host=/tmp dbname=postgres", FailoverEvery: time.Second},
	} {
		if _, err := Run(context.Background(), cfg); !errors.Is(err, errFaultsNeedOwnServer) {
			t.Errorf("Run(%+v) = %v; want errFaultsNeedOwnServer", cfg, err)
		}
	}
	for _, cfg := range []Config{{PGRestartEvery: -time.Second}, {SyncStandby: true}, {FailoverKind: FailoverLag},
		{FailoverEvery: time.Second, FailoverKind: "crash"}, {FailoverEvery: time.Second, SyncStandby: true, FailoverKind: FailoverLag}, {Faults: 2}} {
		if _, err := Run(context.Background(), cfg); !errors.Is(err, errBadFaults) {
			t.Errorf("Run(%+v) = %v; want errBadFaults", cfg, err)
		}
	}
}

// TestCheckReleaseProbes: a failed probe of a port handed to a child
// counts as one of a release in progress from the child's exit until its
// worker reaped it (the child's lock goes with the process), and as
// nothing explained after.
func TestCheckReleaseProbes(t *testing.T) {
	handed := []Event{{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Handoff: true, DurNS: 2},
		{T: 12, Kind: KindTransfer, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000, Child: "w1.1"},
		{T: 40, Kind: KindChildGone, Proc: "w1", Host: "host-1", Child: "w1.1"}}
	for _, tt := range []struct {
		name string
		at   int64
		want int64
	}{{"before the child was reaped", 35, 1}, {"after", 45, 0}} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Check(writeLogs(t, map[string][]Event{
				"w1.jsonl":   handed,
				"w1.1.jsonl": {{T: 30, Kind: KindChildExit, Proc: "w1.1", Host: "host-1", Proto: "tcp", Addr: "127.0.0.1", Port: 26000}},
				"w2.jsonl": {{T: tt.at, Kind: KindProbeKey, Proc: "w2", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000},
					{T: tt.at, Kind: KindProbe, Proc: "w2", Host: "host-1", Probes: 1}},
			}))
			if err != nil {
				t.Fatal(err)
			}
			if rep.ReleaseProbes != tt.want || rep.ProbeFailures != 1 {
				t.Errorf("ReleaseProbes = %d, ProbeFailures %d (%q); want %d, 1", rep.ReleaseProbes, rep.ProbeFailures, rep.ProbeKeys, tt.want)
			}
		})
	}
}

// TestCheckFailoverProbes: a failed probe counts as one over a row an
// asynchronous failover lost only if it conflicts with a port handed to a
// child before the failover, while the child held it: nobody puts such a
// row back, and the child's lock refuses the port. Every other holder
// puts its rows back in the grace period, which holds the grants meanwhile.
func TestCheckFailoverProbes(t *testing.T) {
	probe := func(tm int64, addr string, port uint16) []Event {
		return []Event{{T: tm, Kind: KindProbeKey, Proc: "w2", Host: "host-1", Proto: "tcp", Addr: addr, Port: port},
			{T: tm, Kind: KindProbe, Proc: "w2", Host: "host-1", Probes: 1}}
	}
	held := []Event{{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Handoff: true, DurNS: 2},
		{T: 12, Kind: KindTransfer, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, Child: "w1.1"},
		{T: 40, Kind: KindRepair, Proc: "w1", Restored: 1}}
	kept := []Event{{T: 10, Kind: KindGrant, Proc: "w1", Host: "host-1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000, DurNS: 2},
		{T: 40, Kind: KindRepair, Proc: "w1", Restored: 1}}
	for _, tt := range []struct {
		name  string
		held  []Event
		probe []Event
		sync  bool
		want  int64
	}{
		{"in the window, over the lost key", held, probe(30, "127.0.0.1", 26000), false, 1},
		{"in the window, over another port", held, probe(30, "127.0.0.1", 26001), false, 0},
		{"after the child's exit", held, probe(70, "127.0.0.1", 26000), false, 0},
		{"a synchronous standby", held, probe(30, "127.0.0.1", 26000), true, 0},
		{"a holder's own row, which it puts back", kept, probe(30, "127.0.0.1", 26000), false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Check(writeLogs(t, map[string][]Event{
				"w1.jsonl":         tt.held,
				"w1.1.jsonl":       {{T: 60, Kind: KindChildExit, Proc: "w1.1", Proto: "tcp", Addr: "0.0.0.0", Port: 26000}},
				"w2.jsonl":         tt.probe,
				"supervisor.jsonl": {{T: 20, Kind: KindFailover, Sync: tt.sync}, {T: 22, Kind: KindPromoted, Sync: tt.sync}},
			}))
			if err != nil {
				t.Fatal(err)
			}
			if rep.FailoverProbes != tt.want || rep.ProbeFailures != 1 || len(rep.ProbeKeys) != 1 {
				t.Errorf("FailoverProbes = %d, ProbeFailures %d, ProbeKeys %q; want %d, 1, one", rep.FailoverProbes, rep.ProbeFailures, rep.ProbeKeys, tt.want)
			}
		})
	}
}
