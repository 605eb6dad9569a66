package elector_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

// startRanked runs an elector with a rank.
func startRanked(t *testing.T, r *recorder, dsn string, key leader.Key, id string, s leader.Strategy, prio int, version string) *running {
	t.Helper()
	return startRankedLogged(t, r, dsn, key, id, s, prio, version, nil)
}

// startRankedLogged is startRanked with the elector's log to log (nil: the
// tests' default).
func startRankedLogged(t *testing.T, r *recorder, dsn string, key leader.Key, id string, s leader.Strategy, prio int, version string, log *zap.Logger) *running {
	t.Helper()
	// A wider trust window than the default tests': these tests check why
	// each leader stepped down, and a tenure lost to a renew starved on a
	// loaded machine (CI: "a-v1 demoted with pgleader: connection lost")
	// is another reason.
	return startWith(t, r, opts{dsn: dsn, key: key, id: id, deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond, logger: log}, func(c *elector.Config) {
		c.Strategy, c.Priority, c.Version = s, prio, version
	})
}

// elections lists who was elected, in order.
func (r *recorder) elections() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.kind == "elected" {
			out = append(out, e.id)
		}
	}
	return out
}

// lastAt is when the last event of kind by id came.
func (r *recorder) lastAt(kind, id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at time.Time
	for _, e := range r.events {
		if e.kind == kind && e.id == id {
			at = e.at
		}
	}
	return at
}

// knows waits until the leader heard a rank of version (or priority, for
// an empty version) from a candidate, and then for the leader's rounds to
// pass PreferredDelay (300 ms here) three times over: long enough for a
// handover it would start.
func knows(t *testing.T, ldr *running, version string, prio int) {
	t.Helper()
	eventually(t, ldr.e.Identity()+" hears the rank", func() (bool, string) {
		st := ldr.e.Status()
		return slices.ContainsFunc(st.Candidates, func(c elector.RankedCandidate) bool {
			return c.Version == version && c.Priority == prio
		}), fmt.Sprintf("%+v", st.Candidates)
	})
	waitRounds(t, []*running{ldr}, 10)
}

// A rollout from v1 to v2 under NewestVersion, one replica at a time, a
// new one started before the old one stops (a Deployment's surge):
// leadership moves to v2 once, when the first v2 candidate stands, and
// never back.
func TestRolloutNewestVersion(t *testing.T) {
	srv := sharedServer(t)
	rec := newRecorder(t)
	key := testKey(t)
	s := leader.NewestVersion
	a := startRanked(t, rec, srv.DSN(), key, "a-v1", s, 0, "1.0.0")
	rec.next("elected", "a-v1")
	b := startRanked(t, rec, srv.DSN(), key, "b-v1", s, 0, "1.0.0")
	c := startRanked(t, rec, srv.DSN(), key, "c-v1", s, 0, "1.0.0")
	knows(t, a, "1.0.0", 0) // ties keep the leader
	a2 := startRanked(t, rec, srv.DSN(), key, "a-v2", s, 0, "2.0.0")
	d := rec.next("demoted", "a-v1")
	rec.next("elected", "a-v2")
	if !strings.Contains(fmt.Sprint(d.reason), "handover to preferred candidate a-v2") {
		t.Fatalf("a-v1 demoted with %v", d.reason)
	}
	a.stop()
	for _, old := range []*running{b, c} {
		startRanked(t, rec, srv.DSN(), key, strings.Replace(old.e.Identity(), "v1", "v2", 1), s, 0, "2.0.0")
		knows(t, a2, "2.0.0", 0)
		old.stop()
	}
	waitRounds(t, []*running{a2}, 5)
	if got := rec.elections(); !slices.Equal(got, []string{"a-v1", "a-v2"}) {
		t.Fatalf("elections %v, want [a-v1 a-v2]: one handover to v2, none back", got)
	}
	if st := a2.e.Status(); !strings.HasPrefix(st.Why, "first come") {
		t.Fatalf("a-v2 leads %q among equals, want first come", st.Why)
	}
}

// The same rollout under OldestVersion: a v2 candidate never leads while a
// v1 one stands. Each leaving v1 leader hands over to another v1
// candidate, and leadership reaches v2 only when the last v1 leaves.
func TestRolloutOldestVersion(t *testing.T) {
	srv := sharedServer(t)
	rec := newRecorder(t)
	key := testKey(t)
	s := leader.OldestVersion
	// The v1 electors' handover lines, for a failure's message.
	core, logs := observer.New(zap.InfoLevel)
	logged := func(id string) *zap.Logger { return zap.New(core).With(zap.String("elector", id)) }
	olds := []*running{startRankedLogged(t, rec, srv.DSN(), key, "a-v1", s, 0, "1.0.0", logged("a-v1"))}
	rec.next("elected", "a-v1")
	olds = append(olds, startRankedLogged(t, rec, srv.DSN(), key, "b-v1", s, 0, "1.0.0", logged("b-v1")),
		startRankedLogged(t, rec, srv.DSN(), key, "c-v1", s, 0, "1.0.0", logged("c-v1")))
	ldr := olds[0]
	knows(t, ldr, "1.0.0", 0)
	var news []*running
	for i, old := range olds {
		news = append(news, startRanked(t, rec, srv.DSN(), key, strings.Replace(old.e.Identity(), "v1", "v2", 1), s, 0, "2.0.0"))
		if old == ldr {
			if i < len(olds)-1 {
				// The leader knows a v1 candidate it can hand over to: its
				// rank reached it (a rank that never does fails here).
				knows(t, ldr, "1.0.0", 0)
			}
			knows(t, ldr, "2.0.0", 0) // a v2 candidate stands: no handover to it
			if st := ldr.e.Status(); strings.HasPrefix(st.Why, "handing over") {
				t.Fatalf("%s: %q", ldr.e.Identity(), st.Why)
			}
		}
		old.stop()
		if old != ldr {
			continue
		}
		// The leader left: the next one is the oldest version standing.
		next := rec.next("elected", "").id
		if want := i < len(olds)-1; strings.HasSuffix(next, "-v1") != want {
			for _, l := range logs.FilterMessageSnippet("hand").All() {
				t.Logf("%s %s %v", l.Time.Format("15:04:05.000"), l.Message, l.ContextMap())
			}
			t.Fatalf("after %s left, %s leads (v1 candidates left: %v)", old.e.Identity(), next, want)
		}
		for _, r := range append(slices.Clone(olds), news...) {
			if r.e.Identity() == next {
				ldr = r
			}
		}
	}
	got := rec.elections()
	v2 := 0
	for _, id := range got {
		if strings.HasSuffix(id, "-v2") {
			v2++
		}
	}
	if v2 != 1 || !strings.HasSuffix(got[len(got)-1], "-v2") {
		t.Fatalf("elections %v: want v1 leaders until the last v1 left, then one v2", got)
	}
}

// Five candidates with priorities 0..4, started in random order: the
// highest priority standing leads, every time; stopped, it hands over to
// the next highest, and it leads again once it is back.
func TestHighestPriorityLeads(t *testing.T) {
	srv := sharedServer(t)
	rec := newRecorder(t)
	key := testKey(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	order := rand.New(rand.NewPCG(seed, 0)).Perm(5)
	els := map[int]*running{}
	for _, p := range order {
		els[p] = startRanked(t, rec, srv.DSN(), key, fmt.Sprintf("prio-%d", p), leader.ByPriority, p, "")
	}
	// top waits until want leads, elected after the first after
	// elections.
	top := func(want string, after int) {
		t.Helper()
		eventually(t, want+" leads", func() (bool, string) {
			got := rec.elections()
			return len(got) > after && got[len(got)-1] == want && leaderIs(els, want), fmt.Sprint(got)
		})
	}
	top("prio-4", 0)
	knows(t, els[4], "", 3) // a leader that leaves knows whom to hand over to
	before := len(rec.elections())
	els[4].stop()
	top("prio-3", before)
	if got := rec.elections()[before:]; !slices.Equal(got, []string{"prio-3"}) {
		t.Fatalf("after prio-4 left: elections %v, want [prio-3]", got)
	}
	back := time.Now()
	els[4] = startRanked(t, rec, srv.DSN(), key, "prio-4", leader.ByPriority, 4, "")
	top("prio-4", before+1)
	// Not before PreferredDelay (3 × RenewInterval) after it stood.
	if took := rec.lastAt("elected", "prio-4").Sub(back); took < 3*tInterval {
		t.Fatalf("prio-4 was handed the lock %s after it started: before PreferredDelay", took)
	}
	// Its session killed, an heir takes the lock at once; prio-4
	// reconnects, and it is handed the lock again.
	before = len(rec.elections())
	demoted := rec.count("demoted", "prio-4")
	conn := mustConn(t, srv)
	if _, err := conn.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'prio-4 [%'"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prio-4 demoted", func() (bool, string) { return rec.count("demoted", "prio-4") > demoted, "" })
	top("prio-4", before)
	// (An heir's election, then prio-4's; on a slow machine the heir may
	// hand over to prio-3 before prio-4 is back, or prio-4, back before
	// an heir's next round, may take the free lock itself.)
	if got := rec.elections()[before:]; len(got) > 3 || slices.Index(got, "prio-4") != len(got)-1 {
		t.Fatalf("after prio-4's session was killed: elections %v, want at most an heir's and prio-3's, then prio-4's", got)
	}
}

// leaderIs reports whether the electors that run agree that want leads.
func leaderIs(els map[int]*running, want string) bool {
	for _, r := range els {
		if r.e.Status().Tenure && r.e.Identity() != want {
			return false
		}
	}
	return true
}

// A rank is believed only from a session that stands for the key as the
// leader's own role. Another role's sessions that stand for the key under
// a candidate's name (one holds the key's roster lock and sends the rank,
// another queues on the key, ready for a reserved handover), and a
// session of the leader's role that does not stand, sending the leader a
// rank that outranks it, move nothing.
func TestForgedRankMovesNothing(t *testing.T) {
	rl := startRankedLeader(t)
	srv, r, rec, ldr, logs, target, leaderPID := rl.srv, rl.roles, rl.rec, rl.ldr, rl.logs, rl.target, rl.pid
	ctx := context.Background()
	payload := lockconn.RankPayload(leaderPID, lockconn.Rank{Priority: 100})
	evil := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, r.EvilDSN+"&application_name=evil-candidate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	queued := evil()
	qctx, qcancel := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		queued.Exec(qctx, target.Call("pg_advisory_lock"), target.Vals...) //nolint:errcheck // cancelled when the test ends
	}()
	t.Cleanup(func() { qcancel(); <-waited }) // before the connection's Close
	admin := mustConn(t, srv)
	eventually(t, "the hostile session queues", func() (bool, string) {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory' AND objid = $1", target.ObjID).Scan(&n)
		return err == nil && n == 1, fmt.Sprint(n, err)
	})
	roster := evil()
	if _, err := roster.Exec(ctx, "SELECT pg_advisory_lock_shared($1::int4, $2::int4)", lockconn.Space, target.Roster()); err != nil {
		t.Fatal(err)
	}
	idle, err := pgx.Connect(ctx, r.AppDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idle.Close(context.Background()) })
	// Both ranks reach the leader, which finds neither sender standing as
	// its role, and says so. They are sent again until then: the leader
	// listens only from its first renew on, which a loaded machine may
	// delay past the first sends (a refused sender is not heard again
	// for 10 s, so the extra copies cost nothing).
	eventually(t, "both ranks refused", func() (bool, string) {
		for _, c := range []*pgx.Conn{roster, idle} {
			if _, err := c.Exec(ctx, "SELECT pg_notify($1, $2)", target.ResignChannel(), payload); err != nil {
				return false, err.Error()
			}
		}
		refused := map[any]bool{}
		for _, e := range logs.FilterMessageSnippet("does not stand for the key as this leader's role").All() {
			refused[e.ContextMap()["candidate_pid"]] = true
		}
		return len(refused) == 2, fmt.Sprint(refused)
	})
	waitRounds(t, []*running{ldr}, 10)
	if got := rec.elections(); !slices.Equal(got, []string{"ranked-leader"}) || !ldr.e.IsLeader() {
		t.Fatalf("elections %v, IsLeader %v after forged ranks", got, ldr.e.IsLeader())
	}
}

// A leader that leaves hands over to the candidate it prefers most, not
// to whichever heir the server grants the lock: here the first heir
// (queued first, so granted first) ranks lowest, the second heir highest,
// and a watcher in between.
func TestLeavingLeaderHandsToPreferred(t *testing.T) {
	srv := sharedServer(t)
	rec := newRecorder(t)
	key := testKey(t)
	ldr := startRanked(t, rec, srv.DSN(), key, "leaving-5", leader.ByPriority, 5, "")
	rec.next("elected", "leaving-5")
	startRanked(t, rec, srv.DSN(), key, "heir-1", leader.ByPriority, 1, "")
	knows(t, ldr, "", 1)
	startRanked(t, rec, srv.DSN(), key, "heir-3", leader.ByPriority, 3, "")
	knows(t, ldr, "", 3)
	startRanked(t, rec, srv.DSN(), key, "watcher-2", leader.ByPriority, 2, "")
	knows(t, ldr, "", 2)
	// A loaded machine may have cost the leader its lead meanwhile (a late
	// renew), and its rank brought it back: what matters is that it leads
	// as it leaves.
	eventually(t, "leaving-5 leads", func() (bool, string) {
		got := rec.elections()
		return ldr.e.IsLeader() && got[len(got)-1] == "leaving-5", fmt.Sprint(got)
	})
	before := len(rec.elections())
	ldr.stop()
	eventually(t, "an election after leaving-5 left", func() (bool, string) {
		return len(rec.elections()) > before, fmt.Sprint(rec.elections())
	})
	if got := rec.elections()[before:]; got[0] != "heir-3" {
		t.Fatalf("elections after leaving-5 left %v (all: %v), want heir-3 first", got, rec.elections())
	}
}

// backendOf returns the backend pid of the session named name (0: none).
func backendOf(t *testing.T, dsn, name string) uint32 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid uint32
	err = conn.QueryRow(context.Background(), "SELECT pid FROM pg_stat_activity WHERE application_name = $1 OR starts_with(application_name, $1 || ' [')", name).Scan(&pid)
	if err != nil {
		return 0
	}
	return pid
}

// A preference handover is an ordinary graceful one: the next leader gets
// the next fencing term, and the history says why the last term ended.
func TestPreferenceHandoverInHistory(t *testing.T) {
	srv := sharedServer(t)
	rec := newRecorder(t)
	key := testKey(t)
	f := elector.Fencing{Enabled: true, Table: "prefer_terms", HistoryTable: "prefer_history"}
	startWith(t, rec, opts{dsn: srv.DSN(), key: key, id: "hist-0", fencing: f}, nil)
	e0 := rec.next("elected", "hist-0")
	startWith(t, rec, opts{dsn: srv.DSN(), key: key, id: "hist-1", fencing: f}, func(c *elector.Config) { c.Priority = 1 })
	e1 := rec.next("elected", "hist-1")
	if e1.term != e0.term+1 {
		t.Fatalf("terms %d then %d, want consecutive", e0.term, e1.term)
	}
	conn := mustConn(t, srv)
	eventually(t, "the history row of the first term", func() (bool, string) {
		var reason, detail string
		err := conn.QueryRow(context.Background(), "SELECT coalesce(reason, ''), coalesce(detail, '') FROM prefer_history WHERE key_name = $1 AND term = $2",
			key.String(), e0.term).Scan(&reason, &detail)
		return err == nil && reason == "resigned" && strings.Contains(detail, "handover to preferred candidate hist-1 (ByPriority: priority 1 over 0)"),
			fmt.Sprintf("%q %q %v", reason, detail, err)
	})
}

// A rank is believed only as the sender's session carries it: a session
// of the leader's own role that stands for the key (it holds the roster
// lock, and queues on the key under the same name, ready for a reserved
// handover) but whose application_name carries no rank, or another rank,
// tells the leader it ranks above it: nothing moves.
func TestRankNotCarriedBySessionMovesNothing(t *testing.T) {
	rl := startRankedLeader(t)
	r, rec, ldr, logs, target, leaderPID := rl.roles, rl.rec, rl.ldr, rl.logs, rl.target, rl.pid
	ctx := context.Background()
	for _, app := range []string{"liar", "liar-2 [P2]"} {
		conn := func() *pgx.Conn { return testpg.ConnectAs(t, r.AppDSN, app) }
		queued := conn()
		qctx, qcancel := context.WithCancel(ctx)
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			queued.Exec(qctx, target.Call("pg_advisory_lock"), target.Vals...) //nolint:errcheck // cancelled when the test ends
		}()
		t.Cleanup(func() { qcancel(); <-waited })
		roster := conn()
		if _, err := roster.Exec(ctx, "SELECT pg_advisory_lock_shared($1::int4, $2::int4)", lockconn.Space, target.Roster()); err != nil {
			t.Fatal(err)
		}
		payload := lockconn.RankPayload(leaderPID, lockconn.Rank{Priority: 100})
		eventually(t, app+": the rank refused", func() (bool, string) {
			if _, err := roster.Exec(ctx, "SELECT pg_notify($1, $2)", target.ResignChannel(), payload); err != nil {
				return false, err.Error()
			}
			n := 0
			for _, e := range logs.FilterMessageSnippet("a rank that the sender's session does not carry is ignored").All() {
				if e.ContextMap()["application_name"] == app {
					n++
				}
			}
			return n > 0, ""
		})
	}
	waitRounds(t, []*running{ldr}, 10)
	if got := rec.elections(); !slices.Equal(got, []string{"ranked-leader"}) || !ldr.e.IsLeader() {
		t.Fatalf("elections %v, IsLeader %v after ranks no session carries", got, ldr.e.IsLeader())
	}
}

// rankedLeader is a leader of priority 1 on a server of its own, with
// the hostile roles, its logs observed.
type rankedLeader struct {
	srv    *testpg.Server
	roles  *testpg.Roles
	rec    *recorder
	ldr    *running
	logs   *observer.ObservedLogs
	target *lockconn.Target
	pid    uint32 // the leader's backend
}

func startRankedLeader(t *testing.T) rankedLeader {
	t.Helper()
	rl := rankedLeader{srv: testpg.Start(t), rec: newRecorder(t)}
	rl.roles = testpg.NewRoles(t, rl.srv)
	key := testKey(t)
	core, logs := observer.New(zap.InfoLevel)
	rl.logs = logs
	rl.ldr = startWith(t, rl.rec, opts{dsn: rl.roles.AppDSN, key: key, id: "ranked-leader", logger: zap.New(core)}, func(c *elector.Config) { c.Priority = 1 })
	rl.rec.next("elected", "ranked-leader")
	rl.target = lockconn.NewTarget(key, "", "", "")
	eventually(t, "the leader's backend", func() (bool, string) {
		rl.pid = backendOf(t, rl.roles.AppDSN, "ranked-leader")
		return rl.pid != 0, ""
	})
	return rl
}

// A ranked heir tells a new leader its rank when it first sees it and once
// more a second later, and, when it does not outrank the leader, nothing
// after that. Both may reach a new leader before it listens (it begins to
// with its first renew, and an heir can look it up in pg_locks before
// that), and the heir then waits for up to LeaseDuration. So a wake that
// ends its wait (a new leader's announcement, a reservation; here a
// cancel request from a session of the same role, as those are) makes it
// tell its rank again.
func TestWokenHeirTellsItsRankAgain(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	rec := newRecorder(t)
	key := testKey(t)
	listener := mustConn(t, srv)
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{lockconn.NewTarget(key, "", "", "").ResignChannel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	startRanked(t, rec, srv.DSN(), key, "retell-5", leader.ByPriority, 5, "")
	rec.next("elected", "retell-5")
	startRanked(t, rec, srv.DSN(), key, "retell-1", leader.ByPriority, 1, "")
	var pid uint32
	eventually(t, "retell-1's backend", func() (bool, string) {
		pid = backendOf(t, srv.DSN(), "retell-1")
		return pid != 0, ""
	})
	tellings := 0
	told := func(within time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		for {
			n, err := listener.WaitForNotification(wctx)
			if err != nil {
				return false
			}
			if n.PID == pid && strings.Contains(n.Payload, "\trank\t") {
				tellings++
				return true
			}
		}
	}
	for tellings < 2 {
		if !told(10 * time.Second) {
			t.Fatalf("retell-1 told its rank %d times, want 2 (at first sight, and a second later)", tellings)
		}
	}
	waitWaiter(t, srv, key, "retell-1")
	if _, err := listener.Exec(ctx, "SELECT pg_cancel_backend($1)", int32(pid)); err != nil {
		t.Fatal(err)
	}
	if !told(10 * time.Second) {
		t.Fatal("retell-1 did not tell its rank again when a wake ended its wait")
	}
}
