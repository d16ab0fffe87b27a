package who_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/berth-go/berth/internal/testports"
	"github.com/berth-go/berth/portalloc/who"
)

// Lookup tells which processes hold a port: here this very program, which
// listens on it. Pass a store (portalloc.OpenStore) instead of nil to see
// berth's reservations of the port too.
func ExampleLookup() {
	unlock, err := testports.Lock(testports.Who)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer unlock()
	port := testports.Who.First + 40
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(int(port)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	reports, err := who.Lookup(context.Background(), nil, port)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range reports[0].Sockets {
		for _, p := range s.Processes {
			fmt.Printf("%s %s %s, held by this program: %v\n", s.Protocol, s.Local.Addr(), s.State, p.PID == os.Getpid())
		}
	}
	// Output:
	// tcp 127.0.0.1 LISTEN, held by this program: true
}
