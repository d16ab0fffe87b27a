package portalloc

import (
	"errors"

	"github.com/berth-go/berth/store"
)

// checkLabel checks Request.Label by the one label rule of package store.
// The error is a *FieldError naming Request.Label, without a prefix: the
// public call adds it.
func checkLabel(label string) error {
	var fe *FieldError
	if err := store.CheckLabel(label); errors.As(err, &fe) {
		named := *fe
		named.Field = "Request.Label"
		return &named
	}
	return nil
}
