package exclude_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/testports"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/exclude"
)

// TestListLocalReserved: List names the ranges of
// net.ipv4.ip_local_reserved_ports as it finds them now. The test adds its
// range to those already there, far above berth's default range.
func TestListLocalReserved(t *testing.T) {
	reserved := portalloc.Range{First: 64990, Last: 64993}
	testports.SetLocalReserved(t, "+"+reserved.String())
	ex, err := exclude.List(portalloc.Config{})
	found := false
	for _, e := range ex {
		found = found || e.Source == "net.ipv4.ip_local_reserved_ports" && strings.Contains(fmt.Sprint(e.Ports), fmt.Sprint(reserved))
	}
	if !found || err != nil {
		t.Errorf("List() = %+v, %v; want net.ipv4.ip_local_reserved_ports with %v", ex, err, reserved)
	}
}
