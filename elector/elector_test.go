package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func TestConfigValidation(t *testing.T) {
	ok := elector.Config{
		Connect:   elector.DSN("postgres://u@127.0.0.1:1/db"),
		Key:       leader.KeyFromName("x"),
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
	}
	tests := []struct {
		name  string
		edit  func(*elector.Config)
		field string
		rule  string
	}{
		{"no connect", func(c *elector.Config) { c.Connect = nil }, "Connect", "required"},
		{"bad dsn", func(c *elector.Config) { c.Connect = elector.DSN("postgres://u@h:notaport/db") }, "Connect", "invalid DSN"},
		{"zero key", func(c *elector.Config) { c.Key = leader.Key{} }, "Key", "valid key"},
		{"empty name", func(c *elector.Config) { c.Key = leader.KeyFromName("") }, "Key", "valid key"},
		{"no OnElected", func(c *elector.Config) { c.Callbacks.OnElected = nil }, "Callbacks.OnElected", "required"},
		{"negative interval", func(c *elector.Config) { c.RenewInterval = -time.Second }, "RenewInterval", "at least 1ms"},
		{"deadline <= interval", func(c *elector.Config) { c.RenewInterval, c.RenewDeadline = 2*time.Second, 2*time.Second }, "RenewDeadline", "greater than RenewInterval"},
		{"lease <= deadline", func(c *elector.Config) { c.LeaseDuration = 2 * time.Second }, "LeaseDuration", "greater than RenewDeadline"},
		{"negative release", func(c *elector.Config) { c.ReleaseTimeout = -1 }, "ReleaseTimeout", "negative"},
		{"long identity", func(c *elector.Config) { c.Identity = strings.Repeat("a", 64) }, "Identity", "at most 63"},
		{"non-ascii identity", func(c *elector.Config) { c.Identity = "führer" }, "Identity", "printable ASCII"},
		{"bad version", func(c *elector.Config) { c.Version = "1.2" }, "Version", "not a semantic version"},
		{"long version", func(c *elector.Config) { c.Version = "1.0.0-" + strings.Repeat("a", 60) }, "Version", "at most 64"},
		{"version strategy without version", func(c *elector.Config) { c.Strategy = leader.OldestVersion }, "Version", "required with Strategy OldestVersion"},
		{"unknown strategy", func(c *elector.Config) { c.Strategy = 7 }, "Strategy", "got 7"},
		{"negative preferred delay", func(c *elector.Config) { c.PreferredDelay = -time.Second }, "PreferredDelay", "negative"},
		{"identity like a rank", func(c *elector.Config) { c.Identity = "w [P1]" }, "Identity", "must not end like a candidate's rank"},
		{"identity too long with its rank", func(c *elector.Config) { c.Identity, c.Version = strings.Repeat("a", 55), "1.0.0" }, "Identity", "with the candidate's rank"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			_, err := elector.New(c)
			var ce *elector.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, elector.ErrInvalidConfig) {
				t.Fatalf("want a ConfigError, got %v", err)
			}
			if ce.Field != tt.field || !strings.Contains(ce.Rule, tt.rule) {
				t.Fatalf("want field %q and rule containing %q, got %q: %q", tt.field, tt.rule, ce.Field, ce.Rule)
			}
		})
	}
	if _, err := elector.New(ok); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
}

func TestDefaultIdentity(t *testing.T) {
	e, err := elector.New(elector.Config{
		Connect:   elector.DSN("postgres://u@127.0.0.1:1/db"),
		Key:       leader.Int64Key(1),
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if id := e.Identity(); id == "" || !strings.Contains(id, "-") {
		t.Fatalf("default identity %q, want hostname-pid", id)
	}
}

// A password never shows in New's error, nor in the logs of a Run that
// cannot reach its server.
func TestPasswordsStayHidden(t *testing.T) {
	const secret = "s3cr3t-Pa55"
	for _, dsn := range []string{
		"postgres://alice:" + secret + "@127.0.0.1:notaport/db",
		"host=127.0.0.1 port=bogus user=alice password=" + secret,
		"host=127.0.0.1 port=bogus user=alice password='" + secret + "'",
	} {
		_, err := elector.New(elector.Config{
			Connect: elector.DSN(dsn), Key: leader.Int64Key(1),
			Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
		})
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Fatalf("New(%q): want an error without the password, got %v", "<dsn>", err)
		}
	}

	core, logs := observer.New(zap.DebugLevel)
	attempts := &attemptCounter{}
	e, err := elector.New(elector.Config{
		Connect: elector.DSN("postgres://alice:" + secret + "@127.0.0.1:1/db?connect_timeout=1"),
		Key:     leader.Int64Key(1), Logger: zap.New(core), Observer: attempts,
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	// An outage logs its first attempt, then one line a minute: three
	// attempts, and the one line, are what there is to check.
	eventually(t, "3 reconnect attempts and a log line for an unreachable server", func() (bool, string) {
		n := logs.FilterMessage("reconnecting").Len()
		return n >= 1 && attempts.n.Load() >= 3, fmt.Sprint(n, " lines, ", attempts.n.Load(), " attempts so far")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, entry := range logs.All() {
		line := entry.Message
		for k, v := range entry.ContextMap() {
			line += " " + k + "=" + strings.TrimSpace(strings.ReplaceAll(toString(v), "\n", " "))
		}
		if strings.Contains(line, secret) {
			t.Fatalf("password in log line: %s", line)
		}
		if entry.Message == "reconnecting" && !strings.Contains(line, "connect") {
			t.Fatalf("reconnect log without the cause: %s", line)
		}
	}
}

func toString(v any) string {
	if err, ok := v.(error); ok {
		return err.Error()
	}
	return fmt.Sprint(v)
}

func TestRunTwice(t *testing.T) {
	obs := newErrObserver()
	e, err := elector.New(elector.Config{
		Connect: elector.DSN("postgres://u@127.0.0.1:1/db?connect_timeout=1"), Key: leader.Int64Key(1), Observer: obs,
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	obs.waitFor(t, nil, 1) // the first Run is running: it tried to connect
	second, cancel2 := context.WithTimeout(context.Background(), waitLong)
	defer cancel2()
	if err := e.Run(second); !errors.Is(err, elector.ErrAlreadyRunning) {
		t.Fatalf("second Run: want ErrAlreadyRunning, got %v", err)
	}
	cancel()
	<-done
	if err := e.Run(context.Background()); !errors.Is(err, elector.ErrAlreadyRunning) {
		t.Fatalf("Run after Run returned: want ErrAlreadyRunning, got %v", err)
	}
}

// Three electors give exactly one leader, visible by its application_name in
// pg_locks; after Resign another one leads, and Leader() tracks it.
func TestOneLeaderThenResign(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	els := map[string]*running{}
	for _, id := range []string{"e1", "e2", "e3"} {
		els[id] = start(t, r, opts{dsn: srv.DSN(), key: key, id: id})
	}
	first := r.next("elected", "")
	if !els[first.id].e.IsLeader() {
		t.Fatalf("%s: OnElected ran but IsLeader is false", first.id)
	}
	ctx := context.Background()
	admin := mustConn(t, srv)
	deadline := time.Now().Add(waitLong)
	for {
		// Followers queue on the lock between their campaign rounds.
		holder, err := leader.Holder(ctx, admin, key)
		if err != nil {
			t.Fatal(err)
		}
		if holder.Identity() != first.id {
			t.Fatalf("pg_locks: holder %q, want %q", holder.Identity(), first.id)
		}
		if len(holder.Waiters) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_locks: %d waiters, want 2", len(holder.Waiters))
		}
		time.Sleep(5 * time.Millisecond)
	}
	for id, rn := range els {
		if id != first.id && rn.e.IsLeader() {
			t.Fatalf("%s also believes it leads", id)
		}
	}
	// Followers learn the leader during their campaign rounds.
	for _, id := range []string{"e1", "e2", "e3"} {
		for els[id].e.Leader() != first.id {
			if time.Now().After(deadline) {
				t.Fatalf("%s: Leader() = %q, want %q", id, els[id].e.Leader(), first.id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if err := els[first.id].e.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	d := r.next("demoted", first.id)
	if !errors.Is(d.reason, leader.ErrResigned) {
		t.Fatalf("demotion reason %v, want ErrResigned", d.reason)
	}
	second := r.next("elected", "")
	if second.id == first.id {
		t.Fatalf("the resigned leader was elected again while others waited")
	}
	if err := els[first.id].e.Resign(ctx); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("Resign by a follower: want ErrNotLeader, got %v", err)
	}
}

// Terminating the leader's backend demotes it with ErrConnectionLost, and
// another elector leads.
func TestBackendTerminated(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "bt1"})
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "bt2"})
	first := r.next("elected", "")
	if n, err := srv.TerminateBackend(context.Background(), first.id); err != nil || n != 1 {
		t.Fatalf("terminate: n=%d err=%v", n, err)
	}
	d := r.next("demoted", first.id)
	if !errors.Is(d.reason, leader.ErrConnectionLost) {
		t.Fatalf("reason %v, want ErrConnectionLost", d.reason)
	}
	// The server's FATAL stays in the chain beside the sentinel.
	var pgErr *pgconn.PgError
	if !errors.As(d.reason, &pgErr) || pgErr.Code != "57P01" {
		t.Fatalf("reason %v: want the server's 57P01 admin_shutdown in the chain", d.reason)
	}
	next := r.next("elected", "")
	t.Logf("%s elected %s after %s's backend was terminated", next.id, next.at.Sub(d.at), first.id)
}

// After a fast or an immediate restart there is a leader again, with no help.
func TestServerRestart(t *testing.T) {
	for _, mode := range []string{testpg.Fast, testpg.Immediate} {
		t.Run(mode, func(t *testing.T) {
			srv := testpg.Start(t)
			r := newRecorder(t)
			key := testKey(t)
			start(t, r, opts{dsn: srv.DSN(), key: key, id: "r1"})
			start(t, r, opts{dsn: srv.DSN(), key: key, id: "r2"})
			first := r.next("elected", "")
			if err := srv.Restart(mode); err != nil {
				t.Fatal(err)
			}
			up := time.Now()
			d := r.next("demoted", first.id)
			if !errors.Is(d.reason, leader.ErrConnectionLost) {
				t.Fatalf("reason %v, want ErrConnectionLost", d.reason)
			}
			again := r.next("elected", "")
			t.Logf("%s restart: %s leads again %s after the server accepted connections", mode, again.id, again.at.Sub(up))
		})
	}
}

// Black-holing the leader's connection demotes it within RenewDeadline, and
// no other elector is elected before it has demoted: the server-side lease
// (LeaseDuration > RenewDeadline) frees the lock only afterwards.
func TestBlackholeDemotesBeforeTakeover(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	proxy := newProxy(t, srv)
	stepDown := make(chan time.Time, 1)
	a := start(t, r, opts{dsn: proxy.DSN(), key: key, id: "bh-leader", onLead: func(ctx context.Context, l leader.Leadership) {
		<-ctx.Done()
		stepDown <- time.Now()
	}})
	r.next("elected", "bh-leader")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "bh-follower"})
	proxy.Blackhole()
	cut := time.Now()
	stepped := recv(t, stepDown, "the step-down")
	if a.e.IsLeader() {
		t.Fatal("IsLeader still true after the OnElected context was cancelled")
	}
	d := r.next("demoted", "bh-leader")
	if !errors.Is(d.reason, leader.ErrRenewDeadline) && !errors.Is(d.reason, leader.ErrConnectionLost) {
		t.Fatalf("reason %v, want ErrRenewDeadline", d.reason)
	}
	if s := stepped.Sub(cut); s > tDeadline+time.Second {
		t.Errorf("stepped down %s after the partition, want within RenewDeadline (%s) plus slack", s, tDeadline)
	}
	next := r.next("elected", "bh-follower")
	if !next.at.After(stepped) {
		t.Fatalf("new leader elected at %s, before the old one stepped down at %s", next.at, stepped)
	}
	t.Logf("old leader stepped down %s after the partition; new leader %s later (margin)", stepped.Sub(cut), next.at.Sub(stepped))
	proxy.Heal()
}

// The server-side lease: a leader that is stopped (SIGSTOP) cannot step
// down or renew, and the server frees its lock after LeaseDuration. On
// SIGCONT it notices and reports the demotion.
func TestServerSideLeaseFreesLock(t *testing.T) {
	srv := sharedServer(t)
	if srv.VersionNum() < 140000 {
		t.Skip("idle_session_timeout needs PostgreSQL 14")
	}
	r := newRecorder(t)
	key := testKey(t)
	child := startChild(t, srv.DSN(), key.Name(), "paused")
	if _, err := child.WaitTimeout("elected", waitLong); err != nil {
		t.Fatal(err)
	}
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "lease-follower"})
	child.Pause()
	stopped := time.Now()
	e := r.next("elected", "lease-follower")
	if took := e.at.Sub(stopped); took < tLease-tInterval-tDeadline {
		t.Fatalf("lock freed %s after SIGSTOP, sooner than the lease allows", took)
	} else {
		t.Logf("lock freed and taken %s after SIGSTOP (lease %s)", took, tLease)
	}
	child.Resume()
	d, err := child.WaitTimeout("demoted", waitLong)
	if err != nil {
		t.Fatal(err)
	}
	if d.Err != "connection_lost" && d.Err != "renew_deadline" {
		t.Fatalf("resumed leader demoted with %q", d.Err)
	}
}

// A killed leader process (SIGKILL) is replaced quickly: the kernel closes
// its socket and the server frees the lock.
func TestKilledLeaderProcess(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	child := startChild(t, srv.DSN(), key.Name(), "killed")
	if _, err := child.WaitTimeout("elected", waitLong); err != nil {
		t.Fatal(err)
	}
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "kill-follower"})
	waitWaiter(t, srv, key, "kill-follower") // measure the lock manager's handover, not a campaign round
	child.Signal(syscall.SIGKILL)
	killed := time.Now()
	e := r.next("elected", "kill-follower")
	t.Logf("follower elected %s after SIGKILL of the leader", e.at.Sub(killed))
}

// An OnElected that ignores its context delays the unlock on Resign until
// ReleaseTimeout; the lock is then released and another elector leads.
func TestReleaseTimeoutBoundsResign(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	const release = 700 * time.Millisecond
	unblock := make(chan struct{})
	r.stubborn["stubborn"] = true
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "stubborn", release: release,
		onLead: func(ctx context.Context, l leader.Leadership) { <-unblock }})
	r.next("elected", "stubborn")
	b := start(t, r, opts{dsn: srv.DSN(), key: key, id: "patient"})
	began := time.Now()
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := r.next("elected", "patient")
	if took := e.at.Sub(began); took < release {
		t.Fatalf("new leader %s after Resign, before ReleaseTimeout %s", took, release)
	}
	// The lock is free again, but the stubborn elector's old OnElected still
	// runs: it must not campaign, let alone lead, until that returns. Give a
	// bug ten renew intervals to show.
	before := r.count("elected", "stubborn")
	b.stop()
	time.Sleep(10 * tInterval) // a window for the bug, not a synchronisation
	if r.count("elected", "stubborn") > before {
		t.Fatal("elected again while its previous OnElected still ran")
	}
	released := time.Now()
	close(unblock)
	if again := r.next("elected", "stubborn"); again.at.Before(released) {
		t.Fatal("elected again before its previous OnElected returned")
	}
}

// A callback that honours its context holds the lock until it returns.
func TestResignWaitsForCallback(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	returned := make(chan time.Time, 1)
	// Only the first tenure resigns: the test's cleanup stops "next" first,
	// and "careful" may then lead again until it is stopped itself.
	var tenures atomic.Int32
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "careful", onLead: func(ctx context.Context, l leader.Leadership) {
		<-ctx.Done()
		if tenures.Add(1) > 1 {
			return
		}
		if !errors.Is(context.Cause(ctx), leader.ErrResigned) {
			t.Errorf("cause %v, want ErrResigned", context.Cause(ctx))
		}
		time.Sleep(200 * time.Millisecond) // flushing work
		returned <- time.Now()
	}})
	r.next("elected", "careful")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "next"})
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := r.next("elected", "next")
	if ret := recv(t, returned, "the callback's return"); !e.at.After(ret) {
		t.Fatalf("new leader at %s before the old callback returned at %s", e.at, ret)
	}
}

// A step-down logs that it waits for OnElected, with its reason, while
// OnElected still runs; no heir leads meanwhile. (A callback that returns
// at once is not waited for, and that line is left out.)
func TestSlowDrainIsLogged(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	core, logs := observer.New(zap.InfoLevel)
	unblock := make(chan struct{})
	var tenures atomic.Int32
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "slow", logger: zap.New(core), onLead: func(ctx context.Context, l leader.Leadership) {
		<-ctx.Done()
		if tenures.Add(1) == 1 {
			<-unblock // the first tenure's flush, until the log line was seen
		}
	}})
	r.next("elected", "slow")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "next"})
	resigned := make(chan error, 1)
	go func() { resigned <- a.e.Resign(context.Background()) }()
	const line = "stepping down: waiting for OnElected to return, renewing meanwhile"
	eventually(t, "the drain's log line", func() (bool, string) {
		n := logs.FilterMessage(line).Len()
		return n > 0, fmt.Sprint(n, " lines")
	})
	entry := logs.FilterMessage(line).All()[0]
	if got := toString(entry.ContextMap()["reason"]); !strings.Contains(got, leader.ErrResigned.Error()) {
		t.Errorf("reason %q, want %q", got, leader.ErrResigned)
	}
	if n := r.count("elected", "next"); n != 0 {
		t.Fatalf("the heir led %d times while OnElected ran", n)
	}
	close(unblock)
	if err := recv(t, resigned, "Resign's return"); err != nil {
		t.Fatal(err)
	}
	r.next("elected", "next")
}

// From OnElected's first line, the elector describes the new tenure:
// IsLeader, Leader() naming itself, and Status() with the tenure's start.
// They are set before OnElected starts; the log line and OnNewLeader's
// dispatch come after it.
func TestElectorDescribesItselfInsideOnElected(t *testing.T) {
	srv := sharedServer(t)
	seen := make(chan string, 1)
	var e *elector.Elector
	e, err := elector.New(elector.Config{
		Connect: elector.DSN(srv.DSN()), Key: testKey(t), Identity: "self",
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			select {
			case seen <- fmt.Sprintf("IsLeader %v, Leader %q, Status().Since is ElectedAt: %v",
				e.IsLeader(), e.Leader(), e.Status().Since.Equal(l.ElectedAt)):
			default:
			}
			<-ctx.Done()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := recv(t, done, "Run's return"); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	const want = `IsLeader true, Leader "self", Status().Since is ElectedAt: true`
	if got := recv(t, seen, "OnElected"); got != want {
		t.Fatalf("inside OnElected: %s; want %s", got, want)
	}
}

// When OnElected returns on its own, the elector resigns and a waiting
// candidate takes over.
func TestCallbackReturnResigns(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "quitter", onLead: func(ctx context.Context, l leader.Leadership) {}})
	r.next("elected", "quitter")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "stayer"})
	d := r.next("demoted", "quitter")
	if !errors.Is(d.reason, leader.ErrCallbackReturned) {
		t.Fatalf("reason %v, want ErrCallbackReturned", d.reason)
	}
	r.next("elected", "")
}

// Stopping Run while leading releases the lock at once, closes the
// connection and reports the context error.
func TestStopReleasesAndCloses(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "stopper"})
	r.next("elected", "stopper")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "heir"})
	a.stop()
	d := r.next("demoted", "stopper")
	if !errors.Is(d.reason, context.Canceled) {
		t.Fatalf("reason %v, want context.Canceled", d.reason)
	}
	r.next("elected", "heir")
	// The server forgets a closed session a moment after the client closed
	// it: wait for it to go.
	eventually(t, "the stopped elector's session is gone", func() (bool, string) {
		n := sessions(t, srv, "stopper")
		return n == 0, fmt.Sprint(n, " left")
	})
}

// Each elector owns one dedicated session, named by its identity.
func TestDedicatedSessionPerElector(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	for _, id := range []string{"ded1", "ded2"} {
		start(t, r, opts{dsn: srv.DSN(), key: key, id: id})
	}
	r.next("elected", "")
	eventually(t, "one session per elector", func() (bool, string) {
		n := sessions(t, srv, "ded_")
		return n == 2, fmt.Sprint(n, " sessions for 2 electors")
	})
}

// A primary switch behind a multi-host DSN with
// target_session_attrs=read-write ends with a leader again, on the promoted
// standby.
func TestPrimarySwitch(t *testing.T) {
	primary, standby := testpg.StartWithStandby(t)
	dsn := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable connect_timeout=5 target_session_attrs=read-write",
		primary.Port(), standby.Port())
	r := newRecorder(t)
	key := testKey(t)
	start(t, r, opts{dsn: dsn, key: key, id: "sw1"})
	start(t, r, opts{dsn: dsn, key: key, id: "sw2"})
	first := r.next("elected", "")
	if err := primary.Stop(testpg.Immediate); err != nil {
		t.Fatal(err)
	}
	r.next("demoted", first.id)
	promoted := time.Now()
	if err := standby.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := r.next("elected", "")
	var inRecovery bool
	if err := mustConn(t, standby).QueryRow(context.Background(), "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("standby still in recovery: %v %v", inRecovery, err)
	}
	h, err := leader.Holder(context.Background(), mustConn(t, standby), key)
	if err != nil || h.Identity() != again.id {
		t.Fatalf("holder on the new primary: %+v, %v", h, err)
	}
	t.Logf("%s leads on the promoted standby %s after pg_promote was called", again.id, again.at.Sub(promoted))
}

type countingObserver struct {
	leader.NopObserver
	reconnects atomic.Int64
}

func (o *countingObserver) Reconnecting(leader.Key, string, int, time.Duration, error) {
	o.reconnects.Add(1)
}

// A follower keeps its one session across campaign rounds: a lock wait that
// times out is a normal round, not a connection problem. The leader trusts
// for longer than the test's default (a loaded machine that stalls it past
// a 500 ms RenewDeadline would demote it, and the follower, its only heir,
// would lead): the follower's own timings are the defaults.
func TestFollowerKeepsItsSession(t *testing.T) {
	waitsForRounds(t)
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "keeper-leader", deadline: 3 * time.Second, lease: 10 * time.Second})
	r.next("elected", "keeper-leader")
	obs := &countingObserver{}
	e, err := elector.New(elector.Config{
		Connect: elector.DSN(srv.DSN()), Key: key, Identity: "keeper-follower", Observer: obs,
		RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	pid := func() int64 {
		n, _ := srv.QueryInt(context.Background(), "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = 'keeper-follower'")
		return n
	}
	deadline := time.Now().Add(waitLong)
	for e.Leader() != "keeper-leader" || pid() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("follower never saw the leader (it sees %q; its session's pid %d; %+v)", e.Leader(), pid(), e.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	first := pid()
	// Five rounds: an heir's each lasts its lock wait.
	deadline = time.Now().Add(waitLong + 5*elector.HeirWait(e))
	rounds, last := 0, e.Status().LastRound
	for rounds < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d campaign rounds", rounds)
		}
		if lr := e.Status().LastRound; lr.After(last) {
			rounds, last = rounds+1, lr
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := obs.reconnects.Load(); n != 0 {
		t.Fatalf("%d reconnects over %d campaign rounds", n, rounds)
	}
	if p := pid(); p != first {
		t.Fatalf("follower session changed from pid %d to %d", first, p)
	}
}
