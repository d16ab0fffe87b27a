package porttest_test

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoDebugVars: this test binary imports portalloc and porttest (and no
// package of its own that imports expvar), so http.DefaultServeMux must
// have no /debug/vars: a program that imports berth and serves the default
// mux must not expose its command line and memory statistics. expvar's init
// registers the handler, so the test fails as soon as anything portalloc or
// porttest imports pulls expvar in again.
func TestNoDebugVars(t *testing.T) {
	for _, path := range []string{"/debug/vars", "/debug/pprof/"} {
		rec := httptest.NewRecorder()
		http.DefaultServeMux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET %s on http.DefaultServeMux = %d; want 404 (importing portalloc or porttest registered a handler)", path, rec.Code)
		}
	}
}

// TestNoSideEffectImports: go list -deps of portalloc and porttest has
// neither expvar nor net/http/pprof, whose inits register handlers on
// http.DefaultServeMux. Publishing through expvar lives in the opt-in
// package portalloc/expvarmetrics.
func TestNoSideEffectImports(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies with")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/berth-go/berth/portalloc", "github.com/berth-go/berth/portalloc/porttest").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/berth-go/berth/portalloc") {
		t.Fatalf("go list -deps lists no portalloc; it said:\n%s", out)
	}
	for _, banned := range []string{"expvar", "net/http/pprof"} {
		if slices.Contains(deps, banned) {
			t.Errorf("portalloc or porttest depends on %s, whose init registers a handler on http.DefaultServeMux; keep it in an opt-in package such as portalloc/expvarmetrics", banned)
		}
	}
}
