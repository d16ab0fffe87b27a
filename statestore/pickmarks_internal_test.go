package statestore

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/berth-go/berth/internal/marker"
	"github.com/berth-go/berth/internal/owner"
)

// TestPickMarks: a new store records, for each key, the mark of a holder
// that runs, whatever order the kernel lists the marks in; it never guesses
// between holders it could not judge for want of descriptors.
func TestPickMarks(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	mark := func(port uint16, pid int) marker.Mark {
		return marker.Mark{Protocol: "tcp", Addr: lo, Port: port, PID: pid, Start: int64(pid) * 10}
	}
	emfile := fmt.Errorf("open /proc/7/stat: %w", syscall.EMFILE)
	type judged struct {
		v   owner.Verdict
		err error
	}
	const (
		exited    = 1 // the child handed the port, exited
		holder    = 2 // the process that reserved the port since
		elsewhere = 3 // a holder in another pid namespace
		starved   = 4 // could not be read: out of descriptors
		other     = 5 // could not be read for a lasting reason
	)
	verdicts := map[int]judged{
		exited:    {owner.Dead, nil},
		holder:    {owner.Live, nil},
		elsewhere: {owner.Unknown, nil},
		starved:   {owner.Unknown, emfile},
		other:     {owner.Unknown, errors.New("stat of another pid")},
	}
	judge := func(m marker.Mark) (owner.Verdict, error) {
		j := verdicts[m.PID]
		return j.v, j.err
	}
	tests := []struct {
		name  string
		pids  []int // the owners of marks of one key, in the order listed
		want  int   // the owner recorded; 0: none, -1: the first listed
		short bool  // ErrTransient instead
	}{
		{"exited child and live holder", []int{exited, holder}, holder, false},
		{"only an exited child", []int{exited}, 0, false},
		{"live holder and one that cannot be judged", []int{elsewhere, holder}, holder, false},
		{"live holder and one unread for want of descriptors", []int{starved, holder}, holder, false},
		{"exited child and one that cannot be judged", []int{exited, elsewhere}, elsewhere, false},
		{"one unread for want of descriptors", []int{starved}, starved, false},
		{"two that cannot be judged", []int{elsewhere, other}, -1, false},
		{"two, one unread for want of descriptors", []int{elsewhere, starved}, 0, true},
	}
	for _, tt := range tests {
		for _, order := range [][]int{tt.pids, reversed(tt.pids)} {
			var marks []marker.Mark
			for _, pid := range order {
				marks = append(marks, mark(24001, pid))
			}
			marks = append(marks, mark(24002, holder)) // another key, kept in every case
			got, err := pickMarks(marks, judge)
			if tt.short {
				if !errors.Is(err, ErrTransient) || !errors.Is(err, syscall.EMFILE) {
					t.Errorf("%s, listed %v: pickMarks error = %v; want ErrTransient wrapping EMFILE", tt.name, order, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s, listed %v: pickMarks error = %v", tt.name, order, err)
				continue
			}
			want := []marker.Mark{mark(24002, holder)}
			switch tt.want {
			case 0:
			case -1:
				want = []marker.Mark{mark(24001, order[0]), mark(24002, holder)}
			default:
				want = []marker.Mark{mark(24001, tt.want), mark(24002, holder)}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s, listed %v: pickMarks = %v; want %v", tt.name, order, got, want)
			}
		}
	}
}

func reversed(s []int) []int {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}
