package owner

import (
	"context"
	"strings"
	"testing"
	"time"
)

// IsLeaseScope reports whether scope is the scope of a lease's row.
func IsLeaseScope(scope string) bool { return strings.HasSuffix(scope, leaseTag) }

// TestLeaseIdentityKeptByProcessJudgement: the identity a lease's row
// carries is judged alive by Active, the judgement of a berth that knows no
// leases, and is recognised as a lease's.
func TestLeaseIdentityKeptByProcessJudgement(t *testing.T) {
	id := LeaseIdentity("ci/job-1")
	if id.PID != 1 || id.Name != "ci/job-1" || !IsLeaseScope(id.Scope) {
		t.Fatalf("LeaseIdentity = %+v; want pid 1, the holder's name and a lease scope", id)
	}
	if !Active(context.Background(), id) {
		t.Errorf("Active(%+v) = false; a berth that knows no leases would reap the lease's row", id)
	}
	if sc, current := parseScope(id.Scope); !current || sc.boot != BootID() {
		t.Errorf("parseScope(%q) = %+v, %v; want the current format with boot id %q in front", id.Scope, sc, current, BootID())
	}
	self, _ := Self()
	if IsLeaseScope(self.Scope) {
		t.Errorf("IsLeaseScope(%q) of a process = true", self.Scope)
	}
}

func TestLeaseRemaining(t *testing.T) {
	now, err := LeaseNow()
	if err != nil {
		t.Fatal(err)
	}
	scope := LeaseIdentity("x").Scope
	if left, known := LeaseRemaining(scope, now+int64(time.Hour)); !known || left <= 59*time.Minute || left > time.Hour {
		t.Errorf("LeaseRemaining(own scope, now+1h) = %v, %v; want about 1h", left, known)
	}
	if left, known := LeaseRemaining(scope, now-1); !known || left > 0 {
		t.Errorf("LeaseRemaining(own scope, a moment ago) = %v, %v; want ended", left, known)
	}
	if BootID() != "" {
		other := strings.Replace(scope, BootID(), "00000000-0000-0000-0000-000000000000", 1)
		if left, known := LeaseRemaining(other, now+int64(time.Hour)); !known || left > 0 {
			t.Errorf("LeaseRemaining(another boot) = %v, %v; want ended", left, known)
		}
	}
	if mine := host.scope(); mine.timeNS != "" {
		other := mine
		other.timeNS = "1"
		sc := other.String() + leaseTag
		if _, known := LeaseRemaining(sc, now-1); known {
			t.Errorf("LeaseRemaining(another time namespace) known; want unknown (a live lease)")
		}
	}
}
