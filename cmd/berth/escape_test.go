package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestShown(t *testing.T) {
	tests := []struct{ in, want string }{
		{"api.http", "api.http"},
		{"", ""},
		{"ünïcödé ok", "ünïcödé ok"},
		{`back\slash`, `back\slash`},
		{"\x1b[31mred", `"\x1b[31mred"`},
		{"x\x1b]0;pwned\x07", `"x\x1b]0;pwned\a"`},
		{"a\nb", `"a\nb"`},
		{"nul\x00", `"nul\x00"`},
		{"bad\xff", `"bad\xff"`},
		{"\u202eevil", `"\u202eevil"`},
		{"c1\u009b", `"c1\u009b"`},
		{"r\ufffd", `"r\ufffd"`},
		{`"quoted"`, `"\"quoted\""`},
		{"esc\x1b and \\", `"esc\x1b and \\"`},
		// Cut to 20 characters, "…" included, never inside an escape.
		{strings.Repeat("a", 30), strings.Repeat("a", 19) + "…"},
		{strings.Repeat("é", 30), strings.Repeat("é", 19) + "…"},
		{strings.Repeat("\x1b", 30), `"\x1b\x1b\x1b\x1b"…`},
		{"\x1b[31mred\x1b[0m and more", `"\x1b[31mred\x1b[0"…`},
	}
	for _, tt := range tests {
		if got := shown(tt.in, 20); got != tt.want {
			t.Errorf("shown(%q, 20) = %s; want %s", tt.in, got, tt.want)
		}
	}
}

// TestShownBounded: whatever the input, what shown returns is printable
// and at most width characters.
func TestShownBounded(t *testing.T) {
	inputs := []string{strings.Repeat("\x1b[31m", 1000), strings.Repeat("A", 1<<20), strings.Repeat("\xff", 500), strings.Repeat("\U0001F600\u202e", 100), "\x1b"}
	for _, in := range inputs {
		for _, width := range []int{3, 4, 16, 64} {
			got := shown(in, width)
			if n := utf8.RuneCountInString(got); n > width {
				t.Errorf("shown(%.20q..., %d) has %d characters", in, width, n)
			}
			if strings.ContainsFunc(got, func(r rune) bool { return !unicode.IsPrint(r) }) || !utf8.ValidString(got) {
				t.Errorf("shown(%.20q..., %d) = %q; want it printable", in, width, got)
			}
		}
	}
}

func TestPrintable(t *testing.T) {
	tests := []struct{ in, want string }{
		{`statestore: /tmp/a "b" \c: not a database`, `statestore: /tmp/a "b" \c: not a database`},
		{"held by pid 7 (\x1b[2Jx)", `held by pid 7 (\x1b[2Jx)`},
		{"line\nforged", `line\nforged`},
		{"bad\xffbyte", `bad\xffbyte`},
	}
	for _, tt := range tests {
		if got := printable(tt.in); got != tt.want {
			t.Errorf("printable(%q) = %s; want %s", tt.in, got, tt.want)
		}
	}
}

// TestJSONSafe: what encoding/json leaves raw and a terminal acts on is
// escaped, and the JSON still decodes to the same value.
func TestJSONSafe(t *testing.T) {
	for _, s := range []string{"plain", "\x7fdel", "c1\u0085\u009b", "\u202eevil\u2028", "emoji \U0001F600", "\U000E0001tag", "\x1b[31m"} {
		b, err := json.MarshalIndent(map[string]string{"label": s}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		safe := jsonSafe(b)
		if strings.ContainsFunc(string(safe), func(r rune) bool { return r != '\n' && !unicode.IsPrint(r) }) {
			t.Errorf("jsonSafe(%q) = %q; want no control or format characters", b, safe)
		}
		var back map[string]string
		if err := json.Unmarshal(safe, &back); err != nil || back["label"] != s {
			t.Errorf("jsonSafe(%q) decodes to %q, %v; want %q", b, back["label"], err, s)
		}
	}
}
