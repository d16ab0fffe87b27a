package pool

import "github.com/berth-go/berth/portalloc"

// segment returns the segment s names, by Segment or by its deprecated
// name Band, or a *portalloc.FieldError for a value that names none or
// for the two names set to different segments.
func (s Spec) segment() (string, error) {
	const want = `"static" or "dynamic" (or empty: the Allocator's range, or Range)`
	seg := s.Segment
	switch {
	case seg != "" && s.Band != "" && s.Band != seg:
		return "", &portalloc.FieldError{Field: "Spec.Segment", Value: seg,
			Want: want + `; Spec.Band, its deprecated name, says "` + s.Band + `": set Segment alone`}
	case seg == "":
		seg = s.Band
	}
	switch seg {
	case "", "static", "dynamic":
		return seg, nil
	}
	field := "Spec.Segment"
	if s.Segment == "" {
		field = "Spec.Band"
	}
	return "", &portalloc.FieldError{Field: field, Value: seg, Want: want}
}
