package statestore

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxLabelLen is the longest label, in bytes, that a reservation or a
// sticky port may carry.
const MaxLabelLen = 256

// CheckLabel reports whether label may be stored: at most MaxLabelLen
// bytes of valid UTF-8 with no control characters (a label is shown to
// people in terminals, where escape sequences would forge output). The
// error is a *FieldError naming the field.
func CheckLabel(label string) error {
	switch {
	case len(label) > MaxLabelLen:
		return &FieldError{Field: "label", Value: label[:32] + "...", Want: fmt.Sprintf("at most %d bytes (it has %d)", MaxLabelLen, len(label))}
	case !utf8.ValidString(label):
		return &FieldError{Field: "label", Value: label, Want: "valid UTF-8"}
	}
	for i, r := range label {
		if unicode.IsControl(r) || r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			return &FieldError{Field: "label", Value: label, Want: "printable characters only (it has " + strconv.QuoteRune(r) + " at byte " + strconv.Itoa(i) + ")"}
		}
	}
	return nil
}
