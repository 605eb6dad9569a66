package group_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/inspect"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The same for a Group: every key is elected once, on one member.
func TestShadowedBuiltinsDoNotElectGroupKeys(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	r.Shadow(t)
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 10)
	var ms []*member
	for _, id := range []string{"g-a", "g-b"} {
		ms = append(ms, startMember(t, r.AppDSN, t.Name(), id, keys, w))
	}
	balanced(t, w, len(keys), 5, 5, "g-a", "g-b")
	w.mu.Lock()
	before := 0
	for _, n := range w.elected {
		before += n
	}
	w.mu.Unlock()
	// Several full rounds of both members: nothing is elected again.
	for _, m := range ms {
		st := m.g.Status()
		eventually(t, "ten more rounds", func() (bool, string) {
			return m.g.Status().Rounds >= st.Rounds+10, ""
		})
	}
	w.mu.Lock()
	after := 0
	for _, n := range w.elected {
		after += n
	}
	w.mu.Unlock()
	// Shadowed built-ins made every member "win" every key at every round
	// (190 to 200 elections in 5 s). A loaded machine may end a member's
	// session once (a missed renew deadline), and each of its keys is then
	// elected again once: more than that is the bug.
	if after-before > len(keys) {
		t.Errorf("%d elections during ten quiet rounds", after-before)
	}
	if owned := len(ms[0].g.Owned()) + len(ms[1].g.Owned()); owned != len(keys) {
		t.Errorf("the members report %d keys owned, of %d", owned, len(keys))
	}
}

// Forged group messages: resigns of every key a member owns, in this
// version's encoding and the one before, on the group's channel and on
// the successor's own; joins, releases and "gone" for live members; and junk.
// None moves a key, and junk costs no round.
func TestGroupForgedMessages(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	grp := t.Name()
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 10)
	a := startMember(t, r.AppDSN, grp, "m-a", keys, w)
	b := startMember(t, r.AppDSN, grp, "m-b", keys, w)
	balanced(t, w, len(keys), 5, 5, "m-a", "m-b")
	before := electionsOf(w)
	ch, chB := groupChannels(grp, "m-b")
	evil := r.EvilConn(t)
	ctx := context.Background()
	send := func(channel, payload string) {
		t.Helper()
		if _, err := evil.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			t.Fatal(err)
		}
	}
	rounds := a.g.Status().Rounds
	began := time.Now()
	for range 3 {
		for _, k := range a.g.Owned() {
			c, o, s := k.LockTag()
			tag := fmt.Sprintf("%d.%d.%d", c, o, s)
			for _, p := range []string{
				"m-a resigned " + tag + " to m-b",  // the encoding before
				`resigned "m-a" ` + tag + ` "m-b"`, // this one
				`resigned "m-a" ` + tag + ` ""`,    // to nobody
			} {
				send(ch, p)
				send(chB, p)
			}
		}
		for _, p := range []string{`gone "m-a"`, `gone "m-b"`, "gone m-a", "released", "junk"} {
			send(ch, p)
		}
	}
	for i := range 300 {
		send(ch, fmt.Sprintf("junk %d", i))
	}
	waitFullRounds(t, 5, a, b)
	if n := electionsOf(w) - before; n != 0 {
		t.Fatalf("%d elections after forged messages", n)
	}
	balanced(t, w, len(keys), 5, 5, "m-a", "m-b")
	// The forged messages cost no round: the rounds ran on their schedule
	// (one per 100 ms), with a little slack for the machine.
	elapsed := time.Since(began)
	if extra := a.g.Status().Rounds - rounds - int64(elapsed/(100*time.Millisecond)); extra > 5 {
		t.Errorf("%d more full rounds than the schedule's in %s", extra, elapsed)
	}
	if st := a.g.Status(); st.Dropped == 0 {
		t.Errorf("Status().Dropped = 0 after forged messages")
	}
}

// A flood of forged joins (which may be a real member joining, so each is
// a hint) triggers at most one full round per quarter interval.
func TestGroupJoinFloodIsRateLimited(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	grp := t.Name()
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 4)
	m := startMember(t, r.AppDSN, grp, "m-a", keys, w)
	balanced(t, w, len(keys), 4, 4, "m-a")
	ch, _ := groupChannels(grp, "m-a")
	evil := r.EvilConn(t)
	rounds := m.g.Status().Rounds
	began := time.Now()
	for range 500 {
		if _, err := evil.Exec(context.Background(), "SELECT pg_notify($1, 'joined')", ch); err != nil {
			t.Fatal(err)
		}
	}
	waitFullRounds(t, 3, m) // the member has read them all
	elapsed := time.Since(began)
	// The schedule's rounds (one per 100 ms) plus at most one per 25 ms.
	if got, most := m.g.Status().Rounds-rounds, int64(elapsed/(100*time.Millisecond)+elapsed/(25*time.Millisecond))+5; got > most {
		t.Errorf("%d full rounds in %s of forged joins, want at most %d", got, elapsed, most)
	}
}

// A session of another role that holds a group's roster lock in share mode
// (as members do) is not a member: no key is assigned to it, so none goes
// unled, though its application_name claims the best rank there is.
func TestGroupIgnoresForeignMember(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	grp := t.Name()
	evil, err := pgx.Connect(context.Background(), r.EvilDSN+"&application_name="+url.PathEscape("ghost [P99]"))
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close(context.Background())
	c, o := inspect.GroupRoster(grp)
	if _, err := evil.Exec(context.Background(), "SELECT pg_advisory_lock_shared($1::int4, $2::int4)", int32(c), int32(o)); err != nil {
		t.Fatal(err)
	}
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 6)
	m := startMember(t, r.AppDSN, grp, "m-a", keys, w)
	balanced(t, w, len(keys), 6, 6, "m-a")
	if got := m.g.Members(); len(got) != 1 || got[0] != "m-a" {
		t.Fatalf("members: %v", got)
	}
	if st := m.g.Status(); len(st.Eligible) != 1 || st.Eligible[0] != "m-a" || len(st.Ranks) != 0 {
		t.Fatalf("eligible %v, ranks %v", st.Eligible, st.Ranks)
	}
}

// A session of the group's own role that waits for the roster lock (an
// operator's pg_advisory_lock on it, meant to stop the group, queues
// behind the members' shared holds) is no member either: only a session
// that holds the lock is. Were it counted, the keys assigned to it would
// go unled while it waits: every key here, as its name claims the best
// rank there is. The members run without their crash watch, which would
// hide it: it finds no member lock of such a "member", reports it gone,
// and keeps it out of the members until it is listed again RenewDeadline
// later (the keys then move to it and back, every RenewDeadline).
func TestGroupIgnoresQueuedRosterSession(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	grp := t.Name()
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 6)
	start := func(id string) *member {
		return runMember(t, group.Config{
			Connect: leader.DSN(r.AppDSN), Group: grp, Keys: keys, Identity: id, Callbacks: w.callbacks(id),
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
			SingleConnection: true, Logger: testLogger(t, nil),
		})
	}
	a, b := start("m-a"), start("m-b")
	balanced(t, w, len(keys), 3, 3, "m-a", "m-b")
	waiter, err := pgx.Connect(context.Background(), r.AppDSN+"&application_name="+url.PathEscape("ghost [P99]"))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(context.Background())
	c, o := inspect.GroupRoster(grp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", int32(c), int32(o))
		done <- err
	}()
	defer func() {
		cancel()
		recv(t, done, "the waiter's end")
	}()
	admin := mustConn(t, srv)
	eventually(t, "the waiter queued on the roster lock", func() (bool, string) {
		var n int
		err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND classid = $1::oid AND objid = $2::oid AND objsubid = 2 AND NOT granted`, c, o).Scan(&n)
		return err == nil && n == 1, fmt.Sprint(n, " queued, ", err)
	})
	sa, sb := a.g.Status().Scans, b.g.Status().Scans
	eventually(t, "both members scanned twice since", func() (bool, string) {
		na, nb := a.g.Status().Scans, b.g.Status().Scans
		return na >= sa+2 && nb >= sb+2, fmt.Sprint(na-sa, " and ", nb-sb, " scans")
	})
	for _, m := range []*member{a, b} {
		if got := m.g.Members(); !slices.Equal(got, []string{"m-a", "m-b"}) {
			t.Errorf("members: %v, want [m-a m-b] (a session waiting for the roster lock is no member)", got)
		}
	}
	balanced(t, w, len(keys), 3, 3, "m-a", "m-b")
}

// Another role that holds the roster lock exclusively keeps a member from
// joining: it says so, naming the holder, and joins once the lock is free.
// One that holds the member's own lock does not keep it out.
func TestGroupSquattedLocks(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	grp := t.Name()
	evil, err := pgx.Connect(context.Background(), r.EvilDSN+"&application_name=squatter")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close(context.Background())
	ctx := context.Background()
	c, o := inspect.GroupRoster(grp)
	h := fnv.New32a()
	fmt.Fprintf(h, "member|%s|%s", grp, "m-a")
	var evilPid int32
	if err := evil.QueryRow(ctx, "SELECT pg_backend_pid() FROM pg_advisory_lock($1::int4, $2::int4) a, pg_advisory_lock($1::int4, $3::int4) b",
		int32(c), int32(o), int32(h.Sum32())).Scan(&evilPid); err != nil {
		t.Fatal(err)
	}
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 3)
	m := startMember(t, r.AppDSN, grp, "m-a", keys, w)
	eventually(t, "the member says who keeps it out", func() (bool, string) {
		st := m.g.Status()
		return strings.Contains(st.LastError, fmt.Sprint("pid ", evilPid)) && strings.Contains(st.LastError, r.Evil) &&
			strings.Contains(st.LastError, "squatter"), st.LastError
	})
	if _, n := w.counts(); n != 0 {
		t.Fatalf("%d keys led by a member that could not join", n)
	}
	if _, err := evil.Exec(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", int32(c), int32(o)); err != nil {
		t.Fatal(err)
	}
	balanced(t, w, len(keys), 3, 3, "m-a")
	if st := m.g.Status(); st.LastError != "" {
		t.Errorf("LastError after joining: %q", st.LastError)
	}
}

// Another role fills the server's lock table while a member takes keys:
// the member takes none then, says so, keeps its session and its keys,
// and takes the rest once the table has room. Run does not end.
func TestGroupLockTableFilledByAnotherRole(t *testing.T) {
	srv := testpg.Start(t, testpg.Options{Settings: []string{"max_locks_per_transaction=10", "max_connections=20"}})
	r := testpg.NewRoles(t, srv)
	w := newGroupWatch(t)
	first, more := groupKeys(t.Name()+"/a", 10), groupKeys(t.Name()+"/b", 20)
	m := startMember(t, r.AppDSN, t.Name(), "m-a", first, w)
	balanced(t, w, len(first), 10, 10, "m-a")
	// Fill the table: a session of the other role takes locks until the
	// server refuses (SQLSTATE 53200).
	evil := r.EvilConn(t)
	held := testpg.FillLockTable(t, evil)
	t.Logf("another role holds %d advisory locks", held)
	if err := m.g.SetKeys(append(first, more...)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the member reports a full lock table", func() (bool, string) {
		st := m.g.Status()
		return st.LockTableFull > 0 && strings.Contains(st.LastError, "lock table"), st.LastError
	})
	// Its rounds renew the keys it leads meanwhile: they read no shared
	// catalog, whose locks a full table would refuse.
	// (A lock or two the server's own processes let go of may take one
	// more key: the table is full, not frozen.)
	waitFullRounds(t, 10, m)
	w.mu.Lock()
	for _, k := range first {
		if w.leading[k.String()] != "m-a" {
			t.Errorf("key %s not led while the table is full", k)
		}
	}
	w.mu.Unlock()
	noneDemotedThenRoom(t, w, evil)
	balanced(t, w, len(first)+len(more), 30, 30, "m-a")
}

// Another role fills the server's lock table but for one slot, which a
// fenced member's next key takes: the installation of that key's term then
// finds no slot for its transaction's id (SQLSTATE 53200). The member
// keeps its session and every key it leads (a session ended there would
// let go of them all, and of a key whose OnElected still drains after a
// hand-over while it runs), says so, and installs the term once the table
// has room.
func TestGroupTermsMeetAFullLockTable(t *testing.T) {
	srv := testpg.Start(t, testpg.Options{Settings: []string{"max_locks_per_transaction=10", "max_connections=20", "autovacuum=off"}})
	r := testpg.NewRoles(t, srv)
	w := newGroupWatch(t)
	first := groupKeys(t.Name(), 4)
	m := runMember(t, group.Config{
		Connect: leader.DSN(srv.DSN()), Group: t.Name(), Keys: first[:3], Identity: "m-a",
		Fencing: group.Fencing{Enabled: true}, Callbacks: w.callbacks("m-a"),
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
		Logger: testLogger(t, nil),
	})
	balanced(t, w, 3, 3, 3, "m-a")
	evil := r.EvilConn(t)
	held := testpg.FillLockTable(t, evil)
	// One slot back, for the fourth key's lock.
	if _, err := evil.Exec(context.Background(), "SELECT pg_advisory_unlock($1::int8)", int64(1<<40)); err != nil {
		t.Fatal(err)
	}
	t.Logf("another role holds %d advisory locks", held-1)
	if err := m.g.SetKeys(first); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the member reports a full lock table at the terms", func() (bool, string) {
		st := m.g.Status()
		return st.LockTableFull > 0 && strings.Contains(st.LastError, "install terms"), st.LastError
	})
	waitFullRounds(t, 10, m)
	noneDemotedThenRoom(t, w, evil)
	balanced(t, w, 4, 4, 4, "m-a")
}

// noneDemotedThenRoom fails the test for any key w saw demoted while the
// lock table was full, then has evil (the filler) let go of its locks.
func noneDemotedThenRoom(t *testing.T, w *groupWatch, evil *pgx.Conn) {
	t.Helper()
	w.mu.Lock()
	for k, n := range w.demoted {
		if n > 0 {
			t.Errorf("key %s demoted while the table was full", k)
		}
	}
	w.mu.Unlock()
	if _, err := evil.Exec(context.Background(), "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
}

// A member whose role may not create temporary objects (TEMP revoked, as
// a locked-down database may have it) cannot run the crash watch's session
// function: the watch turns itself off for the process with one warning,
// rather than retrying for ever with an ERROR in the server's log every
// second, and the member leads its keys all the same.
func TestGroupCrashWatchWithoutTemp(t *testing.T) {
	srv := testpg.Start(t)
	if err := srv.Exec(context.Background(), "REVOKE TEMPORARY ON DATABASE postgres FROM PUBLIC"); err != nil {
		t.Fatal(err)
	}
	r := testpg.NewRoles(t, srv)
	core, logs := observer.New(zap.WarnLevel)
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 4)
	m := runMember(t, group.Config{Connect: leader.DSN(r.AppDSN), Group: t.Name(), Keys: keys, Identity: "notemp",
		Callbacks: w.callbacks("notemp"), Logger: zap.New(core),
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond})
	balanced(t, w, len(keys), 4, 4, "notemp")
	// The watch retries no faster than a renew interval: 20 intervals
	// would show about 40 log lines.
	waitFullRounds(t, 20, m)
	errs := 0
	for _, l := range serverLog(srv) {
		if strings.Contains(l, "] notemp: ERROR:") {
			errs++
		}
	}
	if errs > 1 {
		t.Fatalf("%d errors from the member in the server's log:\n%s", errs, strings.Join(serverLog(srv), "\n"))
	}
	if n := logs.FilterMessageSnippet("crash watch off").Len(); n != 1 {
		t.Fatalf("%d warnings that the crash watch is off, want 1 (all: %v)", n, logs.All())
	}
}

// groupChannels are a group's channel and a member's own channel, as any
// role can compute them from the group's name.
func groupChannels(group, member string) (string, string) {
	_, roster := inspect.GroupRoster(group)
	h := fnv.New32a()
	fmt.Fprintf(h, "member|%s|%s", group, member)
	ch := fmt.Sprintf("pgleader.group.%d", roster)
	return ch, fmt.Sprintf("%s.%d", ch, h.Sum32())
}

func electionsOf(w *groupWatch) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.elected {
		n += e
	}
	return n
}

// waitFullRounds waits until every member has run n more full rounds.
func waitFullRounds(t *testing.T, n int64, ms ...*member) {
	t.Helper()
	for _, m := range ms {
		st := m.g.Status()
		eventually(t, st.Identity+" runs its rounds", func() (bool, string) {
			return m.g.Status().Rounds >= st.Rounds+n, ""
		})
	}
}
