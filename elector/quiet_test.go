package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// serverLog returns the throwaway server's log lines so far.
func serverLog(srv *testpg.Server) []string {
	s := strings.TrimSpace(srv.LogTail(1 << 20))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// waitRounds waits until each elector has finished n more campaign rounds
// (or renews).
func waitRounds(t *testing.T, els []*running, n int) {
	t.Helper()
	for _, rn := range els {
		// An heir's round is a lock wait of three LeaseDurations: n of
		// them may take longer than waitLong.
		count, last := 0, rn.e.Status().LastRound
		eventuallyWithin(t, rn.e.Identity()+" runs its rounds", waitLong+time.Duration(n)*elector.HeirWait(rn.e), func() bool {
			if lr := rn.e.Status().LastRound; lr.After(last) {
				count, last = count+1, lr
			}
			return count >= n
		}, func() string { return fmt.Sprintf("%d of %d", count, n) })
	}
}

// A standing fleet, and a handover, add nothing to the server's log: no
// follower round ends in an error the server logs (at its default
// log_min_error_statement).
func TestQuietFleetLogsNothing(t *testing.T) {
	waitsForRounds(t)
	quietFleet(t, testpg.Start(t))
}

// On PostgreSQL 17 and later a role or server may set transaction_timeout,
// which ends the session of any transaction that lasts longer, a single
// statement's too: an heir's lock wait outlasts a short one. Each session
// turns it off for itself, as it does statement_timeout.
func TestQuietFleetUnderTransactionTimeout(t *testing.T) {
	waitsForRounds(t)
	if num := sharedServer(t).VersionNum(); num < 170000 {
		t.Skipf("PostgreSQL %d has no transaction_timeout", num/10000)
	}
	quietFleet(t, testpg.Start(t, testpg.Options{Settings: []string{"transaction_timeout=300ms"}}))
}

// quietFleet runs a fleet of three on srv through a handover and a stop,
// and fails on any line it adds to the server's log.
func quietFleet(t *testing.T, srv *testpg.Server) {
	r := newRecorder(t)
	key := testKey(t)
	before := len(serverLog(srv))
	var els []*running
	for _, id := range []string{"quiet-1", "quiet-2", "quiet-3"} {
		// The trust window is wider than the other tests', as in
		// TestElectionsAcrossDeadlockTimeouts.
		els = append(els, start(t, r, opts{dsn: srv.DSN(), key: key, id: id, deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond}))
	}
	first := r.next("elected", "")
	// Two rounds each: an heir's lasts LeaseDuration, past deadlock_timeout.
	waitRounds(t, els, 2)
	// Resign whoever leads now: on a loaded machine the first leader's
	// tenure may have lapsed (and another elector, or it again, leads).
	eventually(t, "a leader resigns", func() (bool, string) {
		for _, rn := range els {
			if rn.e.IsLeader() && rn.e.Resign(context.Background()) == nil {
				return true, ""
			}
		}
		return false, "no elector leads"
	})
	second := r.next("elected", "")
	waitRounds(t, els, 2)
	if added := serverLog(srv)[before:]; len(added) > 0 {
		t.Fatalf("the fleet added %d lines to the server log (elected %s, then %s):\n%s", len(added), first.id, second.id, strings.Join(added, "\n"))
	}
	// Stopping is quiet too: a cancel request ends an heir's lock wait,
	// and the session function catches it.
	for _, rn := range els {
		rn.stop()
	}
	if added := serverLog(srv)[before:]; len(added) > 0 {
		t.Fatalf("stopping the fleet added %d lines to the server log:\n%s", len(added), strings.Join(added, "\n"))
	}
}

// Elections stay correct whatever the server's deadlock_timeout, and the
// standing fleet logs nothing: an heir's wait runs past a short one (the
// deadlock detector runs once per wait, and logs nothing while
// log_lock_waits is off) and stays under a long one.
func TestElectionsAcrossDeadlockTimeouts(t *testing.T) {
	waitsForRounds(t)
	for _, dt := range []string{"100ms", "10s"} {
		t.Run(dt, func(t *testing.T) {
			srv := testpg.Start(t, testpg.Options{Settings: []string{"deadlock_timeout=" + dt}})
			r := newRecorder(t)
			key := testKey(t)
			els := map[string]*running{}
			// A wider trust window than the other tests': a round's reply
			// later than RenewDeadline after its wait is cancelled, and
			// the server logs the cancel, which a machine loaded enough to
			// starve the server by 500 ms would otherwise show here.
			for _, id := range []string{"dt-1", "dt-2", "dt-3"} {
				els[id] = start(t, r, opts{dsn: srv.DSN(), key: key, id: id, deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond})
			}
			cur := r.next("elected", "")
			for i := 0; i < 2; i++ {
				// A resigned leader campaigns again after one interval:
				// on a loaded machine it may find no heir in a lock wait
				// by then and win again. Five times in a row is no
				// accident: the heirs are not waiting.
				for again := 0; ; again++ {
					if err := els[cur.id].e.Resign(context.Background()); err != nil && !errors.Is(err, leader.ErrNotLeader) {
						t.Fatal(err)
					}
					next := r.next("elected", "")
					if next.id != cur.id {
						cur = next
						break
					}
					if again == 4 {
						t.Fatalf("%s re-elected five times in a row while others waited", cur.id)
					}
				}
			}
			before := len(serverLog(srv))
			waitRounds(t, []*running{els["dt-1"], els["dt-2"], els["dt-3"]}, 2)
			if added := serverLog(srv)[before:]; len(added) > 0 {
				t.Fatalf("standing fleet logged:\n%s", strings.Join(added, "\n"))
			}
		})
	}
}

// A role that may not create temporary objects (only CONNECT) still gets
// correct elections: its follower rounds fall back to the plain lock wait,
// and the elector says so once per connection.
func TestRoleWithoutTempFallsBack(t *testing.T) {
	srv := testpg.Start(t)
	ctx := context.Background()
	for _, sql := range []string{
		"REVOKE TEMPORARY ON DATABASE postgres FROM PUBLIC",
		"CREATE ROLE connect_only LOGIN",
	} {
		if err := srv.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	dsn := "postgres://connect_only@" + srv.Addr() + "/postgres?sslmode=disable"
	r := newRecorder(t)
	key := testKey(t)
	core, logs := observer.New(zap.WarnLevel)
	a := start(t, r, opts{dsn: dsn, key: key, id: "plain-1", logger: zap.New(core)})
	start(t, r, opts{dsn: dsn, key: key, id: "plain-2"})
	first := r.next("elected", "")
	if first.id == "plain-1" {
		// A plain round waits on the lock for one interval, then starts
		// the next; the resigner campaigns again one interval after its
		// unlock. A process too starved to start its next round within
		// that interval may lose the lock to the resigner again, so the
		// test resigns again then (a bounded number of times).
		for i := 0; ; i++ {
			if err := a.e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if r.next("elected", "").id == "plain-2" {
				break
			}
			if i == 5 {
				t.Fatal("plain-2 never took the lock plain-1 resigned (6 resigns)")
			}
		}
	} else {
		waitWaiter(t, srv, key, "plain-1")
	}
	if logs.FilterMessageSnippet("cannot use their session function").Len() == 0 {
		t.Fatal("no warning that follower rounds fell back")
	}
}

// With the default privileges the elector uses the quiet rounds and says
// nothing about a fallback.
func TestDefaultRoleIsQuiet(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	core, logs := observer.New(zap.WarnLevel)
	startWith(t, r, opts{dsn: srv.DSN(), key: testKey(t), id: "default-role", logger: zap.New(core)}, func(*elector.Config) {})
	r.next("elected", "default-role")
	if n := logs.FilterMessageSnippet("cannot use their session function").Len(); n != 0 {
		t.Fatal("fell back with default privileges")
	}
}

// An heir's round waits three LeaseDurations (the session function cuts
// it while the server logs lock waits: TestHeirWaitWhileLockWaitsAreLogged).
// The watchers' refill spread is four fifths of deadlock_timeout, at most
// RenewDeadline.
func TestHeirWaitAndSpread(t *testing.T) {
	e, err := elector.New(elector.Config{
		Connect: elector.DSN("postgres://u@127.0.0.1:1/db"), Key: testKey(t),
		Callbacks:     elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
		RenewInterval: time.Second, RenewDeadline: 3 * time.Second, LeaseDuration: 6 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := elector.HeirWait(e); got != 18*time.Second {
		t.Errorf("heir wait %s, want three LeaseDurations", got)
	}
	for _, tt := range []struct{ deadlock, want time.Duration }{
		{time.Second, 800 * time.Millisecond},
		{100 * time.Millisecond, 80 * time.Millisecond},
		{10 * time.Second, 3 * time.Second}, // capped at RenewDeadline
		{0, 3 * time.Second},                // unknown: RenewDeadline
		{time.Millisecond, time.Millisecond},
	} {
		if got := elector.Spread(e, tt.deadlock); got != tt.want {
			t.Errorf("deadlock_timeout %s: spread %s, want %s", tt.deadlock, got, tt.want)
		}
	}
}

// Only the heirs queue on the lock; the other followers watch idle. When
// the leader and both heirs lose their sessions at once, a watcher's poll
// (every LeaseDuration) still elects a leader, and only one.
func TestWatchersElectWhenLeaderAndHeirsDie(t *testing.T) {
	waitsForRounds(t)
	srv := testpg.Start(t)
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	var els []*running
	core, logs := observer.New(zap.WarnLevel)
	for i := 1; i <= 5; i++ {
		id := fmt.Sprintf("w-%d", i)
		els = append(els, start(t, r, opts{dsn: srv.DSN(), key: key, id: id, deadline: 1500 * time.Millisecond, lease: 2 * time.Second,
			logger: zap.New(core).With(zap.String("elector", id))}))
	}
	first := r.next("elected", "")
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var h leader.HolderInfo
	eventually(t, "two heirs queue on the lock", func() (bool, string) {
		h, err = leader.Holder(ctx, conn, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(h.Waiters) == 2, fmt.Sprintf("%d waiters", len(h.Waiters))
	})
	// The waiters stay two: the other two followers watch. An heir between
	// two rounds is not queued for that moment (on a loaded machine such a
	// moment can be long), so count over a few rounds: never more than two,
	// and both of them again at the end.
	most, seen := 0, ""
	for i := 0; i < 2 || len(h.Waiters) != 2; i++ {
		waitRounds(t, els, 1)
		if h, err = leader.Holder(ctx, conn, key); err != nil {
			t.Fatal(err)
		}
		if len(h.Waiters) > most {
			most, seen = len(h.Waiters), queued(t, conn, h)
		}
		if i > 200 {
			t.Fatalf("the two heirs never queue together again (%d waiters)", len(h.Waiters))
		}
	}
	if most > 2 {
		for _, l := range logs.All() {
			t.Logf("%s %s %v", l.Time.Format("15:04:05.000"), l.Message, l.ContextMap())
		}
		t.Fatalf("%d sessions queued on the lock, want at most the 2 heirs: %s", most, seen)
	}
	pids := []uint32{h.Holder.PID}
	for _, w := range h.Waiters {
		pids = append(pids, w.PID)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM unnest($1::int4[]) pid", pids); err != nil {
		t.Fatal(err)
	}
	r.next("demoted", first.id)
	next := r.next("elected", "")
	t.Logf("after the leader %s and both heirs lost their sessions, %s was elected", first.id, next.id)
}

// queued names the sessions h saw queued, each with the locks it holds in
// pgleader's own space (an heir holds one of the key's heir slots), for a
// failure's message.
func queued(t *testing.T, conn *pgx.Conn, h leader.HolderInfo) string {
	t.Helper()
	var out []string
	for _, w := range h.Waiters {
		var held []string
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		rows, err := conn.Query(ctx, `SELECT format('%s/%s', objid, objsubid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND pid = $1 AND classid = $2::oid`, int32(w.PID), int64(uint32(lockconn.Space)))
		if err == nil {
			held, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s (pid %d, started %s; holds %v)", w.Identity, w.PID, w.BackendStart.Format("15:04:05.000"), held))
	}
	return strings.Join(out, ", ")
}

// An heir behind a silent network (a black-holed proxy: nothing answers,
// the socket stays open) gives its round up at the round's client-side
// deadline, its lock wait (HeirWait) plus RenewDeadline from when it sent
// the round, and reconnects: not sooner (a deadline inside the wait would
// end healthy heirs' waits with a reconnect) and not much later (no
// deadline would leave it waiting for ever). The round's start is the
// server's query_start of the heir's backend, read after the black-hole,
// when no later round can reach the server.
func TestHeirBehindSilentNetworkGivesUp(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	key := testKey(t)
	lead := start(t, r, opts{dsn: srv.DSN(), key: key, id: "sn-leader"})
	r.next("elected", "sn-leader")
	proxy := newProxy(t, srv)
	obs := newErrObserver()
	const deadline = time.Second
	heir := startWith(t, r, opts{dsn: proxy.DSN(), key: key, id: "sn-heir", deadline: deadline},
		func(c *elector.Config) { c.Observer = obs })
	waitWaiter(t, srv, key, "sn-heir")
	proxy.Blackhole()
	defer proxy.Heal()
	var began time.Time
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := mustConn(t, srv).QueryRow(ctx, `SELECT query_start FROM pg_stat_activity WHERE application_name = 'sn-heir'`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	obs.waitFor(t, leader.ErrConnectionLost, 1)
	gaveUp, _ := obs.firstAt(leader.ErrConnectionLost)
	want := elector.HeirWait(heir.e) + deadline
	took := gaveUp.Sub(began)
	t.Logf("the heir gave up %s after its round began (its wait plus RenewDeadline: %s)", took, want)
	if took < want-300*time.Millisecond {
		t.Errorf("gave up %s after the round began, before its wait plus RenewDeadline (%s)", took, want)
	}
	if took > want+3*time.Second {
		t.Errorf("gave up %s after the round began, long after its wait plus RenewDeadline (%s)", took, want)
	}
	if !lead.e.IsLeader() {
		t.Error("the leader stopped leading while its heir was cut off")
	}
}
