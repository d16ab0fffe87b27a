package portalloc

import (
	"errors"
	"fmt"

	"github.com/berth-go/berth/store"
)

// checkLabel checks Request.Label by the one label rule of package store.
// The error is a *FieldError naming Request.Label.
func checkLabel(label string) error {
	var fe *FieldError
	if err := store.CheckLabel(label); errors.As(err, &fe) {
		named := *fe
		named.Field = "Request.Label"
		return fmt.Errorf("portalloc: %w", &named)
	}
	return nil
}
