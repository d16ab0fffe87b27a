package main

import (
	"errors"
	"slices"
	"testing"
)

// TestTeardown: a teardown undoes the steps of setup last first, takes
// every step whatever the others return, and joins the errors worth
// reporting, as Run's deferred calls did one by one.
func TestTeardown(t *testing.T) {
	var td teardown
	var order []string
	errServer := errors.New("stop the run's server")
	errHosts := errors.New("remove the hosts")
	td.add(func() error { order = append(order, "clock"); return nil })
	td.add(func() error { order = append(order, "server"); return errServer })
	td.add(func() error { order = append(order, "hosts"); return errHosts })
	td.add(func() error { order = append(order, "log"); return nil })
	err := td.run()
	if want := []string{"log", "hosts", "server", "clock"}; !slices.Equal(order, want) {
		t.Errorf("teardown ran %v; want %v", order, want)
	}
	if !errors.Is(err, errServer) || !errors.Is(err, errHosts) {
		t.Errorf("teardown.run() = %v; want both errors joined", err)
	}
	if err := (teardown{}).run(); err != nil {
		t.Errorf("teardown{}.run() = %v; want nil", err)
	}
}
