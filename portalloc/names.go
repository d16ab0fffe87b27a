package portalloc

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

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
	// MaxNameLen is the longest set, group, port or pool name, in bytes.
	// A name is 1 to MaxNameLen ASCII letters, digits, '_' and '-',
	// starting with a letter: names are joined with '/' and '.' into
	// labels and references, and upper-cased (with '-' as '_') into
	// environment variable names, so they hold neither separator, are
	// never read as a member index, and always make a valid variable
	// name. The longest set label, "set/group/9999/port", stays within
	// MaxLabelLen.
	MaxNameLen = 64
	// MaxEnvNameLen is the longest environment variable name a SetSpec
	// names itself (PortSpec.Env, RefSpec.Env), in bytes: ASCII letters,
	// digits and '_', not starting with a digit. Derived names,
	// "<GROUP>_<PORT>_PORT", have at most 2*MaxNameLen+6 bytes.
	MaxEnvNameLen = 256
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

// nameProblem says what is wrong with a set, group, port or pool name, or
// "" when it may be used.
func nameProblem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case len(name) > MaxNameLen:
		return fmt.Sprintf("it has %d bytes", len(name))
	case !isLetter(name[0]):
		return fmt.Sprintf("it starts with %s", quoteFirst(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetter(c) && !isDigit(c) && c != '_' && c != '-' {
			return fmt.Sprintf("it has %s at byte %d", quoteFirst(name[i:]), i)
		}
	}
	return ""
}

// nameWant is what a name may be, for error messages.
var nameWant = fmt.Sprintf("1 to %d ASCII letters, digits, '_' or '-', starting with a letter, such as \"api\" or \"http-admin\"", MaxNameLen)

// checkName checks a name outside a SetSpec (a pool's); field names it.
// The error wraps ErrInvalidRequest.
func checkName(field, name string) error {
	if why := nameProblem(name); why != "" {
		return fmt.Errorf("portalloc: %w: %s %s: want %s; %s", ErrInvalidRequest, field, quoteShort(name), nameWant, why)
	}
	return nil
}

// envNameProblem says what is wrong with an environment variable name a
// SetSpec gives, or "" when it may be used.
func envNameProblem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case len(name) > MaxEnvNameLen:
		return fmt.Sprintf("it has %d bytes", len(name))
	case isDigit(name[0]):
		return "it starts with a digit"
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetter(c) && !isDigit(c) && c != '_' {
			return fmt.Sprintf("it has %s at byte %d", quoteFirst(name[i:]), i)
		}
	}
	return ""
}

var envNameWant = fmt.Sprintf("an environment variable name: 1 to %d ASCII letters, digits and '_', not starting with a digit", MaxEnvNameLen)

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }

// quoteFirst quotes the first character of s for an error message: 'x'
// or '\x1b' for a rune, "\xff" for a byte that does not start UTF-8.
func quoteFirst(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && size <= 1 {
		return strconv.Quote(s[:min(1, len(s))])
	}
	return strconv.QuoteRune(r)
}

// quoteMax is how many bytes of a refused value an error message quotes.
const quoteMax = 64

// quoteShort quotes s for an error message: escaped, so that no control
// character or invalid byte reaches a terminal, and cut after quoteMax
// bytes, so that a megabyte of input makes a short message.
func quoteShort(s string) string {
	if len(s) <= quoteMax {
		return strconv.Quote(s)
	}
	cut := quoteMax
	for cut > quoteMax-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut-- // do not split a rune
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
