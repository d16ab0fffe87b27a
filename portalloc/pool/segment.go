package pool

import "github.com/berth-go/berth/store"

// segment returns the segment s names, or a *store.FieldError for a value
// that names none.
func (s Spec) segment() (string, error) {
	switch s.Segment {
	case "", "static", "dynamic":
		return s.Segment, nil
	}
	return "", &store.FieldError{Field: "Spec.Segment", Value: s.Segment, Want: `"static" or "dynamic" (or empty: the Allocator's range, or Range)`}
}
