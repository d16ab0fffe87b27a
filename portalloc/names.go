package portalloc

import (
	"errors"
	"fmt"

	"github.com/berth-go/berth/store"
)

// Limits on the strings callers give berth. Labels and names end up in the
// state store, in listings that people read in terminals, in environment
// variables and in systemd's LISTEN_FDNAMES; the limits keep every one of
// them printable, unambiguous and small.
const (
	// MaxLabelLen is the longest Request.Label, in bytes. A label is at
	// most this long, valid UTF-8 and printable: no control character
	// (NUL, ESC, newline, tab, DEL, the C1 controls) and nothing else that
	// unicode.IsPrint refuses (format characters such as the bidirectional
	// overrides, separators other than the ASCII space), nor U+FFFD, the
	// mark of bytes that were not UTF-8. A terminal that shows such a
	// label shows what it says, never a forged row or a colour change.
	// The state store holds labels to the same rule.
	MaxLabelLen = store.MaxLabelLen
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
