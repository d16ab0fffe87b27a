package statestore

import "github.com/berth-go/berth/store"

// MaxLabelLen is the longest label, in bytes, that a reservation or a
// sticky port may carry.
const MaxLabelLen = store.MaxLabelLen

// CheckLabel reports whether label may be stored: at most MaxLabelLen
// bytes of valid UTF-8 with every character printable (a label is shown to
// people in terminals, where escape sequences would forge output). The
// error is a *FieldError naming the field. It is store.CheckLabel, the one
// rule every part of berth applies.
func CheckLabel(label string) error { return store.CheckLabel(label) }
