package portset

import (
	"fmt"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// FleetRequests validates s and returns the store requests that reserve
// its ports fleet-wide (see package portalloc/fleet's ReserveSet): one
// per port, in spec order (groups, then each group's ports, a
// member-scoped port once per member), each labelled as Allocate labels
// it, for holder under a lease of ttl. The ports that are not fixed are
// drawn from band; a fixed Port is reserved as it is. A port's zero
// Protocol is TCP, its zero Addr stays zero (the store takes it as
// 0.0.0.0). Prefer, Order and Sticky choose among a host's range and are
// refused, as is a set of more than store.MaxFleetSet ports; errors are
// ParseSetSpec's.
func (s SetSpec) FleetRequests(band store.Range, holder string, ttl time.Duration) ([]store.FleetRequest, error) {
	reqs, err := s.fleetRequests(band, holder, ttl)
	return reqs, opError("", err)
}

func (s SetSpec) fleetRequests(band store.Range, holder string, ttl time.Duration) ([]store.FleetRequest, error) {
	if _, err := s.index(setLimits); err != nil {
		return nil, err
	}
	var reqs []store.FleetRequest
	for gi, g := range s.Groups {
		for pi, p := range g.Ports {
			field := fmt.Sprintf("groups[%d].ports[%d]", gi, pi)
			switch {
			case len(p.Prefer) > 0:
				return nil, refuse(field+".prefer", portList(p.Prefer), "none in a fleet-wide set, which draws its ports from the request's band: prefer is for a host's range")
			case p.Order != "":
				return nil, refuse(field+".order", string(p.Order), "none in a fleet-wide set, which draws its ports from the request's band: order is for a host's range")
			case p.Sticky:
				return nil, refuse(field+".sticky", "true", "false in a fleet-wide set, which has no host to remember its ports on: sticky is for a host's range")
			}
			band := band
			if p.Port != 0 {
				band = store.Range{First: p.Port, Last: p.Port}
			}
			one := func(member int) {
				reqs = append(reqs, store.FleetRequest{Protocol: p.Protocol, Addr: p.Addr, Band: band, Holder: holder,
					Label: label(s.Name, g.Name, member, p.Name), TTL: ttl})
			}
			if scopeOf(p) == ScopeGroup {
				one(-1)
			} else {
				for m := range members(g) {
					one(m)
				}
			}
			if len(reqs) > store.MaxFleetSet {
				return nil, refuse(field, p.Name, fmt.Sprintf("at most %d ports reserved fleet-wide in a set (store.MaxFleetSet); this port brings them to %d", store.MaxFleetSet, len(reqs)))
			}
		}
	}
	for i := range reqs {
		if reqs[i].Protocol == "" {
			reqs[i].Protocol = portalloc.TCP
		}
	}
	return reqs, nil
}
