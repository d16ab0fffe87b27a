package expvarmetrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/expvarmetrics"
	"github.com/berth-go/berth/store"
)

// published is what a read of a published variable shows.
type published struct {
	Stats                      portalloc.Stats `json:"stats"`
	Ports, Reserved, Available int
	UsageError                 string `json:"usage_error"`
}

// TestPublish: the variable reads as the Allocator's Stats and Usage, on
// expvar.Handler and on the /debug/vars that importing this package
// registers; a name is published once.
func TestPublish(t *testing.T) {
	// A private store of the default range: nothing here allocates,
	// probes or binds a port.
	a, err := portalloc.New(context.Background(), portalloc.Config{Mode: portalloc.ModeStateStore, StateDir: t.TempDir(), IgnoreEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	name := fmt.Sprintf("berth_test_%d", time.Now().UnixNano()) // expvar names live as long as the process
	if err := expvarmetrics.Publish(a, name); err != nil {
		t.Fatalf("Publish(a, %q) = %v; want nil", name, err)
	}
	for _, tc := range []struct {
		what  string
		a     *portalloc.Allocator
		name  string
		field string
	}{
		{"the same name twice", a, name, "name"},
		{"an empty name", a, "", "name"},
		{"a nil Allocator", nil, name + "_nil", "a"},
	} {
		err := expvarmetrics.Publish(tc.a, tc.name)
		var fe *store.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || fe.Want == "" || !errors.Is(err, store.ErrInvalid) ||
			!strings.HasPrefix(err.Error(), "portalloc: publish: ") || strings.Count(err.Error(), "portalloc: ") != 1 {
			t.Errorf("Publish with %s = %v; want a *FieldError for %s, prefixed once", tc.what, err, tc.field)
		}
	}

	var m published
	if err := json.Unmarshal([]byte(expvar.Get(name).String()), &m); err != nil {
		t.Fatal(err)
	}
	ports, reserved, err := a.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m.Stats != a.Stats() || m.Ports != ports || m.Reserved != reserved || m.Available != ports-reserved || ports == 0 || m.UsageError != "" {
		t.Errorf("expvar %s = %+v; want Stats %+v and Usage %d, %d", name, m, a.Stats(), ports, reserved)
	}

	// Importing this package is what registers /debug/vars.
	rec := httptest.NewRecorder()
	http.DefaultServeMux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/vars", nil))
	var vars map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &vars); err != nil || vars[name] == nil {
		t.Errorf("GET /debug/vars = %d %.200s; want JSON with %q (%v)", rec.Code, rec.Body, name, err)
	}

	// After Close the variable still reads, and says why Usage is missing.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	m = published{}
	if err := json.Unmarshal([]byte(expvar.Get(name).String()), &m); err != nil || !strings.Contains(m.UsageError, "closed") {
		t.Errorf("expvar %s after Close = %+v, %v; want a UsageError saying the Allocator is closed", name, m, err)
	}
}
