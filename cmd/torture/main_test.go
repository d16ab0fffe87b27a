package main

import (
	"testing"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc"
)

// TestSmallRangeIsTorturesTestRange: the harness's default range, which its
// own test runs on, is the range internal/testports keeps for it.
func TestSmallRangeIsTorturesTestRange(t *testing.T) {
	if want := portalloc.Range(testports.Torture); SmallRange != want {
		t.Errorf("SmallRange = %v; want %v, cmd/torture's range in internal/testports", SmallRange, want)
	}
}
