package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// The scripts in testdata/script run berth as a real program: testscript
// installs this test binary as "berth" on PATH, so "exec berth" and a shell
// script calling berth both start a process of their own.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"berth": func() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("BERTH_STATE_DIR", env.WorkDir+"/state")
			env.Setenv("NO_COLOR", "1")
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"jsonrows": jsonRows,
		},
	})
}

// jsonrows FILE N [FIELD=VALUE...] parses FILE as a JSON array and checks
// that it has N elements, each with the given fields.
func jsonRows(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: jsonrows FILE N [FIELD=VALUE...]")
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &rows); err != nil {
		ts.Fatalf("%s is not a JSON array: %v", args[0], err)
	}
	n, _ := strconv.Atoi(args[1])
	if len(rows) != n {
		ts.Fatalf("%s has %d rows; want %d", args[0], len(rows), n)
	}
	for _, kv := range args[2:] {
		k, v, _ := cut(kv)
		for i, r := range rows {
			if got := fmt.Sprint(r[k]); got != v {
				ts.Fatalf("row %d: %s = %q; want %q", i, k, got, v)
			}
		}
	}
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
