package main

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What berth prints comes partly from the state store, and a row can hold
// anything: one written by an older berth, by another program or by hand.
// A label or process name printed as it is could move the cursor, retitle
// the terminal, clear the screen or forge a row of its own. So every such
// string is shown escaped, and cut to a width.

// maxLabelWidth is how many characters ls and reap show of a label; a
// longer one is cut and ends in "…".
const maxLabelWidth = 64

// maxNameWidth is how many characters ls shows of a process name.
const maxNameWidth = 16

// shown returns s as berth prints a label or a process name: as it is when
// it is printable UTF-8 that does not start with '"'; otherwise quoted and
// escaped as Go quotes a string ("\x1b]0;pwned\a", "bad\xff"), so that
// nothing in it reaches the terminal as a control and the quotes tell an
// escaped string from one that merely contains a backslash. Either way the
// result is at most width characters: a longer one is cut and ends in "…"
// (after the closing quote, when quoted).
func shown(s string, width int) string {
	if !needsQuote(s) {
		if utf8.RuneCountInString(s) <= width {
			return s
		}
		var b strings.Builder
		n := 0
		for _, r := range s {
			if n == width-1 {
				break
			}
			b.WriteRune(r)
			n++
		}
		return b.String() + "…"
	}
	var b strings.Builder
	b.WriteByte('"')
	n := 1 // characters written; the closing quote needs one more
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		piece := escapeRune(s[i:], r, size)
		i += size
		w := utf8.RuneCountInString(piece)
		cut := i < len(s)
		// Keep room for the closing quote, and for "…" if more follows.
		if n+w+1 > width || (cut && n+w+2 > width) {
			b.WriteString(`"…`)
			return b.String()
		}
		b.WriteString(piece)
		n += w
	}
	b.WriteByte('"')
	return b.String()
}

// needsQuote reports whether s must be shown quoted.
func needsQuote(s string) bool {
	return !utf8.ValidString(s) || strings.HasPrefix(s, `"`) ||
		strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) })
}

// escapeRune is the rune r (of size bytes, at the start of s) inside a
// quoted string: itself when printable, else a Go escape.
func escapeRune(s string, r rune, size int) string {
	switch {
	case r == utf8.RuneError && size == 1:
		return fmt.Sprintf(`\x%02x`, s[0])
	case r == '"' || r == '\\':
		return `\` + string(r)
	case r == utf8.RuneError:
		return `\ufffd`
	case unicode.IsPrint(r):
		return string(r)
	case r == '\a':
		return `\a`
	case r == '\b':
		return `\b`
	case r == '\f':
		return `\f`
	case r == '\n':
		return `\n`
	case r == '\r':
		return `\r`
	case r == '\t':
		return `\t`
	case r == '\v':
		return `\v`
	case r < 0x80:
		return fmt.Sprintf(`\x%02x`, r)
	case r <= 0xffff:
		return fmt.Sprintf(`\u%04x`, r)
	default:
		return fmt.Sprintf(`\U%08x`, r)
	}
}

// printable escapes what a terminal would act on in a message (an error,
// a path): control and format characters and invalid UTF-8 become Go
// escapes; everything else, quotes and backslashes included, is left as it
// is, so ordinary messages read as they always did.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }) && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\' || r == '"':
			b.WriteRune(r)
		default:
			b.WriteString(escapeRune(s[i:], r, size))
		}
		i += size
	}
	return b.String()
}

// jsonSafe escapes, in JSON that encoding/json wrote, the characters it
// leaves as they are but a terminal acts on: DEL, the C1 controls, the
// format characters such as the bidirectional overrides, and the line and
// paragraph separators. They can only stand inside strings (JSON's own
// syntax is ASCII), where \uXXXX means the same character, so a program
// reads the same values. Newlines between values are the indentation's.
func jsonSafe(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r != '\n' && !unicode.IsPrint(r) }) {
		return b
	}
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == '\n' || unicode.IsPrint(r):
			out.Write(b[:size])
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&out, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[size:]
	}
	return out.Bytes()
}
