package elector_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// A resign request from another process hands over gracefully: OnElected's
// context ends first, then OnDemoted, and a waiting candidate leads; with
// a name, that candidate leads, heir or watcher.
func TestRequestResign(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	// A wider trust window than the other tests': requests name the
	// leader's backend, which a tenure lost to a starved renew on a loaded
	// machine would change (the request is then unanswered).
	for i := 1; i <= 5; i++ {
		start(t, r, opts{dsn: srv.DSN(), key: key, id: fmt.Sprintf("rr-%d", i), deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond})
	}
	cur := r.next("elected", "").id
	connect := elector.DSN(srv.DSN())
	ho, err := elector.RequestResign(ctx, connect, key, "")
	if err != nil {
		t.Fatal(err)
	}
	if ho.From != cur || ho.To == "" || ho.To == cur {
		t.Fatalf("handover %+v, from %s", ho, cur)
	}
	r.next("demoted", cur)
	r.next("elected", ho.To)
	t.Logf("resign on request: %s -> %s, seen after %s", ho.From, ho.To, ho.Took)
	// Every other candidate in turn, by name: heirs and watchers alike.
	cur = ho.To
	for i := 1; i <= 5; i++ {
		to := fmt.Sprintf("rr-%d", i)
		if to == cur {
			continue
		}
		standsBy(t, srv, key, cur, to)
		ho, err := elector.RequestResign(ctx, connect, key, to)
		if err != nil {
			t.Fatalf("to %s: %v", to, err)
		}
		if ho.To != to {
			t.Fatalf("asked for %s, %s leads", to, ho.To)
		}
		r.next("elected", to)
		t.Logf("handover %s -> %s, seen after %s", ho.From, ho.To, ho.Took)
		cur = to
	}
	// Clear answers.
	if _, err := elector.RequestResign(ctx, connect, key, "nobody"); !errors.Is(err, leader.ErrNotCandidate) {
		t.Fatalf("unknown candidate: %v", err)
	}
	if _, err := elector.RequestResign(ctx, connect, key, cur); !errors.Is(err, leader.ErrRefused) {
		t.Fatalf("the leader itself: %v", err)
	}
	if _, err := elector.RequestResign(ctx, connect, leader.KeyFromName(t.Name()+"/none"), ""); !errors.Is(err, leader.ErrNoLeader) {
		t.Fatalf("no leader: %v", err)
	}
}

// Only allowed roles may ask; an elector can refuse every request.
func TestRequestResignRefused(t *testing.T) {
	srv := testpg.Start(t)
	ctx := context.Background()
	for _, sql := range []string{
		"CREATE ROLE stranger LOGIN",
		"CREATE ROLE operators NOLOGIN",
		"CREATE ROLE oncall LOGIN IN ROLE operators",
	} {
		if err := srv.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	as := func(role string) elector.Connector {
		return elector.DSN("postgres://" + role + "@" + srv.Addr() + "/postgres?sslmode=disable")
	}
	r := newRecorder(t)
	key := testKey(t)
	// A wider trust window, as in TestRequestResign: a tenure lost to a
	// starved renew would let "other", which allows no operators, lead.
	wide := opts{deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond}
	startWith(t, r, opts{dsn: srv.DSN(), key: key, id: "guarded", deadline: wide.deadline, lease: wide.lease}, func(c *elector.Config) {
		c.ResignRequests.Roles = []string{"operators"}
	})
	r.next("elected", "guarded")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "other", deadline: wide.deadline, lease: wide.lease})
	waitWaiter(t, srv, key, "other")
	_, err := elector.RequestResign(ctx, as("stranger"), key, "")
	if !errors.Is(err, leader.ErrRefused) {
		t.Fatalf("a stranger's request: %v", err)
	}
	t.Logf("refused: %v", err)
	ho, err := elector.RequestResign(ctx, as("oncall"), key, "")
	if err != nil || ho.To != "other" {
		t.Fatalf("a member of an allowed role: %+v, %v", ho, err)
	}
	r.next("elected", "other")

	key2 := leader.KeyFromName(t.Name() + "/closed")
	startWith(t, r, opts{dsn: srv.DSN(), key: key2, id: "closed"}, func(c *elector.Config) {
		c.ResignRequests.Disabled = true
	})
	r.next("elected", "closed")
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := elector.RequestResign(rctx, elector.DSN(srv.DSN()), key2, ""); !errors.Is(err, leader.ErrRefused) {
		t.Fatalf("a request to an elector that takes none: %v", err)
	}
}

// A Resign from outside always demotes with ErrResigned, also when
// OnElected returns the instant its context ends (its own return must not
// race the resign's cause). Two electors, so that each resign hands over
// at once.
func TestResignReasonWithQuickCallback(t *testing.T) {
	srv := sharedServer(t)
	elected := make(chan *elector.Elector, 2)
	demoted := make(chan error, 2)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, id := range []string{"quick-a", "quick-b"} {
		var e *elector.Elector
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(srv.DSN()), Key: testKey(t), Identity: id,
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) { elected <- e; <-ctx.Done() },
				OnDemoted: func(l leader.Leadership, reason error) { demoted <- reason },
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(ctx) }()
	}
	for i := range 30 {
		e := recv(t, elected, "an election")
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if reason := recv(t, demoted, "the demotion"); !errors.Is(reason, leader.ErrResigned) {
			t.Fatalf("resign %d: demoted with %v, want ErrResigned", i, reason)
		}
	}
}

// A request sent the moment a new leader shows in pg_locks, before the
// leader listens for requests (it begins to with its first renew, after
// OnElected started), is sent again until it is heard, and answered: here
// the new leader's replies are delayed 300 ms by a proxy, so it listens
// some 300 ms after its grant. Sent once, the request was lost, and the
// asker got ErrNoAnswer after 5 s.
func TestRequestResignRightAfterElection(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	blocker := mustConn(t, srv)
	args, vals := key.SQLArgs(1)
	if _, err := blocker.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	proxy := newProxy(t, srv)
	startWith(t, r, opts{dsn: proxy.DSN(), key: key, id: "slow"}, func(c *elector.Config) {
		c.RenewInterval, c.RenewDeadline, c.LeaseDuration = elector.DefaultRenewInterval, elector.DefaultRenewDeadline, elector.DefaultLeaseDuration
	})
	admin := mustConn(t, srv)
	if err := testpg.WaitWaiter(ctx, admin, key, "slow"); err != nil {
		t.Fatal(err)
	}
	proxy.DelayReplies(300 * time.Millisecond)
	if _, err := blocker.Exec(ctx, "SELECT pg_advisory_unlock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	eventually(t, "slow holds the lock", func() (bool, string) {
		h, err := leader.Holder(ctx, admin, key)
		return err == nil && h.Holder.Identity == "slow", fmt.Sprint(h, err)
	})
	type result struct {
		ho  elector.Handover
		err error
	}
	res := make(chan result, 1)
	go func() {
		ho, err := elector.RequestResign(ctx, elector.DSN(srv.DSN()), key, "")
		res <- result{ho, err}
	}()
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "next"})
	got := recv(t, res, "RequestResign's result")
	if got.err != nil || got.ho.From != "slow" || got.ho.To != "next" {
		t.Fatalf("RequestResign right after the election: %+v, %v; want slow -> next", got.ho, got.err)
	}
	t.Logf("handover slow -> next, seen %s after the request", got.ho.Took)
}

// A request is a NOTIFY, and a NOTIFY's commit waits for the server-wide
// notify lock, which another session holds for as long as its own
// notifying commit waits: here a transaction that wrote WAL and notified,
// waiting for a synchronous standby that never comes. The request waits
// for the lock too, not for the caller's lock_timeout (a timeout there is
// an ERROR the server logs with no statement). The electors' sessions run
// with synchronous_commit on (for the fencing terms), and nothing they do
// without terms may wait for the missing standby.
func TestRequestResignWaitsForTheNotifyLock(t *testing.T) {
	srv := testpg.Start(t, testpg.Options{Settings: []string{"synchronous_standby_names=nobody"}})
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	wide := opts{deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond}
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "held-1", deadline: wide.deadline, lease: wide.lease})
	r.next("elected", "held-1")
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "held-2", deadline: wide.deadline, lease: wide.lease})
	waitWaiter(t, srv, key, "held-2")

	stalled := mustConn(t, srv)
	if _, err := stalled.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	stalledPID := stalled.PgConn().PID()
	admin := mustConn(t, srv)
	stalledDone := make(chan struct{})
	go func() {
		defer close(stalledDone)
		// WAL to wait for, and no temporary table left for the session's
		// end to drop (its commit would wait too).
		stalled.Exec(ctx, "CREATE TEMP TABLE stall () ON COMMIT DROP; NOTIFY stalled", pgx.QueryExecModeSimpleProtocol)
	}()
	release := func() {
		if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", stalledPID); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { // also when the test fails before its own release
		for {
			select {
			case <-stalledDone:
				return
			case <-time.After(100 * time.Millisecond):
				release()
			}
		}
	})
	waitingOn := func(pid uint32, event string) func() (bool, string) {
		return func() (bool, string) {
			var ev string
			err := admin.QueryRow(ctx, "SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&ev)
			return err == nil && ev == event, fmt.Sprint(ev, err)
		}
	}
	eventually(t, "the stalled commit waits for the standby", waitingOn(stalledPID, "SyncRep"))

	type result struct {
		ho  elector.Handover
		err error
	}
	res := make(chan result, 1)
	go func() {
		ho, err := elector.RequestResign(ctx, elector.DSN(srv.DSN()+"&application_name=asker&lock_timeout=1&synchronous_commit=on"), key, "")
		res <- result{ho, err}
	}()
	eventually(t, "the request waits for the notify lock", func() (bool, string) {
		select {
		case got := <-res:
			t.Fatalf("RequestResign returned while the notify lock was held: %+v, %v", got.ho, got.err)
		default:
		}
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE a.application_name = 'asker' AND l.locktype = 'object' AND NOT l.granted`).Scan(&n)
		return err == nil && n == 1, fmt.Sprint(n, err)
	})
	// The stalled session gives up its wait (committed locally, a WARNING)
	// and lets the lock go; the standby is still missing.
	release()
	recv(t, stalledDone, "the stalled commit's end")
	got := recv(t, res, "RequestResign's result")
	if got.err != nil || got.ho.From != "held-1" || got.ho.To != "held-2" {
		t.Fatalf("RequestResign behind the notify lock: %+v, %v; want held-1 -> held-2", got.ho, got.err)
	}
	r.next("elected", "held-2")
	if log := srv.LogTail(1 << 20); strings.Contains(log, "lock timeout") {
		t.Fatalf("the server logged a lock timeout:\n%s", log)
	}
}

// Requests are addressed to the leader's backend: a copy meant for an
// earlier leader (another pid), and a payload that is no request, are
// dropped unread, and the leader keeps leading.
func TestMisaddressedRequestsAreDropped(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	// A wider trust window than the other tests': the request names the
	// leader's backend, which a lapsed tenure would replace.
	el := start(t, r, opts{dsn: srv.DSN(), key: key, id: "addressed", deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond})
	r.next("elected", "addressed")
	asker := mustConn(t, srv)
	reply := lockconn.ReplyChannel(asker.PgConn().PID())
	if _, err := asker.Exec(ctx, "LISTEN "+pgx.Identifier{reply}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, resign, _, _ := keyChannels(key)
	// Once a request is answered, the leader listens (the asker's role is
	// the leader's own here: it may ask). The request names the leader's
	// backend as pg_locks shows it; a loaded machine may end a tenure
	// (its trust window lapsing) and begin one on a new backend, so the
	// holder is read again when no answer comes.
	var pid uint32
	var proper string
	for attempt := 0; ; attempt++ {
		h, err := leader.Holder(ctx, mustConn(t, srv), key)
		if err != nil || h.Holder.Identity != "addressed" {
			t.Fatalf("holder %+v, %v", h, err)
		}
		pid = h.Holder.PID
		proper = lockconn.RequestPayload(pid, "nobody")
		a, ok := tryAsk(t, asker, resign, proper, waitLong/5)
		if ok && !strings.HasPrefix(a, "unknown: ") {
			t.Fatalf("answer %q", a)
		}
		if ok {
			break
		}
		if attempt == 4 {
			t.Fatalf("no answer to %q on %s within %s", proper, resign, waitLong)
		}
	}
	for _, payload := range []string{
		lockconn.RequestPayload(pid+1, ""), lockconn.RequestPayload(pid+1, "addressed"),
		"", "addressed", fmt.Sprintf("%d", pid), fmt.Sprintf("0%d ", pid), fmt.Sprintf("-%d ", pid), " ",
		proper, // the last: its answer shows that the leader read the others
	} {
		if _, err := asker.Exec(ctx, "SELECT pg_notify($1, $2)", resign, payload); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, waitLong)
	n, err := asker.WaitForNotification(wctx)
	cancel()
	if err != nil || !strings.HasPrefix(n.Payload, "unknown: ") {
		t.Fatalf("the addressed request's answer: %v, %v", n, err)
	}
	wctx, cancel = context.WithTimeout(ctx, 5*tInterval)
	n, err = asker.WaitForNotification(wctx)
	cancel()
	if err == nil {
		t.Fatalf("a second answer, %q: a misaddressed request was taken up", n.Payload)
	}
	if st := el.e.Status(); !st.Leading {
		t.Fatalf("the leader stopped leading: %+v", st)
	}
}

func TestRequestPayload(t *testing.T) {
	for _, c := range []struct {
		pid uint32
		to  string
	}{{1, ""}, {4242, "worker-7"}, {4294967295, "a b  c"}, {77, " lead"}} {
		pid, to, ok := lockconn.ParseRequest(lockconn.RequestPayload(c.pid, c.to))
		if !ok || pid != c.pid || to != c.to {
			t.Errorf("round trip of (%d, %q): (%d, %q, %v)", c.pid, c.to, pid, to, ok)
		}
	}
	for _, bad := range []string{"", "worker-7", "12", "0 x", "-1 x", "+1 x", "01 x", "4294967296 x", " 12 x", "1x y"} {
		if pid, to, ok := lockconn.ParseRequest(bad); ok {
			t.Errorf("ParseRequest(%q) = (%d, %q, true), want not a request", bad, pid, to)
		}
	}
}

// A handover on request to a ranked candidate, named by its identity or by
// its application_name with its rank: the reservation binds to it (its
// session carries the rank after its identity), and it leads next.
func TestRequestResignToRankedCandidate(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	r := newRecorder(t)
	key := testKey(t)
	for i := 1; i <= 3; i++ {
		// Equal ranks: ties keep the leader, so only the requests move it.
		startWith(t, r, opts{dsn: srv.DSN(), key: key, id: fmt.Sprintf("rk-%d", i), deadline: 1500 * time.Millisecond, lease: 4500 * time.Millisecond},
			func(c *elector.Config) { c.Priority, c.Version = 1, "1.0.0" })
	}
	cur := r.next("elected", "").id
	connect := elector.DSN(srv.DSN())
	ids := []string{"rk-1", "rk-2", "rk-3"}
	// What the leader is asked: the reservation binds to an identity, so a
	// request that named the session's whole application_name would
	// reserve the lock for nobody (it would still move, later, to whoever
	// the server grants it once the reservation's bound passes).
	listener := mustConn(t, srv)
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{lockconn.NewTarget(key, "", "", "").ResignChannel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	for _, asName := range []bool{true, false} {
		to := ids[(slices.Index(ids, cur)+1)%len(ids)]
		standsBy(t, srv, key, cur, to)
		name := to
		if asName {
			name = to + " [P1 1.0.0]"
		}
		h, err := leader.Holder(ctx, listener, key)
		if err != nil {
			t.Fatal(err)
		}
		ho, err := elector.RequestResign(ctx, connect, key, name)
		if err != nil {
			t.Fatalf("to %q: %v", name, err)
		}
		if ho.From != cur || ho.To != to {
			t.Fatalf("asked %s for %q: handover %+v", cur, name, ho)
		}
		if asked := requestedTo(t, listener, h.Holder.PID); asked != to {
			t.Fatalf("asked for %q: the request named %q, want the identity %q", name, asked, to)
		}
		r.next("elected", to)
		cur = to
	}
}

// requestedTo reads the resign requests conn heard (it listens on the
// key's resign channel) and returns the candidate the first one addressed
// to the leader's backend pid named.
func requestedTo(t *testing.T, conn *pgx.Conn, pid uint32) string {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			t.Fatalf("no resign request heard: %v", err)
		}
		if leaderPID, to, ok := lockconn.ParseRequest(n.Payload); ok && leaderPID == pid {
			return to
		}
	}
}

// standsBy waits until cur leads key and to stands for it (on a loaded
// machine a follower whose round missed its deadline is between sessions
// for a moment, and is then rightly no candidate).
func standsBy(t *testing.T, srv *testpg.Server, key leader.Key, cur, to string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, to+" stands by", func() (bool, string) {
		conn := mustConn(t, srv)
		defer conn.Close(ctx)
		h, err := leader.Holder(ctx, conn, key)
		if err != nil || h.Holder.Identity != cur {
			return false, fmt.Sprint(h, err)
		}
		ok, err := lockconn.Standing(ctx, conn, lockconn.NewTarget(key, "", "", ""), to)
		return ok && err == nil, fmt.Sprintf("%s standing: %v %v", to, ok, err)
	})
}
