package greeter_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-go/berth/examples/gotest"
	"github.com/berth-go/berth/portlock/porttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A server that binds an address itself gets a port from porttest: no other
// test binary of go test ./... is handed the same one meanwhile.
func TestStart(t *testing.T) {
	t.Parallel()
	addr := porttest.Addr(t)
	s, err := greeter.Start(addr, "addr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() }) // runs before porttest releases the port
	get(t, "http://"+addr+"/", "hello from addr\n")
}

// Where the code takes a listener, porttest.Listener gives one that was
// bound in the same step that reserved it.
func TestServe(t *testing.T) {
	t.Parallel()
	l := porttest.Listener(t)
	s := greeter.Serve(l, "listener")
	t.Cleanup(func() { _ = s.Close() })
	get(t, "http://"+l.Addr().String()+"/", "hello from listener\n")
}

func get(tb testing.TB, url, want string) {
	tb.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	client.CloseIdleConnections()
	if string(b) != want {
		tb.Fatalf("GET %s = %q; want %q", url, b, want)
	}
}
