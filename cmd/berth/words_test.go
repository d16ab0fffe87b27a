package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-go/berth/internal/mru"
	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/store"
)

// The library's advice names its Request and Config fields; berth's
// messages name the flags instead, never a Go field.
func TestInUserWordsNamesFlags(t *testing.T) {
	reserved := &store.FieldError{Field: "Request.Prefer[0]", Value: "24001",
		Want: "a port outside net.ipv4.ip_local_reserved_ports (24000-24010), which the administrator keeps for other software; set Request.AllowOSReserved to take it anyway"}
	for _, c := range []struct {
		err        error
		want, dont string
	}{
		{reserved, "--prefer \"24001\" at item 1: want a port outside net.ipv4.ip_local_reserved_ports (24000-24010), which the administrator keeps for other software; set --allow-reserved to take it anyway", "Request."},
		{&portalloc.OpError{Op: "reserve", Err: &store.FieldError{Field: "port", Value: "24001", Want: "a port outside ...; set Request.AllowOSReserved to take it anyway"}},
			"set --allow-reserved to take it anyway", "Request."},
		{fmt.Errorf("portalloc: Config.Range %q: want ports from 1024 up: ports below 1024 belong to system services; set Config.AllowPrivileged (BERTH_ALLOW_PRIVILEGED=true) to hand them out", "80-90"),
			"set --allow-privileged (BERTH_ALLOW_PRIVILEGED=true) to hand them out", "Config."},
		{errors.New("portalloc: reserve: a sticky request (Request.Sticky) needs Request.Label"), "a sticky request (--sticky) needs --label", "Request."},
	} {
		got := inUserWords(c.err).Error()
		if !strings.Contains(got, c.want) || strings.Contains(got, c.dont) {
			t.Errorf("inUserWords(%q) = %q; want it to hold %q and no %q", c.err, got, c.want, c.dont)
		}
	}
}

// A range of one port that is taken says "no free" once.
func TestInUserWordsOnePortTaken(t *testing.T) {
	scan := fmt.Errorf("scan for tcp on 127.0.0.1: %w", store.ErrExhausted)
	fromMRU := fmt.Errorf("%w: %w", store.ErrExhausted, mru.ErrExhausted)
	for _, c := range []struct {
		err  error
		want string
	}{
		{&portalloc.OpError{Op: "allocate", Err: fmt.Errorf("no free tcp port on 127.0.0.1 in 21282: %w", scan)},
			"no free tcp port on 127.0.0.1 in 21282: the range's only port is taken"},
		{&portalloc.OpError{Op: "allocate", Err: fmt.Errorf("no free tcp port on 127.0.0.1 in 21282: %w", fromMRU)},
			"no free tcp port on 127.0.0.1 in 21282: the range's only port is taken or was handed out recently"},
		// A range of more ports keeps its words.
		{&portalloc.OpError{Op: "allocate", Err: fmt.Errorf("no free tcp port on 127.0.0.1 in 21282-21283: %w", scan)},
			"no free tcp port on 127.0.0.1 in 21282-21283: scan for tcp on 127.0.0.1: no free port in the range"},
	} {
		got := inUserWords(c.err)
		if got.Error() != c.want || !errors.Is(got, store.ErrExhausted) {
			t.Errorf("inUserWords(%q) = %q; want %q, wrapping ErrExhausted", c.err, got, c.want)
		}
	}
}
