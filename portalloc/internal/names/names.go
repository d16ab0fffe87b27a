// Package names holds the one rule of the names of sets, groups, ports
// and pools (package portset and package pool), and how an error message
// quotes what a caller gave.
package names

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/berth-go/berth/store"
)

// Limits of names, in bytes: see portset.MaxNameLen and
// portset.MaxEnvNameLen, which are these.
const (
	MaxLen    = 64
	MaxEnvLen = 256
)

// Problem says what is wrong with a set, group, port or pool name, or
// "" when it may be used.
func Problem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case len(name) > MaxLen:
		return fmt.Sprintf("it has %d bytes", len(name))
	case !isLetter(name[0]):
		return fmt.Sprintf("it starts with %s", QuoteFirst(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetter(c) && !isDigit(c) && c != '_' && c != '-' {
			return fmt.Sprintf("it has %s at byte %d", QuoteFirst(name[i:]), i)
		}
	}
	return ""
}

// Want is what a name may be, for error messages.
var Want = fmt.Sprintf("1 to %d ASCII letters, digits, '_' or '-', starting with a letter, such as \"api\" or \"http-admin\"", MaxLen)

// Check checks a name outside a SetSpec (a pool's); field names it.
// The error is a *store.FieldError for field.
func Check(field, name string) error {
	if why := Problem(name); why != "" {
		return &store.FieldError{Field: field, Value: name, Want: Want + "; " + why}
	}
	return nil
}

// EnvProblem says what is wrong with an environment variable name a
// SetSpec gives, or "" when it may be used.
func EnvProblem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case len(name) > MaxEnvLen:
		return fmt.Sprintf("it has %d bytes", len(name))
	case isDigit(name[0]):
		return "it starts with a digit"
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetter(c) && !isDigit(c) && c != '_' {
			return fmt.Sprintf("it has %s at byte %d", QuoteFirst(name[i:]), i)
		}
	}
	return ""
}

var EnvWant = fmt.Sprintf("an environment variable name: 1 to %d ASCII letters, digits and '_', not starting with a digit", MaxEnvLen)

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }

// QuoteFirst quotes the first character of s for an error message: 'x'
// or '\x1b' for a rune, "\xff" for a byte that does not start UTF-8.
func QuoteFirst(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && size <= 1 {
		return strconv.Quote(s[:min(1, len(s))])
	}
	return strconv.QuoteRune(r)
}

// quoteMax is how many bytes of a refused value an error message quotes.
const quoteMax = 64

// QuoteShort quotes s for an error message: escaped, so that no control
// character or invalid byte reaches a terminal, and cut after quoteMax
// bytes, so that a megabyte of input makes a short message.
func QuoteShort(s string) string {
	if len(s) <= quoteMax {
		return strconv.Quote(s)
	}
	cut := quoteMax
	for cut > quoteMax-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut-- // do not split a rune
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
