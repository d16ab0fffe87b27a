package statestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/shirou/gopsutil/v4/process"

	"github.com/berth-go/berth/statestore"
	"github.com/berth-go/berth/store"
)

func init() {
	// "idle" only waits: a live process whose identity tests can record.
	extraWorkers["idle"] = func(_ context.Context, _ string, out *json.Encoder, wait func()) error {
		_ = out.Encode(event{Event: "ready"})
		wait()
		return nil
	}
}

// legacyOwner returns pid's identity as berth recorded it before schema
// version 3: gopsutil's wall-clock start in unix milliseconds, and on Linux
// the scope "<boot id>/<pid namespace>" (bootID replaces the boot id when
// not empty).
func legacyOwner(tb testing.TB, pid int, bootID string) store.Owner {
	tb.Helper()
	p, err := process.NewProcess(int32(pid))
	if err != nil {
		tb.Fatal(err)
	}
	ms, err := p.CreateTime()
	if err != nil {
		tb.Fatal(err)
	}
	o := store.Owner{PID: pid, Start: ms, Name: "legacy"}
	if runtime.GOOS == "linux" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			tb.Fatal(err)
		}
		ns, err := os.Readlink("/proc/self/ns/pid")
		if err != nil {
			tb.Fatal(err)
		}
		if bootID == "" {
			bootID = strings.TrimSpace(string(b))
		}
		o.Namespace = bootID + "/" + strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	}
	return o
}

// insertRows writes rows on tcp 127.0.0.1 straight into the table, as an
// earlier berth would have.
func insertRows(tb testing.TB, path string, rows map[uint16]store.Owner) {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	for port, o := range rows {
		if _, err := db.Exec(`INSERT INTO port_allocations (protocol, port, address, owner_pid, owner_start, owner_scope, owner_name, label, kind, created_at)
			VALUES ('tcp', ?, X'7f000001', ?, ?, ?, ?, 'legacy', 'dynamic', 0)`, int(port), o.PID, o.Start, o.Namespace, o.Name); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestConvertLegacyOwners(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	mine, err := s.Reserve(ctx, store.Request{Key: tcp(lo4, 28000), Label: "current"})
	if err != nil {
		t.Fatal(err)
	}

	live := startWorker(t, "idle", path)
	live.until(t, "ready")
	livePID := live.cmd.Process.Pid
	gone := startWorker(t, "idle", path)
	gone.until(t, "ready")
	goneOwner := legacyOwner(t, gone.cmd.Process.Pid, "")
	gone.kill(t)

	liveOwner := legacyOwner(t, livePID, "")
	rows := map[uint16]store.Owner{
		28001: liveOwner,
		28002: liveOwner, // two rows of one owner: both converted
		28003: goneOwner,
	}
	wantConverted, wantDeleted := 2, 1
	var otherNS store.Owner
	if runtime.GOOS == "linux" {
		rows[28004] = legacyOwner(t, livePID, "00000000-0000-0000-0000-000000000000") // another boot
		wantDeleted++
		// Another pid namespace: cannot be checked, so it stays as it is.
		otherNS = liveOwner
		otherNS.Namespace = otherNS.Namespace[:strings.Index(otherNS.Namespace, "/")] + "/" + livePidNS(t)
		rows[28005] = otherNS
	}
	insertRows(t, path, rows)

	converted, deleted, err := statestore.ConvertLegacyOwners(ctx, s)
	if err != nil || converted != wantConverted || deleted != wantDeleted {
		t.Fatalf("ConvertLegacyOwners = %d, %d, %v; want %d, %d, nil", converted, deleted, err, wantConverted, wantDeleted)
	}

	want, err := store.LookupOwner(ctx, livePID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint16]store.Owner{}
	for _, r := range list(t, s) {
		got[r.Port] = r.Owner
	}
	if o, ok := got[28000]; !ok || !o.Same(mine.Owner) {
		t.Errorf("row of a current owner = %+v, %v; want %+v untouched", o, ok, mine.Owner)
	}
	for _, port := range []uint16{28001, 28002} {
		if o, ok := got[port]; !ok || !o.Same(want) || o.Name != "legacy" {
			t.Errorf("row %d of a live legacy owner = %+v, %v; want %+v, its name kept", port, o, ok, want)
		}
	}
	for _, port := range []uint16{28003, 28004} {
		if o, ok := got[port]; ok {
			t.Errorf("row %d of a dead legacy owner = %+v; want it deleted", port, o)
		}
	}
	if runtime.GOOS == "linux" {
		if o, ok := got[28005]; !ok || !o.Same(otherNS) || !o.Alive(ctx) {
			t.Errorf("row of a legacy owner of another pid namespace = %+v, %v; want it kept, and alive", o, ok)
		}
	}

	// Nothing is left to convert, and the converted rows go when their
	// owner does.
	if c, d, err := statestore.ConvertLegacyOwners(ctx, s); err != nil || c != 0 || d != 0 {
		t.Errorf("ConvertLegacyOwners again = %d, %d, %v; want 0, 0, nil", c, d, err)
	}
	live.kill(t)
	if n, err := s.Reap(ctx); err != nil || n != 2 {
		t.Errorf("Reap after the converted owner exited = %d, %v; want 2", n, err)
	}
}

// TestOpenConvertsLegacyOwners: a store of schema version 2 with rows of an
// earlier berth has them converted when a current berth opens it.
func TestOpenConvertsLegacyOwners(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, "idle", path)
	w.until(t, "ready")
	liveOwner := legacyOwner(t, w.cmd.Process.Pid, "")
	gone := startWorker(t, "idle", path)
	gone.until(t, "ready")
	goneOwner := legacyOwner(t, gone.cmd.Process.Pid, "")
	gone.kill(t)
	insertRows(t, path, map[uint16]store.Owner{28101: liveOwner, 28102: goneOwner})

	// Make the file what berth left at schema version 2.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	// Undo every migration after 2 with its down file, newest first.
	downs, _ := filepath.Glob("migrations/*.down.sql")
	sort.Slice(downs, func(i, j int) bool { return atoi(filepath.Base(downs[i])) > atoi(filepath.Base(downs[j])) })
	var qs []string
	for _, f := range downs {
		if v, _, _ := strings.Cut(filepath.Base(f), "_"); atoi(v) > 2 {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, string(b))
		}
	}
	for _, q := range append(qs, "UPDATE schema_migrations SET version = 2, dirty = 0") {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	_ = db.Close()

	s = openAt(t, path)
	rs := list(t, s)
	want, err := store.LookupOwner(ctx, w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Port != 28101 || !rs[0].Owner.Same(want) {
		t.Errorf("rows after Open = %+v; want only 28101, owned by %+v", rs, want)
	}
}

// atoi reads the number a migration file's name starts with.
func atoi(name string) int {
	v, _, _ := strings.Cut(name, "_")
	n, _ := strconv.Atoi(v)
	return n
}
