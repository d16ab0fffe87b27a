package portalloc

import (
	"fmt"
	"net/netip"
	"time"
)

// Order is the order in which Allocate tries the ports of its range.
type Order string

const (
	// OrderRandom walks the range from a random port by a random stride,
	// the ports above the range's static segment first (see Config.Range).
	// Allocators racing on one store start in different places, so they
	// rarely want the same port: the default.
	OrderRandom Order = "random"
	// OrderLowest tries the lowest port of the range first, then the next,
	// segments ignored: predictable ports for people who read them. Allocators
	// racing on one store all want the same low ports; the store's write
	// lock makes them take turns, so none is handed out twice, and each
	// skips the ports the others hold from memory, without a probe.
	OrderLowest Order = "lowest"
)

func (o Order) valid() bool { return o == OrderRandom || o == OrderLowest }

// Backend names, as reported in Reservation.Backend.
const (
	BackendStateStore = "statestore"
	BackendMRU        = "mru"
)

// Request describes the port a caller wants.
type Request struct {
	Protocol Protocol   // zero: TCP
	Addr     netip.Addr // zero: 127.0.0.1; 0.0.0.0 and :: are the wildcards
	// Prefer lists ports for Allocate to try first, in this order, each
	// with the full guarantee (free in the store, bind-probed); when none
	// is free, Allocate goes on with the range as usual. Preferred ports
	// may lie outside Config.Range (a dev server that should land on 3000
	// when it can). At most MaxPrefer ports, none of them 0.
	Prefer []uint16
	// Order overrides Config.Order for this request.
	Order Order
	// Label is the caller's name for the port, shown in listings; zero:
	// none. It is at most store.MaxLabelLen (256) bytes of valid,
	// printable UTF-8: no control character (NUL, ESC, newline, tab, DEL,
	// the C1 controls) and nothing else that unicode.IsPrint refuses
	// (format characters such as the bidirectional overrides, separators
	// other than the ASCII space), nor U+FFFD, the mark of bytes that were
	// not UTF-8. A terminal that shows such a label shows what it says,
	// never a forged row or a colour change. The state store holds labels
	// to the same rule (store.CheckLabel).
	Label string
	// Sticky asks Allocate for the port last handed out under Label (kept
	// in the state store across restarts; in Config.Scope, when it has
	// one) when it is free and in the range; otherwise any free port, with
	// the reason logged. It needs a Label. The MRU backend remembers
	// nothing and ignores it.
	Sticky bool
	// AllowOSReserved lets Reserve, and Allocate through Prefer, take a
	// port of Linux's net.ipv4.ip_local_reserved_ports, which an
	// administrator keeps for other software: without it they refuse such
	// a port with a *FieldError that says so. Allocate never hands one out
	// from the range.
	AllowOSReserved bool
}

// Reservation is a port handed out by an Allocator.
type Reservation struct {
	Protocol Protocol
	Addr     netip.Addr
	Port     uint16
	Label    string
	Backend  string // BackendStateStore or BackendMRU
	// Holder names the holder of a reservation made under a lease
	// (package lease); "" for one this process holds.
	Holder string
	// Expires is when a holder's lease ends, for this process's clock:
	// compare it with time.Now(), which is immune to wall-clock steps in
	// the same process (see store.Reservation.Expires). Zero otherwise.
	Expires time.Time
}

// AddrPort returns the reservation's address and port.
func (r Reservation) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

func (r Reservation) String() string {
	return fmt.Sprintf("%s %s", r.Protocol, r.AddrPort())
}
