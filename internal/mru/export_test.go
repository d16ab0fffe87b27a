package mru

import "fmt"

// Parse parses the bytes of an MRU file of either version. It accepts
// exactly the documented formats, with valid protocols and ports; a torn
// last line of version 2 (no newline) is ignored, as readers do.
func Parse(b []byte) ([]Entry, error) {
	entries, n, err := parseStart(b)
	if err != nil || n < 0 {
		return entries, err
	}
	rest, _, bad := parseLines(b[n:])
	if bad > 0 {
		return nil, fmt.Errorf("MRU file: %d lines are not entries", bad)
	}
	return rest, nil
}
