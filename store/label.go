package store

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxLabelLen is the longest label, in bytes, that a reservation or a
// sticky port may carry.
const MaxLabelLen = 256

// labelWant is what a label may be, for error messages.
var labelWant = fmt.Sprintf("at most %d bytes of printable UTF-8 (no control characters)", MaxLabelLen)

// CheckLabel reports whether label may be stored: at most MaxLabelLen
// bytes of valid UTF-8, every character printable (a label is shown to
// people in terminals, where control and escape sequences would forge
// output). The error is a *FieldError for the field "label" that says
// what is wrong and where.
func CheckLabel(label string) error {
	if why := labelProblem(label); why != "" {
		return &FieldError{Field: "label", Value: label, Want: labelWant + "; " + why}
	}
	return nil
}

func labelProblem(label string) string {
	if len(label) > MaxLabelLen {
		return fmt.Sprintf("it has %d bytes", len(label))
	}
	for i, r := range label {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(label[i:]); size == 1 {
				return fmt.Sprintf("it has a byte that is not UTF-8 (%s) at byte %d", quoteFirst(label[i:]), i)
			}
			return fmt.Sprintf("it has U+FFFD, the replacement character, at byte %d", i)
		}
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("it has %s at byte %d", quoteFirst(label[i:]), i)
		}
	}
	return ""
}

// quoteFirst quotes the first character of s for an error message: 'x'
// or '\x1b' for a rune, "\xff" for a byte that does not start UTF-8.
func quoteFirst(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && size <= 1 {
		return strconv.Quote(s[:min(1, len(s))])
	}
	return strconv.QuoteRune(r)
}
