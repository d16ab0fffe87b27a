package portset

import (
	"encoding/json"
	"net/netip"
	"os"

	"github.com/berth-go/berth/store"
)

// Manifest is the JSON form of an allocated set, for discovery tools.
type Manifest struct {
	Set     string           `json:"set"`
	Members []MemberManifest `json:"members"`
}

// MemberManifest is one member in a Manifest.
type MemberManifest struct {
	Group string                  `json:"group"`
	Index int                     `json:"index"`
	Ports map[string]PortManifest `json:"ports"`
	Env   []string                `json:"env"`
}

// PortManifest is one port in a Manifest.
type PortManifest struct {
	Protocol store.Protocol `json:"protocol"`
	Addr     netip.Addr     `json:"addr"`
	Port     uint16         `json:"port"`
	Shared   bool           `json:"shared"`
	Label    string         `json:"label"`
}

// Manifest returns the whole assignment.
func (s *Set) Manifest() Manifest {
	m := Manifest{Set: s.Name}
	for _, mem := range s.members {
		mm := MemberManifest{Group: mem.Group, Index: mem.Index, Ports: map[string]PortManifest{}, Env: mem.Env()}
		for name, r := range mem.Ports {
			mm.Ports[name] = PortManifest{r.Protocol, r.Addr, r.Port, mem.shared[name], r.Label}
		}
		m.Members = append(m.Members, mm)
	}
	return m
}

// WriteManifest writes the manifest as indented JSON to path, mode 0600.
func (s *Set) WriteManifest(path string) error {
	b, err := json.MarshalIndent(s.Manifest(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}
