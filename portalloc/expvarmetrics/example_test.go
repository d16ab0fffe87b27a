package expvarmetrics_test

import (
	"context"
	"encoding/json"
	"expvar"
	"fmt"
	"os"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/store"
)

// Publish once per Allocator, at start-up; /debug/vars on
// http.DefaultServeMux then serves the metrics with the rest of expvar's.
// Here the variable is read directly.
func ExamplePublish() {
	dir, _ := os.MkdirTemp("", "berth-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	// A state directory of its own, so the example reads nobody's store;
	// it allocates no port.
	a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Mode: portalloc.ModeStateStore, Range: store.Range{First: 20000, Last: 20099}, IgnoreEnv: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()

	// A program publishes one name, such as "berth", once; an example may
	// run more than once in a process (go test -count), and expvar names
	// live as long as it.
	name := fmt.Sprintf("berth_example_%d", time.Now().UnixNano())
	if err := expvarmetrics.Publish(a, name); err != nil {
		fmt.Println(err)
		return
	}
	var m struct {
		Stats           portalloc.Stats `json:"stats"`
		Ports, Reserved int
		Available       int
	}
	if err := json.Unmarshal([]byte(expvar.Get(name).String()), &m); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("held: %d, fallback: %q\n", m.Stats.Held, m.Stats.Fallback)
	fmt.Println("ports:", m.Ports, "reserved:", m.Reserved, "available:", m.Available)
	// Output:
	// held: 0, fallback: ""
	// ports: 100 reserved: 0 available: 100
}
