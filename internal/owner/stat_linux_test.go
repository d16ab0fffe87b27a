package owner

import (
	"errors"
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// Command names a program can give itself (prctl PR_SET_NAME, or the
	// name of its executable): spaces, parentheses, newlines, things that
	// look like the fields that follow.
	comms := []string{
		"cat",
		"",
		"a b",
		"a) b",
		")",
		"((",
		") (",
		"a\nb",
		"x) Z 1 2 3",
		") R 1 1 0 -1",
		"berth (worker)",
		"\t\n ",
	}
	for _, comm := range comms {
		line := statLine(4242, comm, 'S', 65179)
		got, err := parseStat([]byte(line))
		want := stat{pid: 4242, comm: comm, state: 'S', threads: 1, start: 65179}
		if err != nil || got != want {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v", line, got, err, want)
		}
	}

	bad := []struct {
		line, what string
	}{
		{"", "no command name"},
		{"4242 cat S 1", "no command name"},
		{"4242 )cat( S 1", "no command name"},
		{"x (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 65179", "not a pid"},
		{"-1 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 65179", "not a pid"},
		{"4242 (cat) S 1 1 0 -1", "fields after the command name"},
		{"4242 (cat)", "fields after the command name"},
		{"4242 (cat) SS 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 65179", "state"},
		{"4242 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 x 0 65179", "num_threads"},
		{"4242 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 -1 0 65179", "num_threads"},
		{"4242 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 -5", "starttime"},
		{"4242 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 x", "starttime"},
		{"4242 (cat) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 18446744073709551615", "starttime"},
	}
	for _, tt := range bad {
		_, err := parseStat([]byte(tt.line))
		var se *statError
		if !errors.As(err, &se) || se.Line != tt.line || !strings.Contains(err.Error(), tt.what) {
			t.Errorf("parseStat(%q) error = %v; want a *statError about %q", tt.line, err, tt.what)
		}
	}
}

// FuzzParseStat checks that any line parses without panicking, and that a
// line the kernel could write gives back its pid, command name, state and
// start whatever the command name holds. Seeds: testdata/fuzz/FuzzParseStat.
func FuzzParseStat(f *testing.F) {
	f.Fuzz(func(t *testing.T, comm string, state byte, start int64) {
		_, _ = parseStat([]byte(comm))
		if start < 0 || (state < 'A' || state > 'Z') && (state < 'a' || state > 'z') {
			return // the kernel writes neither
		}
		line := statLine(4242, comm, state, start)
		got, err := parseStat([]byte(line))
		want := stat{pid: 4242, comm: comm, state: state, threads: 1, start: start}
		if err != nil || got != want {
			t.Fatalf("parseStat(%q) = %+v, %v; want %+v", line, got, err, want)
		}
	})
}
