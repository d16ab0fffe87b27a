package store

import (
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of what a store records.
const (
	// MaxLabelLen is the longest label, in bytes.
	MaxLabelLen = 256
	// MaxHolderLen is the longest name of a holder, in bytes.
	MaxHolderLen = 255
	// MinTTL and MaxTTL bound the lease of a holder's reservation; the
	// upper one catches a unit mistake (hours for seconds) before it holds
	// a port for years.
	MinTTL = time.Second
	MaxTTL = 30 * 24 * time.Hour
	// MaxBlock is the most ports one ScanBlock reserves.
	MaxBlock = 1024
	// MaxSticky is how many (label, protocol) pairs a store remembers
	// ports for (per host, in a fleet's). Beyond it, the least recently
	// remembered are forgotten: their next sticky request gets any free
	// port.
	MaxSticky = 10000
)

// CheckLabel reports whether label may be stored: at most MaxLabelLen
// bytes of valid UTF-8, every character printable (unicode.IsPrint, and
// not U+FFFD, the mark of bytes that were not UTF-8), since a label is
// shown to people in terminals, where control and escape sequences would
// forge output. The error is a *FieldError for "label" that says what is
// wrong and where.
func CheckLabel(label string) error {
	if why := printable(label, MaxLabelLen); why != "" {
		return &FieldError{Field: "label", Value: label, Want: fmt.Sprintf("at most %d bytes of printable UTF-8 (no control characters); %s", MaxLabelLen, why)}
	}
	return nil
}

func checkHolder(name string) error {
	want := fmt.Sprintf(`a holder name of 1 to %d bytes of printable UTF-8, e.g. "ci/job-4711"`, MaxHolderLen)
	if name == "" {
		return &FieldError{Field: "holder", Value: name, Want: want + "; it is empty"}
	}
	if why := printable(name, MaxHolderLen); why != "" {
		return &FieldError{Field: "holder", Value: name, Want: want + "; " + why}
	}
	return nil
}

// CheckTTL refuses a lease outside MinTTL to MaxTTL with a *FieldError for
// "ttl".
func CheckTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return &FieldError{Field: "ttl", Value: ttl.String(), Want: "a duration from 1s to 720h (30 days), e.g. 8h"}
	}
	return nil
}

// printable says what keeps s from being at most max bytes of printable UTF-8.
func printable(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("it has %d bytes", len(s))
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Sprintf("it has a byte that is not UTF-8 (%s) at byte %d", strconv.Quote(s[i:i+1]), i)
			}
			return fmt.Sprintf("it has U+FFFD, the replacement character, at byte %d", i)
		}
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("it has %s at byte %d", strconv.QuoteRune(r), i)
		}
	}
	return ""
}
