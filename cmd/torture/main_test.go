package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/store"

	"github.com/berth-go/berth/internal/testports"
)

// TestSmallRangeIsTorturesTestRange: the harness's default range, which its
// own test runs on, is the range internal/testports keeps for it.
func TestSmallRangeIsTorturesTestRange(t *testing.T) {
	if want := store.Range(testports.Torture); SmallRange != want {
		t.Errorf("SmallRange = %v; want %v, cmd/torture's range in internal/testports", SmallRange, want)
	}
}

// TestConfigFromFlags: the flags make the Config Run gets; a bad -range
// is named.
func TestConfigFromFlags(t *testing.T) {
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	cfg, err := configFromFlags(fs, []string{"-workers", "3", "-range", "27000-27009", "-store", "auto", "-v"})
	if err != nil {
		t.Fatal(err)
	}
	want := store.Range{First: 27000, Last: 27009}
	if cfg.Workers != 3 || cfg.Range != want || cfg.Store != StoreAuto || cfg.Progress == nil || cfg.Duration != 20*time.Second {
		t.Errorf("configFromFlags = %+v; want 3 workers on %v, -store auto, progress and the default 20s", cfg, want)
	}
	fs = flag.NewFlagSet("torture", flag.ContinueOnError)
	if _, err := configFromFlags(fs, []string{"-range", "9-1"}); err == nil || !strings.HasPrefix(err.Error(), "-range: ") {
		t.Errorf("configFromFlags(-range 9-1) = %v; want an error naming -range", err)
	}
}

// TestSetDefaults: the zero Config runs 6 workers on SmallRange for 20 s;
// a combination the run cannot honour is refused before anything starts.
func TestSetDefaults(t *testing.T) {
	var c Config
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.Workers != 6 || c.Range != SmallRange || c.Duration != 20*time.Second || c.KillEvery != 500*time.Millisecond ||
		c.Timeout != 10*time.Second || c.Seed == 0 || c.FleetWorkers != 0 || c.RetireEvery != 0 {
		t.Errorf("Config{}.setDefaults() made %+v; want the documented defaults", c)
	}
	for _, tt := range []struct {
		c    Config
		want error
	}{
		{Config{Hosts: 2}, errHostsNeedStore},
		{Config{Store: "host=/tmp", Leases: true}, errLeasesSQLite},
		{Config{Store: "host=/tmp", LoseStore: time.Second}, errLoseStoreSQLite},
		{Config{SyncStandby: true}, errBadFaults},
	} {
		if err := tt.c.setDefaults(); !errors.Is(err, tt.want) {
			t.Errorf("Config%+v.setDefaults() = %v; want %v", tt.c, err, tt.want)
		}
	}
	if c := (Config{Range: store.Range{First: 9, Last: 1}}); c.setDefaults() == nil {
		t.Errorf("Config{Range: 9-1}.setDefaults() = nil; want the range refused")
	}
}
