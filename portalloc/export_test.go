package portalloc_test

import "github.com/berth-go/berth/internal/portrange"

func ephemeral() (portrange.Range, error) { return portrange.Ephemeral() }
