package store

import (
	"fmt"
	"math"
	"time"
)

// Validate checks req as every store checks it before it touches its
// database, and returns it completed: its Key in normal form, a zero Owner
// made self (the calling process, as Self returns it), a zero Kind Static.
// A refused field is a *FieldError naming it.
func (req Request) Validate(self Owner) (Request, error) {
	key, err := req.Normalize()
	if err != nil {
		return Request{}, err
	}
	req.Key = key
	req.Owner, req.Kind, err = complete(req.Owner, req.Kind, Static, req.Label, req.TTL, self)
	return req, err
}

// Validate checks req as Request.Validate does, and returns it completed:
// its address in normal form, a zero Kind Dynamic, a zero Batch 32. Next
// must be set.
func (req ScanRequest) Validate(self Owner) (ScanRequest, error) {
	if req.Next == nil {
		return ScanRequest{}, &FieldError{Field: "next", Value: "nil", Want: "a candidate iterator"}
	}
	key, err := Key{Protocol: req.Protocol, Addr: req.Addr, Port: 1}.Normalize()
	if err != nil {
		return ScanRequest{}, err
	}
	req.Protocol, req.Addr = key.Protocol, key.Addr
	if req.Batch <= 0 {
		req.Batch = 32
	}
	req.Owner, req.Kind, err = complete(req.Owner, req.Kind, Dynamic, req.Label, req.TTL, self)
	return req, err
}

func complete(own Owner, kind, def Kind, label string, ttl time.Duration, self Owner) (Owner, Kind, error) {
	switch {
	case own.IsZero():
		own = self
		fallthrough
	case own.Holder == "":
		if ttl != 0 {
			return Owner{}, "", &FieldError{Field: "ttl", Value: ttl.String(), Want: "zero for a process's reservation: only a named holder's has a lease"}
		}
	default:
		if err := CheckTTL(ttl); err != nil {
			return Owner{}, "", err
		}
	}
	if err := own.Validate(); err != nil {
		return Owner{}, "", err
	}
	switch kind {
	case "":
		kind = def
	case Dynamic, Static:
	default:
		return Owner{}, "", &FieldError{Field: "kind", Value: string(kind), Want: `"dynamic" or "static"`}
	}
	if err := CheckLabel(label); err != nil {
		return Owner{}, "", err
	}
	return own, kind, nil
}

// Validate returns nil for an owner a store can record: a named holder
// whose name is 1 to MaxHolderLen bytes of printable UTF-8, or a process
// with a pid from 1 to 2^31-1 (what every system hands out, and what
// PostgreSQL's integer column holds) and a start or namespace, as Self and
// LookupOwner return it. Otherwise a *FieldError for "owner" or "holder".
func (o Owner) Validate() error {
	if o.Holder != "" {
		if o.PID != 0 {
			return &FieldError{Field: "owner", Value: fmt.Sprintf("pid %d and holder %s", o.PID, quote(o.Holder)), Want: "a process or a named holder, not both"}
		}
		return checkHolder(o.Holder)
	}
	if o.PID <= 0 || o.PID > math.MaxInt32 || (o.Start == 0 && o.Namespace == "") {
		return &FieldError{Field: "owner", Value: fmt.Sprintf("pid %d start %d", o.PID, o.Start), Want: "a live process as store.Self or store.LookupOwner returns it (pid 1 to 2147483647), or a named holder"}
	}
	return nil
}
