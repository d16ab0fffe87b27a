package portrange

import (
	"fmt"
	"strconv"
	"strings"
)

// FieldError reports refused input: a field, flag or variable whose value
// is not accepted. It is the one shape of refused input of berth, declared
// here, the lowest package that refuses input (Range.Validate returns it), and
// named store.FieldError above (portalloc.FieldError and
// statestore.FieldError are other names of it).
type FieldError struct {
	// Field names what was refused as the caller wrote it: a field
	// ("Request.Protocol", "Config.Exclude[1]"), a variable
	// ("BERTH_PORT_RANGE"), a flag ("--range"), or for the argument of a
	// parse what it parses ("port range").
	Field string
	// Value is the value or input given, as text.
	Value string
	// At says where in Value it went wrong, when not the whole of it is:
	// an item of a list (`item 2 "70000"`), an index, an offset, or a
	// path into a document ("groups[1].ports[0].name"). Empty when Value
	// is refused whole.
	At string
	// Want says what is accepted, and after a semicolon, where it helps,
	// what is wrong with Value ("...; it is empty").
	Want string
}

// Error reads `Field "Value" at At: want Want`, leaving out what is
// empty. It quotes Value and cuts it after 64 bytes, so that a value from
// a file or a terminal can neither flood nor forge the message.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteByte(' ')
	}
	b.WriteString(Quote(e.Value))
	if e.At != "" {
		b.WriteString(" at ")
		b.WriteString(e.At)
	}
	if e.Want != "" {
		b.WriteString(": want ")
		b.WriteString(e.Want)
	} else {
		b.WriteString(": not accepted")
	}
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// MaxQuoted is the most bytes of a value Quote shows.
const MaxQuoted = 64

// Quote quotes s for a message as strconv.Quote does, cut after MaxQuoted
// bytes with "..." after the closing quote.
func Quote(s string) string {
	if len(s) > MaxQuoted {
		return strconv.Quote(s[:MaxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// rangeField is the Field of an error of a parse or of Valid: the caller
// (portalloc, the CLI) puts the name of its field, flag or variable there.
const rangeField = "port range"

// refuse returns the error for the range text s: at says where in it, why
// what is wrong.
func refuse(s, at, want, why string) *FieldError {
	if why != "" {
		want += "; " + why
	}
	return &FieldError{Field: rangeField, Value: s, At: at, Want: want}
}

// clip cuts a run of digits for a message as Quote cuts a value, without
// the quotes.
func clip(digits string) string {
	if len(digits) > MaxQuoted {
		return digits[:MaxQuoted] + "..."
	}
	return digits
}

// item names the n-th item (from 1) of a list for FieldError.At.
func item(n int, part string) string { return fmt.Sprintf("item %d %s", n, Quote(part)) }
