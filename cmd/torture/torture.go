package main

import (
	"context"
	"errors"
	"time"
)

// Run runs the harness. It returns an error when it could not run; a run
// that found violations returns them in the Summary.
//
// A run goes in four steps, a file each: Config.setDefaults (defaults.go),
// setup (setup.go), supervisor.drive, the workers and the weather
// (loop.go), and supervisor.verify (verify.go).
func Run(ctx context.Context, cfg Config) (sum Summary, err error) {
	if err := cfg.setDefaults(); err != nil {
		return Summary{}, err
	}
	// Whatever happens from here on, a panic included, what setup made is
	// undone: the true time set back, the server stopped, the locks let go.
	var td teardown
	defer func() {
		if terr := td.run(); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	sup, err := setup(ctx, cfg, &td)
	if err != nil {
		return Summary{}, err
	}
	start := time.Now() // time.Since on it reads Go's monotonic clock: steps do not move it
	if err := sup.drive(ctx, start.Add(sup.cfg.Duration)); err != nil {
		return Summary{}, err
	}
	return sup.verify(ctx, start)
}
