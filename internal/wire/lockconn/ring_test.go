package lockconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// The crash watch cancels a wait only once it has surely reached the
// backend, and never one about to end by itself (a request then could
// arrive as the statement ends, outside the function: an ERROR in the
// server's log).
func TestRingCancelPlan(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		age, wait, delay time.Duration
		send             bool
	}{
		{0, 800 * ms, 50 * ms, true},       // just sent: wait until it reached the backend
		{10 * ms, 800 * ms, 40 * ms, true}, // likewise
		{50 * ms, 800 * ms, 0, true},       // old enough
		{600 * ms, 800 * ms, 0, true},      // 200 ms left: more than an eighth
		{700 * ms, 800 * ms, 0, true},      // exactly an eighth left
		{701 * ms, 800 * ms, 0, false},     // less than an eighth left
		{0, 80 * ms, 50 * ms, false},       // too short to cancel at all: 30 ms left then
		{5 * time.Second, 6 * time.Second, 0, true},
		{5300 * ms, 6 * time.Second, 0, false}, // 700 ms left, under an eighth (750)
		{0, 100 * ms, 50 * ms, true},           // 50 ms left after the delay: the margin
	} {
		delay, send := lockconn.CancelPlan(c.age, c.wait)
		if send != c.send || (send && delay != c.delay) {
			t.Errorf("age %s of a %s wait: delay %s send %v, want delay %s send %v", c.age, c.wait, delay, send, c.delay, c.send)
		}
	}
}

func newRing(t *testing.T, id string, wait time.Duration) (*lockconn.Ring, *pgx.Conn) {
	t.Helper()
	conn, sess := session(t, id, time.Second)
	ring, err := lockconn.NewRing(context.Background(), conn, sess, t.Name(), wait)
	if err != nil {
		t.Fatal(err)
	}
	return ring, conn
}

// advisoryHeld counts the advisory locks a backend holds or waits for,
// read on obs.
func advisoryHeld(t *testing.T, obs *pgx.Conn, pid uint32) int {
	t.Helper()
	var n int
	if err := obs.QueryRow(context.Background(), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", int32(pid)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A cancel request that fails the wait's statement outside the session
// function (the server logged it) leaves the watch's session fit and
// holding nothing: a shared lock the wait was granted just before would
// otherwise outlive the error, and keep the watched member's next session
// from its member lock. Any other error is the caller's.
func TestRingCancelledOutsideReleasesLocks(t *testing.T) {
	ctx := context.Background()
	ring, conn := newRing(t, "ring-outside", time.Second)
	pid, obs := conn.PgConn().PID(), shared.Conn(t)
	other := server(t)
	oc, err := other.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(ctx)
	// The lock the handler was about to release, then a real query_canceled
	// from the server on a statement of the session's own.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared($1::int4, $2::int4)", lockconn.Space, lockconn.MemberLock(t.Name(), "m")); err != nil {
		t.Fatal(err)
	}
	slept := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "SELECT pg_sleep(30)")
		slept <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var cancelled bool
		if err := oc.QueryRow(ctx, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'", int32(pid)).Scan(&cancelled); err == nil && cancelled {
			break
		} else if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the session never reached its sleep")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var cancelErr error
	select {
	case cancelErr = <-slept:
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled sleep did not return")
	}
	var pgErr *pgconn.PgError
	if !errors.As(cancelErr, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("the cancelled statement: %v", cancelErr)
	}
	if n := advisoryHeld(t, obs, pid); n != 1 {
		t.Fatalf("before: %d advisory locks, want the shared one", n)
	}
	gone, err := ring.CancelledOutside(ctx, cancelErr)
	if err != nil || gone == nil || *gone {
		t.Fatalf("a cancel outside the function: gone %v, err %v; want not gone, no error", gone, err)
	}
	if n := advisoryHeld(t, obs, pid); n != 0 {
		t.Fatalf("after: the watch's session still holds %d advisory locks", n)
	}
	other2 := errors.New("some other failure")
	if gone, err := ring.CancelledOutside(ctx, other2); gone != nil || !errors.Is(err, other2) {
		t.Fatalf("another error: gone %v, err %v; want it returned", gone, err)
	}
}

// Cancel requests that land at any moment of a wait (before its statement,
// as it begins, inside the function, as it ends) never fail Wait and
// never leave the session holding a lock. The waits here are on a free
// member lock (granted at once, so most of each statement runs outside the
// function's wait), under a stream of requests.
func TestRingWaitSurvivesCancelsAtAnyMoment(t *testing.T) {
	ctx := context.Background()
	ring, conn := newRing(t, "ring-any", 30*time.Millisecond)
	pid, obs := conn.PgConn().PID(), shared.Conn(t)
	stop := make(chan struct{})
	spammed := make(chan int)
	go func() {
		n := 0
		defer func() { spammed <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = conn.PgConn().CancelRequest(cctx)
			cancel()
			n++
		}
	}()
	end := time.Now().Add(3 * time.Second)
	waits := 0
	for ; time.Now().Before(end); waits++ {
		gone, err := ring.Wait(ctx, "m", 5*time.Second)
		if err != nil || gone == nil {
			close(stop)
			<-spammed
			t.Fatalf("wait %d under cancel requests: gone %v, err %v", waits, gone, err)
		}
		if waits%20 == 0 {
			if n := advisoryHeld(t, obs, pid); n != 0 {
				close(stop)
				<-spammed
				t.Fatalf("wait %d: the session holds %d advisory locks after it", waits, n)
			}
		}
	}
	close(stop)
	t.Logf("%d waits under %d cancel requests", waits, <-spammed)
	if n := advisoryHeld(t, obs, pid); n != 0 {
		t.Fatalf("the session holds %d advisory locks after the waits", n)
	}
	// A held member lock is still waited on, and its end still seen.
	holder, err := server(t).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", lockconn.Space, lockconn.MemberLock(t.Name(), "m")); err != nil {
		t.Fatal(err)
	}
	if gone, err := ring.Wait(ctx, "m", 5*time.Second); err != nil || gone == nil || *gone {
		t.Fatalf("a held member lock: gone %v, err %v", gone, err)
	}
	holder.Close(ctx)
	if gone, err := ring.Wait(ctx, "m", 5*time.Second); err != nil || gone == nil || !*gone {
		t.Fatalf("after the member's end: gone %v, err %v", gone, err)
	}
}

// Two Cancel calls on one wait (the members changed and the member stops
// at once) send one request: a second one could reach the statement as
// the first one's ends it, outside the function.
func TestRingCancelsOncePerWait(t *testing.T) {
	ctx := context.Background()
	ring, conn := longRing(t, "ring-once")
	pid, obs := conn.PgConn().PID(), shared.Conn(t)
	holdMember(t, "m")
	for i := range 5 {
		sent := make(chan bool, 2)
		waited := make(chan error, 1)
		go func() {
			gone, err := ring.Wait(ctx, "m", 5*time.Second)
			if err == nil && (gone == nil || *gone) {
				err = errors.New("the member is not gone")
			}
			waited <- err
		}()
		waitingOn(t, obs, memberKey(t, "m"), pid) // both calls come while the wait is in progress
		for range 2 {
			go func() { sent <- ring.Cancel() }()
		}
		n := 0
		for range 2 {
			if <-sent {
				n++
			}
		}
		select {
		case err := <-waited:
			if err != nil {
				t.Fatalf("wait %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("wait %d: not ended by the cancel request", i)
		}
		if n != 1 {
			t.Fatalf("wait %d: %d cancel requests sent, want one", i, n)
		}
	}
}

// longRing is a crash watch's session whose waits last 5 s:
// deadlock_timeout is 10 s there, so a loaded machine never brings a wait
// near its end before a test's calls.
func longRing(t *testing.T, id string) (*lockconn.Ring, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	conn, err := leader.DSN(server(t).DSN() + "&options=-c%20deadlock_timeout%3D10s").Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lockconn.Close(conn) })
	sess, err := lockconn.Setup(ctx, conn, lockconn.Settings{Identity: id, LockTimeout: time.Second, Lease: 10 * time.Second, KeepIdle: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ring, err := lockconn.NewRing(ctx, conn, sess, t.Name(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return ring, conn
}

// holdMember holds the member lock of member (group t.Name()) on a
// session of its own, until the test ends or the returned function.
func holdMember(t *testing.T, member string) (release func()) {
	t.Helper()
	ctx := context.Background()
	holder, err := server(t).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(ctx) })
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", lockconn.Space, lockconn.MemberLock(t.Name(), member)); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", lockconn.Space, lockconn.MemberLock(t.Name(), member)); err != nil {
			t.Error(err)
		}
	}
}

// memberKey is the member lock of member in the group t.Name(), as a key.
func memberKey(t *testing.T, member string) leader.Key {
	return leader.PairKey(lockconn.Space, lockconn.MemberLock(t.Name(), member))
}

// A Cancel that sleeps until its wait is old enough, and finds that wait
// over and the next one in progress, sends nothing: the next wait (on the
// new target) is not the one it was asked to end.
func TestRingDelayedCancelSparesTheNextWait(t *testing.T) {
	// Cancel sleeps until a wait is 2 s old: the test's release of the
	// first member, right after it saw the wait queued, comes before that
	// even on a loaded machine (a shorter age let a slow look at pg_locks
	// race the request to the first wait).
	defer lockconn.SetRingCancelAge(lockconn.SetRingCancelAge(2 * time.Second))
	ctx := context.Background()
	ring, conn := longRing(t, "ring-next")
	pid, obs := conn.PgConn().PID(), shared.Conn(t)
	release := holdMember(t, "first")
	holdMember(t, "next")
	type result struct {
		gone *bool
		err  error
	}
	first, next := make(chan result, 1), make(chan result, 1)
	go func() {
		gone, err := ring.Wait(ctx, "first", 5*time.Second)
		first <- result{gone, err}
		gone, err = ring.Wait(ctx, "next", 5*time.Second)
		next <- result{gone, err}
	}()
	waitingOn(t, obs, memberKey(t, "first"), pid)
	sent := make(chan bool, 1)
	go func() { sent <- ring.Cancel() }() // sleeps until the first wait is 2 s old
	release()                             // the first wait ends: its member is gone
	if r := <-first; r.err != nil || r.gone == nil || !*r.gone {
		t.Fatalf("the first wait: gone %v, err %v", r.gone, r.err)
	}
	select {
	case s := <-sent:
		if s {
			t.Fatal("the delayed Cancel sent a request to the next wait")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Cancel did not return")
	}
	// The next wait runs on; a Cancel made for it ends it.
	waitingOn(t, obs, memberKey(t, "next"), pid)
	if !ring.Cancel() {
		t.Fatal("a Cancel of the wait in progress sent nothing")
	}
	select {
	case r := <-next:
		if r.err != nil || r.gone == nil || *r.gone {
			t.Fatalf("the next wait: gone %v, err %v", r.gone, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next wait was not ended by its own Cancel")
	}
}
