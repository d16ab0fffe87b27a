package store

import "github.com/berth-go/berth/internal/portrange"

// Range is the ports First through Last, both included: the one port-range
// type of berth. portalloc.Range, portalloc.Band and pgstore.Band are
// other names of it, and FleetRequest.Band is one. The zero Range is empty
// and not valid. Its methods:
//
//	Size() int                 the number of ports in it; 0 for an invalid range
//	Contains(p uint16) bool    whether p is in it
//	Overlaps(o Range) bool     whether it and o share a port
//	String() string            "FIRST-LAST", or "PORT" for one port
//	Validate() error           nil for a non-empty range of ports 1-65535,
//	                           FIRST <= LAST; else a *FieldError
//	Valid() error              Validate, under its deprecated name
type Range = portrange.Range

// MaxBlock is the most ports one ScanBlock reserves.
const MaxBlock = 1024
