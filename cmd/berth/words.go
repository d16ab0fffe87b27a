package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// requestFlags names the flag each field of a portalloc.Request comes
// from on berth's command line, and each field of a holder's request
// (lease and fleet-wide), which package store names.
var requestFlags = map[string]string{
	"Request.Label":    "--label",
	"Request.Addr":     "--addr",
	"Request.Protocol": "--udp",
	"Request.Order":    "--order",
	"Request.Prefer":   "--prefer",
	"Config.StoreDSN":  "--store",
	"Config.StateDir":  "--state-dir",
	"Config.Range":     "--range",
	"Config.Mode":      "--mode",
	"Config.Scope":     "--scope",
	"Config.Timeout":   "--timeout",

	// A holder's requests, as package store names their fields.
	"holder": "--holder",
	"band":   "--band",
	"ttl":    "--ttl",
	"label":  "--label",
}

// inUserWords puts an error of portalloc into the words of berth's users:
// a refused field of a request is named by its flag, as --flag "value"
// (requestFlags), and the library's "portalloc: " prefix goes, since the
// command's name leads the line. The error still wraps what it wrapped.
func inUserWords(err error) error {
	var fe *store.FieldError
	if errors.As(err, &fe) {
		field, index, _ := strings.Cut(fe.Field, "[") // Request.Prefer[2]
		if flag, ok := requestFlags[field]; ok {
			named := *fe
			named.Field = flag
			if n, err := strconv.Atoi(strings.TrimSuffix(index, "]")); err == nil && named.At == "" {
				named.At = "item " + strconv.Itoa(n+1) // of the flag's list: --prefer 3000,0
			}
			return &userError{msg: named.Error(), err: err}
		}
	}
	msg, ok := strings.CutPrefix(err.Error(), "portalloc: ")
	if !ok && !strings.Contains(msg, "Config.") {
		return err
	}
	// The library's advice names its Config fields; here the flags.
	for field, flag := range requestFlags {
		if strings.HasPrefix(field, "Config.") {
			msg = strings.ReplaceAll(msg, " or "+field, " (or "+flag+")")
			msg = strings.ReplaceAll(msg, field, flag)
		}
	}
	// A call named by a verb alone ("allocate", "reserve") is what the
	// command's name says already: "berth get: state store unavailable",
	// not "berth get: allocate: state store unavailable". A verb with what
	// it acted on stays.
	var oe *portalloc.OpError
	if errors.As(err, &oe) && oe.Op != "" && !strings.ContainsRune(oe.Op, ' ') {
		msg = strings.TrimPrefix(msg, oe.Op+": ")
	}
	return &userError{msg: msg, err: err}
}

// userError is an error with a message of berth's own.
type userError struct {
	msg string
	err error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.err }

// inSpecWords words a refused set spec of --set: where in the spec, the
// value found there and what is accepted, as `groups[1].ports[0] "PORT":
// want ...`; the flag and the file lead the line.
func inSpecWords(err error) error {
	var fe *store.FieldError
	if !errors.As(err, &fe) || fe.Field != "SetSpec" {
		return inUserWords(err)
	}
	named := *fe
	named.Field, named.At = fe.At, ""
	if named.Field == "" {
		named.Field = "spec"
	}
	return &userError{msg: named.Error(), err: err}
}
