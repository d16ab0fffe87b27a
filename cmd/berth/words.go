package main

import (
	"errors"
	"strings"

	"github.com/berth-go/berth/portalloc"
)

// requestFlags names the flag each field of a portalloc.Request (or of the
// fleet-wide requests) comes from on berth's command line.
var requestFlags = map[string]string{
	"Request.Label":    "--label",
	"Request.Address":  "--addr",
	"Request.Protocol": "--udp",
	"Request.Order":    "--order",
	"Request.Prefer":   "--prefer",
	"Config.Store":     "--store",

	"FleetRequest.Holder":     "--holder",
	"FleetRequest.Band":       "--band",
	"FleetRequest.TTL":        "--ttl",
	"FleetRequest.Label":      "--label",
	"FleetRequest.Addr":       "--addr",
	"FleetRequest.Protocol":   "--udp",
	"FleetSetRequest.Holder":  "--holder",
	"FleetSetRequest.Band":    "--band",
	"FleetSetRequest.TTL":     "--ttl",
	"FleetReservation.Holder": "--holder",
	"FleetReservation.Addr":   "--addr",
	"ttl":                     "--ttl",
}

// inUserWords puts an error of portalloc into the words of berth's users:
// a refused Request field is named by the flag its value came from, and the
// library's "portalloc: " prefix goes, since the command's name leads the
// line. The error still wraps what it wrapped.
func inUserWords(err error) error {
	var fe *portalloc.FieldError
	if errors.As(err, &fe) {
		field, _, _ := strings.Cut(fe.Field, "[") // Request.Prefer[2]
		if flag, ok := requestFlags[field]; ok {
			named := *fe
			named.Field = flag
			return &userError{msg: named.Error(), err: err}
		}
	}
	if msg, ok := strings.CutPrefix(err.Error(), "portalloc: "); ok {
		return &userError{msg: msg, err: err}
	}
	return err
}

// userError is an error with a message of berth's own.
type userError struct {
	msg string
	err error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.err }
