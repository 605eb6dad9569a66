package lockconn_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
// would refuse every later reservation. The probe here sleeps while it
// holds the shared lock, so that the cancel lands there: on the key (the
// round's first probe) and on the gate (the probe after a win).
func TestCancelInsideAProbeLeavesNoLock(t *testing.T) {
	for i, on := range []string{"key", "gate"} {
		t.Run(on, func(t *testing.T) {
			ctx := context.Background()
			key := leader.PairKey(7301, int32(19+i))
			ls, target := quietSession(t, "cancelled-heir", key, lockconn.Quiet{Wait: 30 * time.Second, Poll: time.Minute, Heirs: 2})
			a, b := int64(7301), int64(19+i) // the lock whose probe sleeps, as pg_locks shows it
			if on == "gate" {
				// The key is free: the heir's round wins it, then probes
				// the gate (is the key reserved for another candidate?).
				a, b = int64(lockconn.Space), int64(uint32(target.Gate()))
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
END $f$`, a, b)); err != nil {
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
