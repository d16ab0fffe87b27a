package main

import (
	"errors"
	"regexp"
	"strconv"
	"strings"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// requestFlags names the flag of each field of portalloc's Request and Config, and of a
// holder's request as package store names them.
var requestFlags = map[string]string{
	"Request.Label":                 "--label",
	"Request.Addr":                  "--addr",
	"Request.Protocol":              "--udp",
	"Request.Order":                 "--order",
	"Request.Prefer":                "--prefer",
	"Request.Sticky":                "--sticky",
	"Request.Holder":                "--holder",
	"Request.TTL":                   "--ttl",
	"Request.AllowOSReserved":       "--allow-reserved",
	"Config.AllowPrivileged":        "--allow-privileged",
	"Config.AllowBrowserRestricted": "--allow-browser-restricted",
	"Config.StoreDSN":               "--store",
	"Config.StateDir":               "--state-dir",
	"Config.Range":                  "--range",
	"Config.Mode":                   "--mode",
	"Config.Scope":                  "--scope",
	"Config.Timeout":                "--timeout",

	// A holder's requests, as package store names their fields.
	"holder": "--holder",
	"band":   "--band",
	"ttl":    "--ttl",
	"label":  "--label",
}

// inUserWords puts an error of portalloc into berth's words: a field named by its flag
// (requestFlags), without the "portalloc: " prefix, since the command's name leads the
// line. It still wraps what it wrapped.
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
			return &userError{msg: flagWords(named.Error()), err: err}
		}
	}
	msg, ok := strings.CutPrefix(err.Error(), "portalloc: ")
	if !ok && !strings.Contains(msg, "Config.") && !strings.Contains(msg, "Request.") {
		return err
	}
	msg = flagWords(msg)
	// A verb alone ("allocate") says what the command's name says already; a verb with
	// what it acted on stays.
	var oe *portalloc.OpError
	if errors.As(err, &oe) && oe.Op != "" && !strings.ContainsRune(oe.Op, ' ') {
		msg = strings.TrimPrefix(msg, oe.Op+": ")
	}
	// A range of one port that is taken: the library's words say "no free" at each level
	// of the error; once is enough.
	if m := onePortExhausted.FindStringSubmatch(msg); m != nil && errors.Is(err, store.ErrExhausted) {
		msg = m[1] + ": the range's only port is taken"
		if errors.Is(err, mru.ErrExhausted) {
			msg += " or was handed out recently"
		}
	}
	return &userError{msg: msg, err: err}
}

// flagWords puts the flags of berth for the library's Config and Request fields that its
// advice names.
func flagWords(msg string) string {
	for field, flag := range requestFlags {
		if strings.HasPrefix(field, "Config.") || strings.HasPrefix(field, "Request.") {
			msg = strings.ReplaceAll(msg, " or "+field, " (or "+flag+")")
			msg = strings.ReplaceAll(msg, field, flag)
		}
	}
	return msg
}

// onePortExhausted matches the error of a range of one port with no free port, as "no
// free tcp port on 127.0.0.1 in 21282: ...".
var onePortExhausted = regexp.MustCompile(`^(no free .*? in \d+): `)

// userError is an error with a message of berth's own.
type userError struct {
	msg string
	err error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.err }

// inSpecWords words a refused set spec of --set as `groups[1].ports[0] "PORT": want ...`;
// the flag and the file lead the line.
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
