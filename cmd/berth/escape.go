package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What berth prints comes partly from the state store, where a row can
// hold anything (an older berth's, another program's, a hand's). A label
// or process name printed as it is could move the cursor, retitle the
// terminal or forge a row: so each is shown escaped, cut to a width.

const (
	maxLabelWidth = 64 // characters ls and reap show of a label
	maxNameWidth  = 16 // characters ls shows of a process name
)

// shown returns s as berth prints a label or a process name: as it is when
// it is printable UTF-8 not starting with '"'; otherwise quoted as Go
// quotes ("\x1b]0;pwned\a"), so the quotes tell an escaped string from one
// that contains a backslash. It is cut to width characters, ending in "…".
func shown(s string, width int) string {
	if !unprintable(s) && !strings.HasPrefix(s, `"`) {
		if utf8.RuneCountInString(s) <= width {
			return s
		}
		return string([]rune(s)[:width-1]) + "…"
	}
	var b strings.Builder
	b.WriteByte('"')
	n := 1 // characters written; the closing quote needs one more
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		piece := escapeRune(s[i:i+size], r)
		i += size
		w := utf8.RuneCountInString(piece)
		// Keep room for the closing quote, and for "…" if more follows.
		if n+w+1 > width || (i < len(s) && n+w+2 > width) {
			return b.String() + `"…`
		}
		b.WriteString(piece)
		n += w
	}
	return b.String() + `"`
}

// unprintable reports whether s holds invalid UTF-8, U+FFFD or a character
// that is not printable.
func unprintable(s string) bool {
	return !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) })
}

// escapeRune is r, encoded (or an invalid byte) as c, inside a quoted
// string: itself or a Go escape; U+FFFD too, not to be taken for an invalid
// byte.
func escapeRune(c string, r rune) string {
	if r == utf8.RuneError && len(c) > 1 {
		return `\ufffd`
	}
	q := strconv.Quote(c)
	return q[1 : len(q)-1]
}

// printable escapes what a terminal would act on in a message: control and
// format characters and invalid UTF-8; quotes and backslashes stay, so
// ordinary messages read as they always did.
func printable(s string) string {
	if !unprintable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == '\\' || r == '"' {
			b.WriteRune(r)
		} else {
			b.WriteString(escapeRune(s[i:i+size], r))
		}
		i += size
	}
	return b.String()
}

// jsonSafe escapes, in encoding/json's output, what it leaves but a
// terminal acts on (DEL, C1 controls, format characters such as the
// bidirectional overrides, line and paragraph separators). Those can only
// stand inside strings, where \uXXXX means the same, so programs read the
// same values. Newlines are the indentation's.
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
