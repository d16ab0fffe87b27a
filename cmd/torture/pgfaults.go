package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-go/berth/internal/pgserver"
)

// StoreAuto is the Store that has the run start a PostgreSQL server of
// its own; the server faults (PGRestartEvery, FailoverEvery) need one.
const StoreAuto = "auto"

// The kinds of failover (Config.FailoverKind).
const (
	FailoverKill      = "kill"
	FailoverLag       = "lag"
	FailoverCommitOff = "commit-off"
	FailoverAll       = "all"
)

var failoverKinds = []string{FailoverKill, FailoverLag, FailoverCommitOff, FailoverAll}

// lagFor and commitOffFor are how long before a failover of those kinds
// the standby stops receiving, or the primary commits without writing.
const (
	lagFor       = time.Second
	commitOffFor = 500 * time.Millisecond
)

// ownServer is the PostgreSQL server the run started: one cluster, or a
// primary with a standby (FailoverEvery).
type ownServer struct {
	c    *pgserver.Cluster
	one  *pgserver.Server // without a standby
	pair *pgserver.Pair   // with one
}

// startOwnServer starts a server of the run's own, or a primary and a
// streaming standby when pair is set (synchronous with sync), and returns
// it with the connection string that reaches the primary, whichever
// server that is. Its close stops and deletes it.
//
// It lives in the run's directory when a unix socket's path fits there,
// else in a temporary directory of its own. Its parent must let the
// servers' user through.
func startOwnServer(ctx context.Context, runDir string, pair, sync bool) (*ownServer, string, error) {
	dir := filepath.Join(runDir, "pg")
	var err error
	if len(dir) <= 60 {
		// The run's directory is its own: let the servers' user (postgres,
		// when this is root) pass through it, and nothing more.
		err = os.Chmod(runDir, 0o711)
	} else if dir, err = os.MkdirTemp("", "berth-torture-pg-"); err == nil {
		err = os.Remove(dir) // pgserver makes it, for the servers' user
	}
	if err != nil {
		return nil, "", fmt.Errorf("torture: the server's directory: %w", err)
	}
	c, err := pgserver.New(dir)
	if err != nil {
		return nil, "", fmt.Errorf("torture: start a PostgreSQL server of the run's own: %w", err)
	}
	c.Sync = sync
	o := &ownServer{c: c}
	if pair {
		o.pair, err = c.StartPair(ctx)
	} else {
		o.one, err = c.StartOne(ctx)
	}
	if err != nil {
		return nil, "", errors.Join(fmt.Errorf("torture: start a PostgreSQL server of the run's own: %w", err), c.Close(ctx))
	}
	if pair {
		return o, o.pair.DSN(), nil
	}
	return o, o.one.DSN(), nil
}

func (o *ownServer) primary() *pgserver.Server {
	if o.pair != nil {
		return o.pair.Primary
	}
	return o.one
}

// close stops and deletes the servers, keeping their logs in keep
// (the run's directory) as pg-NAME.log.
func (o *ownServer) close(ctx context.Context, keep string) error {
	err := o.c.Stop(ctx)
	logs, _ := filepath.Glob(filepath.Join(o.c.Root, "*.log"))
	for _, l := range logs {
		_ = os.Rename(l, filepath.Join(keep, "pg-"+filepath.Base(l)))
	}
	return errors.Join(err, o.c.Close(ctx))
}

// restartServer restarts the primary (pg_ctl restart -m fast: every
// session is ended, everything written is flushed, nothing is lost) and
// logs it once it takes connections again.
func (s *supervisor) restartServer(ctx context.Context) error {
	start := time.Now()
	if err := s.pg.primary().Restart(ctx, "fast"); err != nil {
		return fmt.Errorf("torture: restart the server: %w", err)
	}
	s.faults++
	s.log.add(Event{Kind: KindPGRestart, DurNS: int64(time.Since(start))})
	say(s.cfg.Progress, "restarted the PostgreSQL server in %v", time.Since(start).Round(time.Millisecond))
	return nil
}

// failover loses commits as Config.FailoverKind says (the workers going
// on meanwhile), SIGKILLs the primary and every process of it, promotes
// the standby, and makes a new standby of the new primary, logging each
// step: the checker places the commits a failover may have lost by them.
func (s *supervisor) failover(ctx context.Context) error {
	kind := s.cfg.FailoverKind
	if kind == FailoverAll {
		kinds := []string{FailoverKill, FailoverLag, FailoverCommitOff}
		kind = kinds[s.faults%len(kinds)]
	}
	switch kind {
	case FailoverLag:
		if err := s.pg.pair.HoldBack(ctx); err != nil {
			return fmt.Errorf("torture: hold the standby back: %w", err)
		}
		time.Sleep(lagFor)
	case FailoverCommitOff:
		if err := s.pg.pair.Primary.Exec(ctx, "ALTER SYSTEM SET synchronous_commit = off", "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("torture: set synchronous_commit off: %w", err)
		}
		time.Sleep(commitOffFor)
	}
	start := time.Now()
	sync := s.cfg.SyncStandby
	err := s.pg.pair.Failover(ctx, true,
		func() { s.log.add(Event{Kind: KindFailover, Sync: sync, Op: kind}) },
		func() { s.log.add(Event{Kind: KindPromoted, Sync: sync}) })
	if err != nil {
		return fmt.Errorf("torture: fail over: %w", err)
	}
	s.faults++
	s.log.add(Event{Kind: KindRebuilt, DurNS: int64(time.Since(start))})
	say(s.cfg.Progress, "failed over (%s) to %s (old primary SIGKILLed, new standby streaming) in %v",
		kind, s.pg.pair.Primary.Name, time.Since(start).Round(time.Millisecond))
	return nil
}

// repairSink turns the Allocator's log of its comparisons with the fleet's
// store into repair events, and passes its errors (a reservation that
// could not be put back names both processes) to standard error.
type repairSink struct {
	log  *eventLog
	errs logr.LogSink
	// probeKeys: log the keys of failed probes (KindProbeKey), which the
	// checker reads for the runs across hosts (and that fail over); a run
	// on this machine alone fails probes by the hundred thousand, and the
	// check would read the claims of each.
	probeKeys bool
}

func (s repairSink) Init(logr.RuntimeInfo)  {}
func (s repairSink) Enabled(level int) bool { return level <= 1 }

func (s repairSink) Info(level int, msg string, kv ...any) {
	switch {
	case strings.HasPrefix(msg, "the store lost this process's reservations"):
		s.log.add(Event{Kind: KindRepair, Restored: kvInt(kv, "restored"), NotRestored: kvInt(kv, "notRestored")})
	case strings.HasPrefix(msg, "released again a reservation of this process"):
		s.log.add(keyed(Event{Kind: KindRerelease, Err: msg}, kv, "reservation"))
	case msg == "port held outside this store" && s.probeKeys:
		// The store's word for a probe that failed, bound or locked.
		why, _ := kvValue(kv, "why").(string)
		s.log.add(keyed(Event{Kind: KindProbeKey, Err: why}, kv, "key"))
	case level == 0:
		s.log.add(Event{Kind: KindStoreLog, Err: msg, Restored: kvInt(kv, "restored"), NotRestored: kvInt(kv, "notRestored")})
	}
}

// keyed sets e's key from the value of name in a logr key-value list, a
// key as store.Key and store.Reservation print it: "tcp 127.0.0.1:80".
func keyed(e Event, kv []any, name string) Event {
	v, _ := kvValue(kv, name).(string)
	proto, ap, _ := strings.Cut(v, " ")
	if a, err := netip.ParseAddrPort(ap); err == nil {
		e.Proto, e.Addr, e.Port = proto, a.Addr().String(), a.Port()
	}
	return e
}

func (s repairSink) Error(err error, msg string, kv ...any) {
	s.errs.Error(err, s.log.proc+" ("+s.log.host+"): "+msg, kv...)
}
func (s repairSink) WithValues(...any) logr.LogSink { return s }
func (s repairSink) WithName(string) logr.LogSink   { return s }

func kvValue(kv []any, key string) any {
	for i := 0; i+1 < len(kv); i += 2 {
		if k, _ := kv[i].(string); k == key {
			return kv[i+1]
		}
	}
	return nil
}

func kvInt(kv []any, key string) int64 {
	switch v := kvValue(kv, key).(type) {
	case int:
		return int64(v)
	case int64:
		return v
	}
	return 0
}
