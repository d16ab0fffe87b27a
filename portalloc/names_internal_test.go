package portalloc

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/berth-go/berth/portalloc/internal/names"
	"github.com/berth-go/berth/store"
)

// labelErr is what an Allocator's request checks make of label.
func labelErr(label string) error {
	a := &Allocator{cfg: Config{Order: OrderRandom, Range: store.Range{First: 29000, Last: 29099}}}
	_, err := a.normalize(Request{Label: label})
	return err
}

// FuzzCheckLabel: the label check of a request never panics; every label
// it accepts is within store.MaxLabelLen bytes of valid, printable UTF-8,
// as store.CheckLabel accepts it; every refusal wraps ErrInvalid, names
// Request.Label and is itself short and printable, whatever it quotes. The
// set-name check is held to its own rule on the same input, and the
// labels of a set's and a pool's ports made of accepted names are
// accepted.
func FuzzCheckLabel(f *testing.F) {
	for _, s := range []string{
		"", "api.http", "dev/api/0/http", "pool:hot", "ünïcödé ok", "with space",
		"\x1b[31mred\x1b[0m", "\x1b]0;pwned\x07", "web\ntcp 127.0.0.1 8080 forged", "nul\x00byte",
		"bad\xffutf8", "\u202eevil", "nbsp\u00a0", "\ufffd", "tab\t", "del\x7f", "c1\u009b",
		strings.Repeat("a", store.MaxLabelLen), strings.Repeat("a", store.MaxLabelLen+1), strings.Repeat("é", 200),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, label string) {
		err := labelErr(label)
		if sErr := store.CheckLabel(label); (err == nil) != (sErr == nil) {
			t.Fatalf("a request's label check of %q = %v but store.CheckLabel = %v; want the same rule in both", label, err, sErr)
		}
		if err == nil {
			if len(label) > store.MaxLabelLen || !utf8.ValidString(label) {
				t.Fatalf("label %q accepted; want an error: %d bytes, valid UTF-8 %v", label, len(label), utf8.ValidString(label))
			}
			for _, r := range label {
				if !unicode.IsPrint(r) || r == utf8.RuneError {
					t.Fatalf("label %q accepted; want an error for %q", label, r)
				}
			}
		} else {
			var fe *store.FieldError
			if !errors.Is(err, store.ErrInvalid) || !errors.As(err, &fe) || fe.Field != "Request.Label" {
				t.Fatalf("label %q refused with %v; want a *FieldError for Request.Label", label, err)
			}
			printableMessage(t, err)
		}

		if err := names.Check("pool name", label); err == nil {
			if label == "" || len(label) > names.MaxLen || !isASCIILetter(label[0]) ||
				strings.ContainsFunc(label, func(r rune) bool {
					return r > unicode.MaxASCII || !isASCIILetter(byte(r)) && !isASCIIDigit(byte(r)) && r != '_' && r != '-'
				}) {
				t.Fatalf("names.Check(%q) = nil; want an error", label)
			}
			if labelErr("pool:"+label) != nil || labelErr(label+"/"+label+"/9999/"+label) != nil {
				t.Fatalf("name %q makes a label the request check refuses", label)
			}
		} else {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("names.Check(%q) = %v; want ErrInvalid", label, err)
			}
			printableMessage(t, err)
		}
	})
}

// printableMessage fails tb when err's message could do something to a
// terminal, or is long because its input was.
func printableMessage(tb testing.TB, err error) {
	tb.Helper()
	msg := err.Error()
	if len(msg) > 512 || !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) }) {
		tb.Fatalf("error message %q is long or not printable", msg)
	}
}

func TestCheckLabel(t *testing.T) {
	tests := []struct {
		label string
		want  string // in the error; "" for none
	}{
		{"", ""},
		{"api.http", ""},
		{"dev/api/0/http", ""},
		{"ünïcödé and spaces", ""},
		{strings.Repeat("é", store.MaxLabelLen/2), ""},
		{strings.Repeat("a", store.MaxLabelLen+1), "it has 257 bytes"},
		{"\x1b[31mred", `'\x1b' at byte 0`},
		{"x\x1b]0;pwned\x07", `'\x1b' at byte 1`},
		{"web\nforged row", `'\n' at byte 3`},
		{"nul\x00", `'\x00' at byte 3`},
		{"bad\xff", `not UTF-8 ("\xff") at byte 3`},
		{"\u202eevil", `'\u202e' at byte 0`},
		{"del\x7f", `'\x7f' at byte 3`},
		{"c1\u009b", `'\u009b' at byte 2`},
		{"nb\u00a0sp", `'\u00a0' at byte 2`},
		{"r\ufffd", "U+FFFD"},
	}
	for _, tt := range tests {
		err := labelErr(tt.label)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("label %q refused: %v; want it accepted", tt.label, err)
		case tt.want != "" && (!errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Request.Label")):
			t.Errorf("label %q = %v; want ErrInvalid for Request.Label saying %s", tt.label, err, tt.want)
		}
	}
	// A megabyte of label makes a short message.
	if err := labelErr(strings.Repeat("\x1b", 1<<20)); err == nil || len(err.Error()) > 512 {
		t.Errorf("label of 1 MiB = %.600v; want a short error", err)
	}
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isASCIIDigit(c byte) bool  { return c >= '0' && c <= '9' }
