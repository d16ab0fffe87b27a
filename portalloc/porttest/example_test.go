package porttest_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berth-go/berth/portalloc/portset"
	"github.com/berth-go/berth/portalloc/porttest"
)

// The helpers take the test's *testing.T (or *testing.B), so these examples
// show test functions; TestHTTPTestServer runs the httptest one.

// A port for a server the test starts itself, on 127.0.0.1.
func ExamplePort() {
	testServer := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		port := porttest.Port(t) // an int, like freeport.GetN's
		_ = fmt.Sprintf("--port=%d", port)
	}
	_ = testServer // a test function: run it with go test
}

// Several ports at once, for a cluster of servers started by the test.
func ExamplePorts() {
	testCluster := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		for i, port := range porttest.Ports(t, 3) {
			_ = fmt.Sprintf("node%d=127.0.0.1:%d", i, port)
		}
	}
	_ = testCluster // a test function: run it with go test
}

// An httptest server on a port that no other test binary of the user is
// given while the test runs.
func ExampleListener() {
	testHTTP := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "hello")
		}))
		srv.Listener.Close()
		srv.Listener = porttest.Listener(t)
		srv.Start()
		defer srv.Close()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
	}
	_ = testHTTP // a test function: run it with go test
}

// A UDP socket already bound, for a DNS or StatsD test server.
func ExamplePacketConn() {
	testUDP := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		pc := porttest.PacketConn(t)
		_, _ = pc.WriteTo([]byte("ping"), pc.LocalAddr())
	}
	_ = testUDP // a test function: run it with go test
}

// A server a container must reach listens on the wildcard address.
func ExampleOn() {
	testContainer := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		ln := porttest.Listener(t, porttest.On("0.0.0.0"))
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		_ = "http://host.docker.internal:" + port
	}
	_ = testContainer // a test function: run it with go test
}

// TestHTTPTestServer runs ExampleListener's pattern.
func TestHTTPTestServer(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	srv.Listener.Close()
	srv.Listener = porttest.Listener(t)
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "hello" {
		t.Errorf("body %q; want hello", body)
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	if _, err := net.Listen("tcp", "127.0.0.1:"+port); err == nil {
		t.Errorf("the server's port %s could be bound again", port)
	}
}

// A UDP port, for a DNS or metrics server under test.
func ExampleUDPPort() {
	testDNS := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		port := porttest.UDPPort(t)
		_ = fmt.Sprintf("--dns-port=%d", port)
	}
	_ = testDNS // a test function: run it with go test
}

// A "HOST:PORT" to hand to a server's listen flag.
func ExampleAddr() {
	testServer := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		addr := porttest.Addr(t)
		_ = fmt.Sprintf("--listen=%s", addr)
	}
	_ = testServer // a test function: run it with go test
}

// The ports of a whole set of servers that must find each other, each
// member's variables ready for its exec.Cmd.
func ExampleSet() {
	testStack := func(t *testing.T) { //nolint:thelper // a test function, not a helper
		set := porttest.Set(t, portset.SetSpec{Name: "stack", Groups: []portset.GroupSpec{
			{Name: "api", Ports: []portset.PortSpec{{Name: "http"}}},
			{Name: "db", Ports: []portset.PortSpec{{Name: "sql"}}},
		}})
		for _, m := range set.Members() {
			_ = m.Env() // API_HTTP_PORT=..., DB_SQL_PORT=...
		}
	}
	_ = testStack // a test function: run it with go test
}
