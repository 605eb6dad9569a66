package lockconn_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// A cancel request can reach an heir's backend at any point of its round:
// a new leader's wake (pgleader_wake) is sent to the heirs it saw waiting,
// and lands wherever each one is by then. One that lands inside a probe,
// between the shared lock the probe takes and its release, must not leave
// that shared lock held: the catch keeps session locks, and a shared lock
// on the key, which no elector ever holds, would block every other
// candidate's exclusive wait (and, through the waiters it queues, every
// probe) until the session ended: nobody would lead. One left on the gate
// would refuse every later reservation. The key's probe here sleeps while
// it holds the shared lock, so that the cancel lands there. The gate's
// probe after a win is two built-in calls in a row (see pgleader_wait),
// with no point a test can hold a cancel at; the same handler catches a
// cancel there, so the gate's case holds a shared lock on the gate when
// the cancel lands in the key's probe: the handler must release that too.
func TestCancelInsideAProbeLeavesNoLock(t *testing.T) {
	for i, on := range []string{"key", "gate"} {
		t.Run(on, func(t *testing.T) {
			ctx := context.Background()
			key := leader.PairKey(7301, int32(19+i))
			ls, target := quietSession(t, "cancelled-heir", key, lockconn.Quiet{Wait: 30 * time.Second, Poll: time.Minute, Heirs: 2})
			a, b := int64(7301), int64(19+i) // the lock that must hold no shared lock after, as pg_locks shows it
			if on == "gate" {
				a, b = int64(lockconn.Space), int64(uint32(target.Gate()))
				if _, err := ls.Conn().Exec(ctx, "SELECT pg_advisory_lock_shared($1::int4, $2::int4)", int32(lockconn.Space), target.Gate()); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := ls.Conn().Exec(ctx, `ALTER FUNCTION pg_temp.pgleader_lock(oid, oid, int2, text) RENAME TO pgleader_lock_real`); err != nil {
				t.Fatal(err)
			}
			if _, err := ls.Conn().Exec(ctx, fmt.Sprintf(`CREATE FUNCTION pg_temp.pgleader_lock(c oid, o oid, s int2, how text) RETURNS bool
LANGUAGE plpgsql AS $f$
DECLARE
  got bool;
BEGIN
  IF how = 'probe' AND c = %d AND o = %d AND s = 2 THEN
    got := pg_temp.pgleader_lock_real(c, o, s, 'try_shared');
    PERFORM pg_sleep(60);
    IF got THEN
      PERFORM pg_temp.pgleader_lock_real(c, o, s, 'unlock_shared');
    END IF;
    RETURN got;
  END IF;
  RETURN pg_temp.pgleader_lock_real(c, o, s, how);
END $f$`, 7301, 19+i)); err != nil {
				t.Fatal(err)
			}
			if err := ls.TakeSlot(target, 0); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				r, err := ls.Campaign(ctx, target, false)
				if err == nil && (r.Held || !r.Busy) {
					t.Errorf("a cancelled round: %+v, want busy", r)
				}
				done <- err
			}()
			admin, err := server(t).Connect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			deadline := time.Now().Add(30 * time.Second)
			for {
				var sleeping bool
				if err := admin.QueryRow(ctx, `SELECT coalesce(wait_event = 'PgSleep', false) FROM pg_stat_activity WHERE pid = $1`, int32(ls.PID())).Scan(&sleeping); err != nil {
					t.Fatal(err)
				}
				if sleeping {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the heir's round never reached its probe")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", int32(ls.PID())); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("a cancelled round: %v, want a busy round", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the cancelled round did not return")
			}
			var shared int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND mode = 'ShareLock'
  AND classid = $2 AND objid = $3 AND objsubid = 2`, int32(ls.PID()), a, b).Scan(&shared); err != nil {
				t.Fatal(err)
			}
			var took bool
			if err := admin.QueryRow(ctx, "SELECT pg_try_advisory_lock(($1::int8 - ($1::int8 >> 31) * 4294967296)::int4, ($2::int8 - ($2::int8 >> 31) * 4294967296)::int4)", a, b).Scan(&took); err != nil {
				t.Fatal(err)
			}
			if shared != 0 || !took {
				t.Fatalf("after a cancel inside the %s's probe the heir's session holds %d shared locks on it, and another session could take it: %v", on, shared, took)
			}
			// Caught and released without a line in the server's log (a
			// release of a lock not held in share mode would log a
			// WARNING).
			if n := server(t).LogLinesOf("cancelled-heir"); n != 0 {
				t.Fatalf("%d server log lines from the heir's session:\n%s", n, server(t).LogTail(20))
			}
		})
	}
}

// signalAtRandom runs round n times, each with one cancel (send) sent to
// backend pid at a random instant once the backend waits for a lock (obs
// sees it queued in pg_locks; a round that ends first gets none): the
// cancels land inside the wait, as it ends, in its handlers, and after
// the statement. None lands sooner: one that reaches the backend as the
// statement enters the procedure, before any handler, is an ERROR no
// routine can catch, and pgleader sends none to a wait younger than
// ringCancelAge (see cancelPlan), nor wakes a backend it did not see
// waiting. It returns how many rounds failed with query_canceled (a
// cancel that landed outside the session routine's handlers, which the
// server logs as an ERROR) and the first other error. Tests run several
// at once: the load makes the server's two signals of one request (see
// sql/quiet.sql) arrive apart, as on a busy machine.
func signalAtRandom(obs *pgx.Conn, pid uint32, n int, spread time.Duration, round func() error, send func()) (outside int, err error) {
	for range n {
		roundDone, sent := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(sent)
			for {
				var waiting bool
				if err := obs.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE pid = $1 AND NOT granted)", int32(pid)).Scan(&waiting); err == nil && waiting {
					break
				}
				select {
				case <-roundDone:
					return
				case <-time.After(200 * time.Microsecond):
				}
			}
			time.Sleep(rand.N(spread))
			send()
		}()
		rerr := round()
		close(roundDone)
		<-sent
		switch {
		case lockconn.IsCancelled(rerr):
			outside++
		case rerr != nil:
			return outside, rerr
		}
		// Let a request that arrived after the statement reach the idle
		// backend, which ignores it, before the next round begins.
		time.Sleep(time.Millisecond)
	}
	return outside, nil
}

// anyInstantSessions and anyInstantRounds: three sessions at once, 400
// rounds each; each round's wait is anyInstantWait.
const (
	anyInstantSessions, anyInstantRounds = 3, 400
	anyInstantWait                       = 8 * time.Millisecond
)

// A cancel request reaches an heir's backend wherever its round is when it
// arrives: the client stopping, or a new leader's wake that saw the heir
// waiting (its wait may end just then). Wherever it lands once the
// statement is in the procedure, the round catches it: never an ERROR in
// the server's log (the quiet design promises a fleet's start and stop
// without one) and never a failed round. A wait called as a function by
// SELECT fails this (the executor checks for a cancel once more after the
// function returned, outside its handler), as does a handler a second
// signal of the same request can land in unprotected.
func TestCancelAtAnyInstantIsCaught(t *testing.T) {
	heirsCancelledAtRandom(t, "anyinstant", func(heir *lockconn.Lease) func() {
		return func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = heir.Conn().PgConn().CancelRequest(cctx)
		}
	})
}

// The server signals a backend twice for one cancel request (the process,
// then its process group), and a loaded machine delivers the second on its
// own, often just as the first one's handler begins; a new leader's wake
// (pg_cancel_backend, one signal) can also meet a stopping client's
// request. Here two signals come at random instants a little apart, each
// from pg_cancel_backend: the second lands in the handlers, which a block
// of their own protects. Without it, rounds fail.
func TestSecondSignalIsCaught(t *testing.T) {
	heirsCancelledAtRandom(t, "secondsignal", func(heir *lockconn.Lease) func() {
		return twoCancels(t, heir.PID())
	})
}

// twoCancels returns a sender of two pg_cancel_backend calls to backend
// pid, up to 300 µs apart, from a session of its own.
func twoCancels(t *testing.T, pid uint32) func() {
	admin, err := server(t).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return func() {
		for i := range 2 {
			if i == 1 {
				time.Sleep(rand.N(300 * time.Microsecond))
			}
			_, _ = admin.Exec(context.Background(), "SELECT pg_cancel_backend($1)", int32(pid))
		}
	}
}

// heirsCancelledAtRandom runs anyInstantSessions heirs' rounds on held
// keys, each round with a cancel sendTo(heir) sends at a random instant
// (see signalAtRandom), and requires every round answered busy (0) or
// cancelled (7), and no line in the server's log.
func heirsCancelledAtRandom(t *testing.T, app string, sendTo func(heir *lockconn.Lease) func()) {
	ctx := context.Background()
	type result struct {
		outside, busy, cancelled, other int
		err                             error
	}
	results := make(chan result, anyInstantSessions)
	for i := range anyInstantSessions {
		key := leader.KeyFromName(fmt.Sprint(t.Name(), i))
		q := lockconn.Quiet{Wait: anyInstantWait, Poll: time.Minute, Heirs: 2, Lease: 60 * time.Second}
		ldr, lt := quietSession(t, app+"-leader", key, q)
		heir, target := quietSession(t, app+"-heir", key, q)
		obs, err := server(t).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { obs.Close(context.Background()) })
		if r, err := ldr.Campaign(ctx, lt, false); err != nil || !r.Held {
			t.Fatalf("the first poll on a free lock: %+v %v", r, err)
		}
		if r, err := heir.Campaign(ctx, target, false); err != nil || r.Held || !heir.Heir(target) {
			t.Fatalf("the second poll: %+v %v, heir %v", r, err, heir.Heir(target))
		}
		send := sendTo(heir)
		go func() {
			var res result
			res.outside, res.err = signalAtRandom(obs, heir.PID(), anyInstantRounds, anyInstantWait, func() error {
				code, _, err := heir.WaitRound(ctx, target)
				switch {
				case err != nil:
				case code == 0:
					res.busy++
				case code == 7:
					res.cancelled++
				default:
					res.other++
				}
				return err
			}, send)
			results <- res
		}()
	}
	var outside, busy, cancelled int
	for range anyInstantSessions {
		r := <-results
		if r.err != nil {
			t.Error(r.err)
		}
		if r.other != 0 {
			t.Errorf("%d rounds on a held key answered neither busy (0) nor cancelled (7)", r.other)
		}
		outside, busy, cancelled = outside+r.outside, busy+r.busy, cancelled+r.cancelled
	}
	t.Logf("rounds: %d busy, %d cancelled inside, %d failed", busy, cancelled, outside)
	if outside != 0 {
		t.Errorf("%d of %d heir's rounds failed with query_canceled: a cancel landed outside the wait's handlers", outside, anyInstantSessions*anyInstantRounds)
	}
	if n := server(t).LogLinesOf(app + "-heir"); n != 0 {
		t.Fatalf("%d server log lines from the heirs' sessions:\n%s", n, server(t).LogTail(20))
	}
}

// The same for the group's crash watch: a member stopping, or its
// successor changing, cancels the watch's wait wherever it is. (Ring.Wait
// turns a cancel that failed the statement into "not gone", so the
// server's log is what tells.)
func TestRingCancelAtAnyInstantIsCaught(t *testing.T) {
	ringsCancelledAtRandom(t, "anyinstant-ring", func(conn *pgx.Conn) func() {
		return func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = conn.PgConn().CancelRequest(cctx)
		}
	})
}

// The second of one cancel request's two signals, or a second request
// close behind the first (a stop beside a retarget), lands in the watch's
// handler of the first: the outer handler catches it, so the server logs
// nothing. Two pg_cancel_backend calls up to 300 µs apart make that
// instant common (a cancel request's own two signals come apart less
// often).
func TestRingSecondSignalIsCaught(t *testing.T) {
	ringsCancelledAtRandom(t, "secondsignal-ring", func(conn *pgx.Conn) func() {
		return twoCancels(t, conn.PgConn().PID())
	})
}

// ringsCancelledAtRandom runs anyInstantSessions crash watches' waits on
// a member lock held for the whole test, each wait with a cancel
// sendTo(conn) sends at a random instant (see signalAtRandom), and
// requires every wait to report the member alive and no line in the
// server's log from the watches' sessions (application name app).
func ringsCancelledAtRandom(t *testing.T, app string, sendTo func(conn *pgx.Conn) func()) {
	ctx := context.Background()
	holder, err := server(t).Connect(ctx) // no lease: it holds the member lock, idle, for the whole test
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", lockconn.Space, lockconn.MemberLock(t.Name(), "m1")); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, anyInstantSessions)
	for range anyInstantSessions {
		ring, conn := newRing(t, app, anyInstantWait)
		obs, err := server(t).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { obs.Close(context.Background()) })
		send := sendTo(conn)
		go func() {
			var reported error
			_, err := signalAtRandom(obs, conn.PgConn().PID(), anyInstantRounds, anyInstantWait, func() error {
				gone, err := ring.Wait(ctx, "m1", time.Second)
				if err == nil && (gone == nil || *gone) && reported == nil {
					reported = fmt.Errorf("a watch on a held member lock reports it gone (%v)", gone != nil)
				}
				return err
			}, send)
			errs <- errors.Join(err, reported)
		}()
	}
	for range anyInstantSessions {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := server(t).LogLinesOf(app); n != 0 {
		t.Fatalf("%d server log lines from the watches' sessions:\n%s", n, server(t).LogTail(20))
	}
}
